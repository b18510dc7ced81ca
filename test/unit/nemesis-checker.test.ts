import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  type CheckOptions,
  check,
  type FinalNodeRead,
  type FinalRead,
} from "../../src/dev/nemesis/checker.ts";
import type { Op, OpInput } from "../../src/dev/nemesis/history.ts";

const OPTIONS: CheckOptions = { fenceWindowMs: 3000, causeWindowMs: 10_000 };

/** A tiny history builder: ops in the order given, at the times given. */
function build(inputs: Array<OpInput & { t: number }>): Op[] {
  return inputs.map((input, index) => ({ index, ...input }));
}

function write(t: number, seq: number, outcome: "ok" | "fail" | "info", replicas = 1, node = "n1") {
  return [
    { t, process: "writer", type: "invoke", f: "write", value: { seq }, node },
    {
      t: t + 1,
      process: "writer",
      type: outcome,
      f: "write",
      value: outcome === "ok" ? { seq, replicas } : { seq, error: "x" },
      node,
    },
  ] as Array<OpInput & { t: number }>;
}

function probe(t: number, writable: string[]): OpInput & { t: number } {
  return { t, process: "sampler", type: "ok", f: "probe", value: { writable, refused: [], unreachable: [] } };
}

function fault(t: number, f: "inject" | "heal", id: number, kind = "kill-redis"): OpInput & { t: number } {
  return { t, process: "nemesis", type: "info", f, value: { id, kind, target: "primary", nodes: ["n1"] } };
}

function epoch(t: number, from: number, to: number, primary: string): OpInput & { t: number } {
  return {
    t,
    process: "observer",
    type: "info",
    f: "epoch",
    value: { epoch: to, primary, status: "online", previousEpoch: from, previousPrimary: "n1" },
  };
}

/** An epoch op whose topology read had \`forMs\` of cool-down still to run. */
function epochWithCooldown(t: number, from: number, to: number, primary: string, forMs: number) {
  const op = epoch(t, from, to, primary);
  return { ...op, value: { ...(op.value as Record<string, unknown>), cooldownForMs: forMs } };
}

function healthy(primary: string, seqs: number[], replicas = ["n2", "n3"]): FinalRead {
  const nodes: FinalNodeRead[] = [
    { node: primary, reachable: true, role: "master", seqs },
    ...replicas.map((node) => ({
      node,
      reachable: true,
      role: "slave" as const,
      following: primary,
      linkUp: true,
      seqs,
    })),
  ];
  return { nodes, topologyPrimary: primary, topologyStatus: "online" };
}

/** The topology's primary n1 did not answer its final read; n2 and n3 follow it, holding these keys. */
function unreadPrimary(n2: number[], n3: number[]): FinalRead {
  return {
    nodes: [
      { node: "n1", reachable: false, error: "Command timed out" },
      { node: "n2", reachable: true, role: "slave", following: "n1", linkUp: true, seqs: n2 },
      { node: "n3", reachable: true, role: "slave", following: "n1", linkUp: false, seqs: n3 },
    ],
    topologyPrimary: "n1",
    topologyStatus: "online",
  };
}

describe("nemesis checker", () => {
  it("fails a history with one lost write and one two-writable window, naming both", () => {
    // Prepare: seq 2 acknowledged by a replica and missing; two writable nodes 10 s after the last window.
    const history = build([...write(100, 1, "ok"), ...write(200, 2, "ok"), probe(20_000, ["n1", "n2"])]);

    // Act
    const result = check(history, healthy("n1", [1]), OPTIONS);

    // Assess
    expect(result.valid).toBe(false);
    expect(result.lost).toEqual([2]);
    expect(result.twoWritable).toEqual([{ t: 20_000, nodes: ["n1", "n2"] }]);
    expect(result.violations.some((v) => v.startsWith("(a)") && v.includes("seq 2"))).toBe(true);
    expect(result.violations.some((v) => v.startsWith("(b)") && v.includes("n1, n2"))).toBe(true);
  });

  it("passes a clean history", () => {
    const history = build([...write(0, 1, "ok"), ...write(10, 2, "ok"), probe(20, ["n1"])]);
    const result = check(history, healthy("n1", [1, 2]), OPTIONS);
    expect(result).toMatchObject({ valid: true, lost: [], violations: [] });
    expect(result.stats).toMatchObject({ attempted: 2, acked: 2, ackedByReplica: 2, samples: 1 });
  });

  it("is unknown, never a pass, without a final read", () => {
    const history = build([...write(0, 1, "ok")]);
    const result = check(history, undefined, OPTIONS);
    expect(result.valid).toBe("unknown");
    expect(result.violations.join(" ")).toContain("no final read");
  });

  it("stays false without a final read when a sampled rule failed", () => {
    const history = build([probe(50_000, ["n1", "n2"])]);
    expect(check(history, undefined, OPTIONS).valid).toBe(false);
  });

  describe("rule by rule", () => {
    const table: Array<{
      rule: string;
      history: Op[];
      final: FinalRead;
      valid: boolean | "unknown";
      expect: string | null;
    }> = [
      {
        rule: "(a) a replica-acknowledged write missing is lost",
        history: build(write(0, 7, "ok", 2)),
        final: healthy("n1", []),
        valid: false,
        expect: "(a) 1 replica-acknowledged",
      },
      {
        rule: "(b) two writable nodes inside the fence window after an epoch change are tolerated",
        history: build([
          fault(0, "inject", 1),
          epoch(5000, 1, 2, "n2"),
          probe(6000, ["n1", "n2"]),
          fault(7000, "heal", 1),
        ]),
        final: healthy("n2", [], ["n1", "n3"]),
        valid: true,
        expect: null,
      },
      {
        rule: "(b) two writable nodes after the fence window are a violation",
        history: build([
          fault(0, "inject", 1),
          epoch(5000, 1, 2, "n2"),
          probe(8001, ["n1", "n2"]),
          fault(20_000, "heal", 1),
        ]),
        final: healthy("n2", [], ["n1", "n3"]),
        valid: false,
        expect: "(b) two writable nodes",
      },
      {
        rule: "(b) a heal opens no window: a woken node that takes writes beside the primary is a violation",
        history: build([
          fault(0, "inject", 1, "pause-redis"),
          fault(9000, "heal", 1, "pause-redis"),
          probe(10_000, ["n1", "n2"]),
        ]),
        final: healthy("n1", []),
        valid: false,
        expect: "(b) two writable nodes: 1 samples",
      },
      {
        rule: "(b) a status-only topology change opens no window",
        history: build([
          fault(0, "inject", 1),
          {
            t: 4000,
            process: "observer",
            type: "info",
            f: "epoch",
            value: { epoch: 1, primary: "n1", status: "offline", previousEpoch: 1, previousPrimary: "n1" },
          },
          probe(5000, ["n1", "n2"]),
          fault(6000, "heal", 1),
        ]),
        final: healthy("n1", []),
        valid: false,
        expect: "(b) two writable nodes",
      },
      {
        rule: "(a) a deposed primary's replica-acknowledged write (the stray writer's) missing is lost",
        history: build([
          ...write(0, 1, "ok", 1, "n1"),
          {
            t: 100,
            process: "writer",
            type: "invoke",
            f: "write",
            value: { seq: 2 },
            node: "n2",
          },
          {
            t: 101,
            process: "writer",
            type: "ok",
            f: "write",
            value: { seq: 2, replicas: 1, stray: true },
            node: "n2",
          },
        ]),
        final: healthy("n1", [1]),
        valid: false,
        expect: "(a) 1 replica-acknowledged writes missing from the final primary n1: seq 2",
      },
      {
        rule: "(c) a write acknowledged by the primary alone and missing is reported, not a violation",
        history: build(write(0, 3, "ok", 0)),
        final: healthy("n1", []),
        valid: true,
        expect: null,
      },
      {
        rule: "(d) two primaries at the end",
        history: build([]),
        final: {
          nodes: [
            { node: "n1", reachable: true, role: "master", seqs: [] },
            { node: "n2", reachable: true, role: "master", seqs: [] },
          ],
          topologyPrimary: "n1",
        },
        valid: false,
        expect: "(d) the shard ends with 2 primaries",
      },
      {
        rule: "(d) a live replica not following the primary",
        history: build([]),
        final: {
          nodes: [
            { node: "n1", reachable: true, role: "master", seqs: [] },
            { node: "n2", reachable: true, role: "slave", following: "n3", linkUp: false, seqs: [] },
            { node: "n3", reachable: false },
          ],
          topologyPrimary: "n1",
        },
        valid: false,
        expect: "(d) live nodes not following",
      },
      {
        rule: "(d) a node that is down does not count",
        history: build([]),
        final: {
          nodes: [
            { node: "n1", reachable: true, role: "master", seqs: [] },
            { node: "n2", reachable: true, role: "slave", following: "n1", linkUp: true, seqs: [] },
            { node: "n3", reachable: false },
          ],
          topologyPrimary: "n1",
        },
        valid: true,
        expect: null,
      },
      {
        rule: "(d) no primary at all leaves the data rules unknown and the run failed",
        history: build(write(0, 1, "ok")),
        final: {
          nodes: [{ node: "n1", reachable: true, role: "slave", following: "n2", linkUp: false, seqs: [] }],
        },
        valid: false,
        expect: "(d) the shard ends with 0 primaries",
      },
      {
        rule: "(d) the topology's primary read as a replica is still 0 primaries, a failure (not 'could not be read')",
        history: build(write(0, 1, "ok")),
        final: {
          nodes: [
            { node: "n1", reachable: true, role: "slave", following: "n2", linkUp: false, seqs: [1] },
            { node: "n2", reachable: true, role: "slave", following: "n1", linkUp: false, seqs: [1] },
            { node: "n3", reachable: false, error: "Command timed out" },
          ],
          topologyPrimary: "n1",
        },
        valid: false,
        expect: "(d) the shard ends with 0 primaries",
      },
      {
        rule: "(d) the topology's primary down for good (no read error) with no master is 0 primaries, a failure",
        history: build([]),
        final: {
          nodes: [
            { node: "n1", reachable: false },
            { node: "n2", reachable: true, role: "slave", following: "n1", linkUp: false, seqs: [] },
          ],
          topologyPrimary: "n1",
        },
        valid: false,
        expect: "(d) the shard ends with 0 primaries",
      },
      {
        rule: "(d) the topology's primary unread, its replicas holding every write between them: unknown, not 0 primaries (nemesis seed 7336)",
        history: build([...write(0, 1, "ok"), ...write(10, 2, "ok")]),
        final: unreadPrimary([1], [2]),
        valid: "unknown",
        expect: "(d) the topology's primary n1 could not be read at the end (Command timed out)",
      },
      {
        rule: "(a) the topology's primary unread: a write none of its replicas holds is lost, checked on replicas",
        history: build([...write(0, 1, "ok"), ...write(10, 2, "ok"), ...write(20, 3, "ok")]),
        final: unreadPrimary([1], [2]),
        valid: false,
        expect: "(a) 1 replica-acknowledged writes missing from the replicas following n1 (n2, n3): seq 3",
      },
      {
        rule: "(d) the topology's primary unread and a live node following another: a failure",
        history: build([]),
        final: {
          nodes: [
            { node: "n1", reachable: false, error: "Command timed out" },
            { node: "n2", reachable: true, role: "slave", following: "n1", linkUp: true, seqs: [] },
            { node: "n3", reachable: true, role: "slave", following: "n2", linkUp: true, seqs: [] },
          ],
          topologyPrimary: "n1",
        },
        valid: false,
        expect: "(d) live nodes not following the topology's primary n1: n3 (slave of n2, link up)",
      },
      {
        rule: "(e) an epoch change with no fault is a violation",
        history: build([epoch(5000, 1, 2, "n2")]),
        final: healthy("n2", [], ["n1", "n3"]),
        valid: false,
        expect: "(e) epoch 1 -> 2",
      },
      {
        rule: "(e) an epoch change long after the last heal is a violation",
        history: build([fault(0, "inject", 1), fault(1000, "heal", 1), epoch(12_000, 1, 2, "n2")]),
        final: healthy("n2", [], ["n1", "n3"]),
        valid: false,
        expect: "(e) epoch 1 -> 2",
      },
      {
        rule: "(e) a change the cool-down deferred past the window has its cause: the window counts from the cool-down's end (simulator seed 44331)",
        history: build([
          fault(0, "inject", 1),
          fault(500, "heal", 1),
          epochWithCooldown(600, 1, 2, "n2", 20_000),
          fault(1000, "inject", 2),
          fault(2000, "heal", 2),
          epoch(20_500, 2, 3, "n3"),
        ]),
        final: healthy("n3", [], ["n1", "n2"]),
        valid: true,
        expect: null,
      },
      {
        rule: "(e) a cool-down read only after the heal does not stretch the window",
        history: build([
          fault(1000, "inject", 1),
          fault(2000, "heal", 1),
          epochWithCooldown(3000, 1, 2, "n2", 20_000),
          epoch(20_500, 2, 3, "n3"),
        ]),
        final: healthy("n3", [], ["n1", "n2"]),
        valid: false,
        expect: "(e) epoch 2 -> 3",
      },
      {
        rule: "(e) an epoch change right after the nemesis's operator recovery has its cause",
        history: build([
          fault(0, "inject", 1),
          fault(1000, "heal", 1),
          { t: 40_000, process: "nemesis", type: "info", f: "recover", value: { note: "recover --to n2" } },
          epoch(41_000, 1, 2, "n2"),
        ]),
        final: healthy("n2", [], ["n1", "n3"]),
        valid: true,
        expect: null,
      },
      {
        rule: "(e) an operator recovery's epoch change observed before the recovery returned has its cause (seed 777)",
        history: build([
          fault(0, "inject", 1),
          fault(1000, "heal", 1),
          { t: 40_000, process: "nemesis", type: "invoke", f: "recover" },
          epoch(40_400, 1, 2, "n2"),
          { t: 40_900, process: "nemesis", type: "info", f: "recover", value: { note: "recover --to n2" } },
        ]),
        final: healthy("n2", [], ["n1", "n3"]),
        valid: true,
        expect: null,
      },
      {
        rule: "(e) an epoch change during a fault has its cause",
        history: build([fault(0, "inject", 1), epoch(60_000, 1, 2, "n2"), fault(70_000, "heal", 1)]),
        final: healthy("n2", [], ["n1", "n3"]),
        valid: true,
        expect: null,
      },
      {
        rule: "a key never attempted is unexpected",
        history: build([]),
        final: healthy("n1", [99]),
        valid: false,
        expect: "never written",
      },
      {
        rule: "an indeterminate write that landed is recovered, not a violation",
        history: build(write(0, 4, "info")),
        final: healthy("n1", [4]),
        valid: true,
        expect: null,
      },
    ];

    it.each(table)("$rule", ({ history, final, valid, expect: expected }) => {
      const result = check(history, final, OPTIONS);
      expect(result.valid).toBe(valid);
      if (expected === null) expect(result.violations).toEqual([]);
      else expect(result.violations.some((v) => v.includes(expected))).toBe(true);
    });

    it("checks (a) on the union of the replicas' keys when the topology's primary could not be read, and says so", () => {
      const history = build([...write(0, 1, "ok"), ...write(10, 2, "ok"), ...write(20, 3, "ok", 0)]);
      const result = check(history, unreadPrimary([1], [2]), OPTIONS);
      expect(result).toMatchObject({ valid: "unknown", lost: [], asyncOnly: [3] });
      expect(result.violations).toEqual([
        "(d) the topology's primary n1 could not be read at the end (Command timed out)",
        "(a) checked on replicas: n1 not read, the data rules (a, c) were checked on the union of the keys of n2, n3",
      ]);
    });

    it("counts async-only losses and recovered writes", () => {
      const history = build([...write(0, 1, "ok", 0), ...write(10, 2, "info"), ...write(20, 3, "ok", 1)]);
      const result = check(history, healthy("n1", [2, 3]), OPTIONS);
      expect(result).toMatchObject({ asyncOnly: [1], recovered: [2], lost: [], valid: true });
      expect(result.stats).toMatchObject({ ackedAsyncOnly: 1, ackedByReplica: 1, indeterminate: 1 });
    });
  });

  it("reports a stretch without acknowledged writes with the faults active in it, without failing the run", () => {
    const history = build([
      ...write(0, 1, "ok"),
      fault(1000, "inject", 4, "pause-redis"),
      ...write(30_000, 2, "ok"),
      fault(31_000, "heal", 4, "pause-redis"),
    ]);
    const result = check(history, healthy("n1", [1, 2]), { ...OPTIONS, maxWriteGapMs: 10_000 });
    expect(result.valid).toBe(true);
    expect(result.unavailable).toEqual([
      { from: 1, to: 30_001, ms: 30_000, faults: ["#4 pause-redis primary n1"] },
    ]);
  });

  describe("guarantee 3 (g3): a writable primary within the limit once every fault healed", () => {
    const G3: CheckOptions = { ...OPTIONS, availabilityLimitMs: 14_000 };
    const acks = (from: number, to: number, every: number, firstSeq: number) =>
      Array.from({ length: Math.floor((to - from) / every) + 1 }, (_, index) =>
        write(from + index * every, firstSeq + index, "ok"),
      ).flat();

    it("passes a run writable within the limit after each heal, whatever the gaps while faults were active", () => {
      // Prepare: writes every second, none for 40 s while a fault is active, the first 5 s after its heal.
      const history = build([
        ...acks(0, 10_000, 1000, 1),
        fault(10_500, "inject", 1, "pause-redis"),
        fault(50_000, "heal", 1, "pause-redis"),
        ...acks(55_000, 70_000, 1000, 100),
      ]);

      // Act
      const result = check(
        history,
        healthy(
          "n1",
          history.flatMap((op) => (op.type === "ok" ? [(op.value as { seq: number }).seq] : [])),
        ),
        G3,
      );

      // Assess
      expect(result.availability).toEqual([]);
      expect(result.valid).toBe(true);
    });

    it("fails a run with no writable primary for longer than the limit after the last fault healed, naming it", () => {
      // Prepare: the fault heals at 20 s; the next acknowledged write comes 30 s later.
      const history = build([
        ...acks(0, 5000, 1000, 1),
        fault(6000, "inject", 3, "restart-as-replica"),
        fault(20_000, "heal", 3, "restart-as-replica"),
        ...write(50_000, 50, "ok"),
      ]);

      // Act
      const result = check(history, healthy("n1", [1, 2, 3, 4, 5, 6, 50]), G3);

      // Assess
      expect(result.valid).toBe(false);
      expect(result.availability).toEqual([
        {
          from: 20_000,
          to: 50_001,
          ms: 30_001,
          limitMs: 14_000,
          cause: "#3 restart-as-replica primary n1 healed",
        },
      ]);
      expect(result.violations.some((v) => v.startsWith("(g3)") && v.includes("t=20.0 s"))).toBe(true);
    });

    it("counts from the end of a cool-down in force at the heal, as rule (e) does (simulator seeds 150119, 150261)", () => {
      // Prepare: a failover at 10 s reads 30 s of cool-down (to 40 s); the new primary restarts
      // empty at 12 s (healed at 13 s); the controller replaces it when the cool-down ends, the next
      // write at 45 s: 32 s after the heal, 5 s after the cool-down. A second run waits 20 s more.
      const before = [
        ...acks(0, 5000, 1000, 1),
        fault(6000, "inject", 1, "kill-redis"),
        epochWithCooldown(10_000, 0, 1, "n2", 30_000),
        fault(11_000, "heal", 1, "kill-redis"),
        ...acks(11_500, 11_500, 1000, 10),
        fault(12_000, "inject", 2, "restart-redis-fast"),
        fault(13_000, "heal", 2, "restart-redis-fast"),
      ];
      const seqs = [1, 2, 3, 4, 5, 6, 10, 50];

      // Act
      const deferred = check(build([...before, ...write(45_000, 50, "ok")]), healthy("n1", seqs), G3);
      const late = check(build([...before, ...write(65_000, 50, "ok")]), healthy("n1", seqs), G3);

      // Assess
      expect(deferred.availability).toEqual([]);
      expect(late.availability).toEqual([
        {
          from: 40_000,
          to: 65_001,
          ms: 25_001,
          limitMs: 14_000,
          cause:
            "#2 restart-redis-fast primary n1 healed (clock from the end of the cool-down in force, t=40.0 s)",
        },
      ]);
    });

    it("does not move the clock back to a write acknowledged between the heal and the cool-down's end (simulator seed 281619)", () => {
      // Prepare: as above, the cool-down runs to 40 s and the fault heals at 13 s; a write taken just
      // before the restart is recorded at 14 s (its WAIT gave up after the heal). The next fault comes
      // at 36 s, before the cool-down ends: no failover was due in that stretch. A second run has its
      // first write after the cool-down 20 s late and still fails, counted from the cool-down's end.
      const before = [
        ...acks(0, 5000, 1000, 1),
        fault(6000, "inject", 1, "kill-redis"),
        epochWithCooldown(10_000, 0, 1, "n2", 30_000),
        fault(11_000, "heal", 1, "kill-redis"),
        ...acks(11_500, 11_500, 1000, 10),
        fault(12_000, "inject", 2, "restart-redis-fast"),
        fault(13_000, "heal", 2, "restart-redis-fast"),
        ...write(13_999, 11, "ok"),
      ];
      const seqs = [1, 2, 3, 4, 5, 6, 10, 11, 50];

      // Act
      const injected = check(
        build([...before, fault(36_000, "inject", 3, "unmanaged-replica"), ...write(45_000, 50, "ok")]),
        healthy("n1", seqs),
        G3,
      );
      const late = check(build([...before, ...write(65_000, 50, "ok")]), healthy("n1", seqs), G3);

      // Assess
      expect(injected.availability).toEqual([]);
      expect(late.availability).toEqual([
        {
          from: 40_000,
          to: 65_001,
          ms: 25_001,
          limitMs: 14_000,
          cause:
            "#2 restart-redis-fast primary n1 healed (clock from the end of the cool-down in force, t=40.0 s)",
        },
      ]);
    });

    it("fails a run whose shard stops taking writes with no fault active, and one never writable until the end", () => {
      // Prepare: writable, then nothing for 20 s with no fault at all; a fault later heals and the
      // history ends 16 s after it without a write.
      const history = build([
        ...acks(0, 5000, 1000, 1),
        ...write(25_000, 10, "ok"),
        fault(26_000, "inject", 1, "kill-redis"),
        fault(30_000, "heal", 1, "kill-redis"),
        probe(46_000, ["n1"]),
      ]);

      // Act
      const result = check(history, healthy("n1", [1, 2, 3, 4, 5, 6, 10]), G3);

      // Assess
      expect(result.availability.map((b) => [b.from, b.to, b.cause])).toEqual([
        [5001, 25_001, "a writable primary with no fault active"],
        [30_000, 46_000, "#1 kill-redis primary n1 healed"],
      ]);
      expect(result.valid).toBe(false);
    });

    it("does not count a deposed primary's (stray) writes as the shard being available", () => {
      // Prepare
      const history = build([
        ...acks(0, 2000, 1000, 1),
        fault(3000, "inject", 1, "operator"),
        fault(4000, "heal", 1, "operator"),
        { t: 10_000, process: "writer", type: "invoke", f: "write", value: { seq: 9 }, node: "n2" },
        {
          t: 10_001,
          process: "writer",
          type: "ok",
          f: "write",
          value: { seq: 9, replicas: 0, stray: true },
          node: "n2",
        },
        ...write(25_000, 10, "ok"),
      ]);

      // Act
      const result = check(history, healthy("n1", [1, 2, 3, 10]), G3);

      // Assess
      expect(result.availability.map((b) => [b.from, b.to])).toEqual([[4000, 25_001]]);
    });
  });

  describe("properties", () => {
    const outcomes = fc.array(
      fc.record({ outcome: fc.constantFrom("ok", "fail", "info"), replicas: fc.integer({ min: 0, max: 2 }) }),
      { maxLength: 60 },
    );

    it("a history where every acked write is in the final read has no lost writes", () => {
      fc.assert(
        fc.property(outcomes, fc.array(fc.boolean(), { maxLength: 60 }), (writes, extraPresent) => {
          const ops = build(writes.flatMap((w, i) => write(i * 10, i + 1, w.outcome, w.replicas)));
          // Every acked write is present; unacked ones may or may not be.
          const seqs = writes
            .map((w, i) => ({ w, seq: i + 1, extra: extraPresent[i] ?? false }))
            .filter(({ w, extra }) => w.outcome === "ok" || (w.outcome === "info" && extra))
            .map(({ seq }) => seq);
          const result = check(ops, healthy("n1", seqs), OPTIONS);
          expect(result.lost).toEqual([]);
          expect(result.asyncOnly).toEqual([]);
          expect(result.valid).toBe(true);
        }),
      );
    });

    it("every replica-acked write removed from the final read is reported lost, and only those", () => {
      fc.assert(
        fc.property(outcomes, fc.array(fc.boolean(), { maxLength: 60 }), (writes, drop) => {
          const ops = build(writes.flatMap((w, i) => write(i * 10, i + 1, w.outcome, w.replicas)));
          const acked = writes.map((w, i) => ({ w, seq: i + 1 })).filter(({ w }) => w.outcome === "ok");
          const kept = acked.filter((_, i) => !(drop[i] ?? false));
          const result = check(
            ops,
            healthy(
              "n1",
              kept.map(({ seq }) => seq),
            ),
            OPTIONS,
          );
          const expectedLost = acked
            .filter((_, i) => drop[i] ?? false)
            .filter(({ w }) => w.replicas >= 1)
            .map(({ seq }) => seq);
          expect(result.lost).toEqual(expectedLost);
          expect(result.valid).toBe(expectedLost.length === 0);
        }),
      );
    });
  });
});
