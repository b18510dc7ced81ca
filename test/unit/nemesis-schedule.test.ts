import { describe, expect, it } from "vitest";
import { parseGap } from "../../bench/nemesis.ts";
import {
  BACKGROUND_KINDS,
  BACKGROUND_REST_MS,
  capZeros,
  drawMembershipChange,
  drawPriorities,
  FAULT_KINDS,
  type FaultKind,
  MakeUps,
  MEMBERSHIP_CHANGES,
  MembershipDraws,
  parseFaultKinds,
  type ScheduledFault,
  scheduleFaults,
  UNTIL_END_FROM,
} from "../../src/dev/nemesis/faults.ts";
import { Random } from "../../src/dev/nemesis/random.ts";

describe("nemesis fault schedule", () => {
  it("replays the same schedule for the same seed", () => {
    const options = { minutes: 10, nodes: 3 };
    expect(scheduleFaults(42, options)).toEqual(scheduleFaults(42, options));
  });

  it("draws a different schedule for a different seed", () => {
    const options = { minutes: 10, nodes: 3 };
    expect(scheduleFaults(1, options)).not.toEqual(scheduleFaults(2, options));
  });

  it("draws every enabled kind equally often, a background kind at most two draws fewer", () => {
    const faults = scheduleFaults(7, { minutes: 30, nodes: 3 });
    const counts = Object.fromEntries(FAULT_KINDS.map((kind) => [kind, 0]));
    for (const fault of faults) counts[fault.kind] = (counts[fault.kind] ?? 0) + 1;
    const values = FAULT_KINDS.filter((kind) => !BACKGROUND_KINDS.includes(kind)).map(
      (kind) => counts[kind] ?? 0,
    );
    expect(Math.min(...values)).toBeGreaterThan(0);
    expect(Math.max(...values) - Math.min(...values)).toBeLessThanOrEqual(1);
    // A background draw that cannot start before the run's end (one at a time) is dropped.
    for (const kind of BACKGROUND_KINDS) expect(counts[kind]).toBeGreaterThanOrEqual(Math.min(...values) - 2);
  });

  it("draws only the kinds asked for", () => {
    const faults = scheduleFaults(3, { minutes: 5, nodes: 3, faults: ["pause-agent", "kill-redis"] });
    expect(new Set(faults.map((fault) => fault.kind))).toEqual(new Set(["pause-agent", "kill-redis"]));
  });

  it("keeps faults inside the run, in order, at most maxConcurrent at once, after the warm-up", () => {
    for (const seed of [1, 2, 3, 4, 5]) {
      const faults = scheduleFaults(seed, { minutes: 5, nodes: 3, maxConcurrent: 2, warmupMs: 5000 });
      expect(faults.length).toBeGreaterThan(10);
      for (const [index, fault] of faults.entries()) {
        expect(fault.id).toBe(index + 1);
        expect(fault.atMs).toBeGreaterThanOrEqual(5000);
        expect(fault.atMs + fault.durationMs).toBeLessThanOrEqual(5 * 60_000);
        if (index > 0) expect(fault.atMs).toBeGreaterThan(faults[index - 1]?.atMs ?? 0);
        // Background faults (an agent dead for minutes) run beside the others, outside the bound.
        const overlapping = faults.filter(
          (other) =>
            !BACKGROUND_KINDS.includes(other.kind) &&
            other.atMs <= fault.atMs &&
            fault.atMs < other.atMs + other.durationMs,
        );
        expect(overlapping.length).toBeLessThanOrEqual(2);
      }
    }
  });

  it("pauses a controller past its lock lease and leaves at most one node of three dead for good", () => {
    const faults = scheduleFaults(11, { minutes: 30, nodes: 3, lockLeaseMs: 5000 });
    for (const fault of faults.filter((f) => f.kind === "pause-controller")) {
      expect(fault.durationMs).toBeGreaterThan(5000);
    }
    expect(
      faults.filter((f) => f.kind === "kill-redis" && f.params.restart === "none").length,
    ).toBeLessThanOrEqual(1);
  });

  it("cuts every agent and every controller from the store in a store outage, up to 45 s", () => {
    const outages = scheduleFaults(5, { minutes: 30, nodes: 3, faults: ["store-outage"] });
    expect(outages.length).toBeGreaterThan(20);
    for (const fault of outages) {
      expect(fault.target).toBe("everyone");
      expect(fault.durationMs).toBeGreaterThanOrEqual(3000);
      expect(fault.durationMs).toBeLessThanOrEqual(45_000);
    }
  });

  it("kills an agent for 30-180 s in a 30-minute run, a tenth to a third of a short one, some until the end", () => {
    // Prepare
    const long = scheduleFaults(21, { minutes: 30, nodes: 3, faults: ["kill-agent-long", "pause-agent"] });
    const short = scheduleFaults(21, { minutes: 2, nodes: 3, faults: ["kill-agent-long", "pause-agent"] });

    // Act
    const kills = long.filter((fault) => fault.kind === "kill-agent-long");
    const shortKills = short.filter((fault) => fault.kind === "kill-agent-long");

    // Assess
    expect(kills.length).toBeGreaterThan(10);
    for (const fault of kills) {
      if (fault.params.untilEnd === true) expect(fault.atMs + fault.durationMs).toBe(30 * 60_000);
      else {
        expect(fault.durationMs).toBeGreaterThanOrEqual(Math.min(30_000, 30 * 60_000 - fault.atMs - 1000));
        expect(fault.durationMs).toBeLessThanOrEqual(180_000);
      }
    }
    expect(kills.some((fault) => fault.params.untilEnd === false)).toBe(true);
    for (const fault of shortKills.filter((f) => f.params.untilEnd === false)) {
      expect(fault.durationMs).toBeLessThanOrEqual(0.35 * 120_000);
    }
  });

  it("kills one agent at a time, rests between, and leaves one dead until the end only in the last fifth", () => {
    // 33-minute runs with the gaps of docs/chaos.md's long runs: seeds 6301-6603 drew 2-3 kills
    // "until the end" from t=31 s on and left the shard offline for up to 31 minutes.
    const untilEndStarts: number[] = [];
    for (let seed = 6801; seed <= 6840; seed++) {
      // Prepare
      const totalMs = 33 * 60_000;
      const faults = scheduleFaults(seed, { minutes: 33, nodes: 3, gapMinMs: 2500, gapMaxMs: 6000 });

      // Act
      const kills = faults.filter((fault) => fault.kind === "kill-agent-long");
      const untilEnd = kills.filter((fault) => fault.params.untilEnd === true);

      // Assess
      expect(kills.length).toBeGreaterThanOrEqual(10);
      expect(untilEnd.length).toBeLessThanOrEqual(1);
      for (const fault of untilEnd) {
        expect(fault.atMs).toBeGreaterThanOrEqual(totalMs * UNTIL_END_FROM);
        expect(fault.atMs + fault.durationMs).toBe(totalMs);
        untilEndStarts.push(fault.atMs);
      }
      for (const [index, fault] of kills.entries()) {
        const next = kills[index + 1];
        if (next)
          expect(next.atMs - (fault.atMs + fault.durationMs)).toBeGreaterThanOrEqual(BACKGROUND_REST_MS.min);
      }
    }
    expect(untilEndStarts.length).toBeGreaterThan(10);
  });

  it("restarts a node as a replica of another node, from its RDB or empty, after a downtime", () => {
    const faults = scheduleFaults(9, { minutes: 10, nodes: 3, faults: ["restart-as-replica"] });
    expect(faults.length).toBeGreaterThan(20);
    for (const fault of faults) {
      expect(["rdb", "empty"]).toContain(fault.params.restart);
      expect(Number(fault.params.of)).toBeGreaterThanOrEqual(0);
      expect(Number(fault.params.of)).toBeLessThan(1);
      expect(fault.durationMs).toBeGreaterThanOrEqual(500);
      expect(fault.durationMs).toBeLessThanOrEqual(6000);
    }
    expect(new Set(faults.map((fault) => fault.params.restart))).toEqual(new Set(["rdb", "empty"]));
  });

  it("draws start priorities with 0 on at most (n-1)/2 nodes and never all 0, the same for a seed", () => {
    // Prepare
    const seeds = Array.from({ length: 200 }, (_, index) => index);

    // Act
    const drawn = seeds.map((seed) => drawPriorities(seed, 3));

    // Assess
    expect(drawPriorities(5, 3)).toEqual(drawPriorities(5, 3));
    for (const priorities of drawn) {
      expect(priorities.filter((p) => p === 0).length).toBeLessThanOrEqual(1);
      expect(priorities.some((p) => p > 0)).toBe(true);
    }
    expect(drawn.some((priorities) => priorities.includes(0))).toBe(true);
    expect(new Set(drawn.flat()).size).toBeGreaterThan(3);
    expect(capZeros([0, 0, 0])).toEqual([0, 100, 100]);
    expect(capZeros([0, 0, 0, 0, 0])).toEqual([0, 0, 100, 100, 100]);
  });

  it("changes one node's priority mid-run, 0 included", () => {
    const faults = scheduleFaults(4, { minutes: 20, nodes: 3, faults: ["priorities"] });
    expect(faults.length).toBeGreaterThan(20);
    expect(faults.some((fault) => fault.params.priority === 0)).toBe(true);
    expect(faults.some((fault) => Number(fault.params.priority) > 0)).toBe(true);
    for (const fault of faults) expect(["primary", "replica", "random-node"]).toContain(fault.target);
  });

  it("slows DynamoDB by 1-5 s or fails a fraction of its requests with a throttle or a 500, for a while", () => {
    const faults = scheduleFaults(8, { minutes: 20, nodes: 3, faults: ["store-slow", "store-throttle"] });
    const slow = faults.filter((fault) => fault.kind === "store-slow");
    const throttle = faults.filter((fault) => fault.kind === "store-throttle");
    expect(slow.length).toBeGreaterThan(10);
    expect(throttle.length).toBeGreaterThan(10);
    for (const fault of slow) {
      expect(Number(fault.params.delayMs)).toBeGreaterThanOrEqual(1000);
      expect(Number(fault.params.delayMs)).toBeLessThanOrEqual(5000);
    }
    for (const fault of throttle) {
      expect(["throttle", "500"]).toContain(fault.params.error);
      expect(Number(fault.params.fraction)).toBeGreaterThanOrEqual(0.3);
      expect(Number(fault.params.fraction)).toBeLessThanOrEqual(1);
    }
    expect(new Set(throttle.map((fault) => fault.params.error))).toEqual(new Set(["throttle", "500"]));
    expect(new Set(faults.map((fault) => fault.target))).toContain("everyone");
  });

  it("steps a database host's clock 1-30 s back or forward", () => {
    const faults = scheduleFaults(6, { minutes: 20, nodes: 3, faults: ["redis-clock-step"] });
    expect(faults.length).toBeGreaterThan(20);
    for (const fault of faults) {
      const offset = Math.abs(Number(fault.params.offsetS));
      expect(offset).toBeGreaterThanOrEqual(1);
      expect(offset).toBeLessThanOrEqual(30);
    }
    expect(faults.some((fault) => Number(fault.params.offsetS) < 0)).toBe(true);
    expect(faults.some((fault) => Number(fault.params.offsetS) > 0)).toBe(true);
  });

  it("acts as an operator on the shard: switchover (named or best), pause, recover", () => {
    const faults = scheduleFaults(2, { minutes: 20, nodes: 3, faults: ["operator"] });
    expect(new Set(faults.map((fault) => fault.params.action))).toEqual(
      new Set(["switchover", "pause", "recover"]),
    );
    for (const fault of faults) expect(fault.target).toBe("shard");
    expect(new Set(faults.filter((f) => f.params.action === "switchover").map((f) => f.params.to))).toEqual(
      new Set(["named", "best"]),
    );
  });

  it("cuts between nodes one way, both ways, isolates the primary or splits it off with one replica", () => {
    const faults = scheduleFaults(12, { minutes: 20, nodes: 3, faults: ["partition-nodes"] });
    expect(faults.length).toBeGreaterThan(20);
    expect(new Set(faults.map((fault) => fault.params.shape))).toEqual(
      new Set(["one-way", "two-way", "split", "isolate"]),
    );
    for (const fault of faults) {
      expect(fault.target).toBe(
        fault.params.shape === "split" || fault.params.shape === "isolate" ? "primary" : "random-node",
      );
      expect(fault.durationMs).toBeGreaterThanOrEqual(3000);
      expect(fault.durationMs).toBeLessThanOrEqual(30_000);
    }
  });

  it.each([
    { change: "anonymous", target: "primary", params: [] },
    { change: "scale", target: "shard", params: ["replicaof"] },
    { change: "replace", target: "replica", params: ["address", "replicaof"] },
  ])("draws the membership change $change on $target, with its parameters", ({ change, target, params }) => {
    // Prepare
    const faults = scheduleFaults(13, { minutes: 20, nodes: 3, faults: ["membership", "pause-agent"] });

    // Act
    const drawn = faults.filter((fault) => fault.kind === "membership" && fault.params.change === change);

    // Assess
    expect(drawn.length).toBeGreaterThanOrEqual(3);
    for (const fault of drawn) {
      expect(fault.target).toBe(target);
      expect(Object.keys(fault.params).sort()).toEqual(["change", ...params].sort());
      expect(fault.durationMs).toBeGreaterThanOrEqual(10_000);
      expect(fault.durationMs).toBeLessThanOrEqual(60_000);
      if (change === "replace") expect(["same", "new"]).toContain(fault.params.address);
    }
    if (change === "replace") {
      expect(new Set(drawn.map((fault) => fault.params.address))).toEqual(new Set(["same", "new"]));
    }
  });

  it("draws each membership change several times in a 30-minute run, from the kind's own stream", () => {
    for (const seed of [1, 7, 12, 4401]) {
      // Prepare
      const membership = scheduleFaults(seed, { minutes: 30, nodes: 3 }).filter(
        (fault) => fault.kind === "membership",
      );
      const draws = new MembershipDraws(seed);

      // Act
      const changes = membership.map((fault) => fault.params.change);

      // Assess: changes and parameters are the stream's, in order (no draw of the run's stream moved them).
      expect(membership.map((fault) => fault.params)).toEqual(
        membership.map(() => drawMembershipChange(draws)),
      );
      for (const change of MEMBERSHIP_CHANGES) {
        expect(changes.filter((drawn) => drawn === change).length).toBeGreaterThanOrEqual(3);
      }
    }
  });

  it("reads a gap range and rejects a bad one by its text", () => {
    expect(parseGap("3000-7000")).toEqual({ min: 3000, max: 7000 });
    expect(() => parseGap("7000-3000")).toThrow(/7000-3000/);
    expect(() => parseGap("fast")).toThrow(/fast/);
    expect(() => parseGap("10-20")).toThrow(/100 <= min/);
  });

  it("rejects an unknown kind by name", () => {
    expect(() => parseFaultKinds("kill-redis,frobnicate")).toThrow(/frobnicate/);
    expect(parseFaultKinds("kill-redis, pause-agent")).toEqual(["kill-redis", "pause-agent"]);
  });

  it("the PRNG is deterministic and spreads over [0, 1)", () => {
    const a = new Random(5);
    const b = new Random(5);
    const draws = Array.from({ length: 1000 }, () => a.next());
    expect(draws).toEqual(Array.from({ length: 1000 }, () => b.next()));
    expect(Math.min(...draws)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...draws)).toBeLessThan(1);
    expect(draws.filter((x) => x < 0.5).length).toBeGreaterThan(400);
  });
});

describe("make-ups for skipped kinds (issue 29)", () => {
  const fault = (id: number, kind: FaultKind, extra: Partial<ScheduledFault> = {}): ScheduledFault => ({
    id,
    atMs: id * 1000,
    kind,
    target: "primary",
    pick: 0.5,
    params: {},
    durationMs: 5000,
    ...extra,
  });

  it("gives a slot of a kind at its quota to the oldest skipped fault of a kind below it", () => {
    // Prepare
    const makeUps = new MakeUps(2, 60_000);
    makeUps.injected("pause-redis");
    makeUps.injected("pause-redis");
    makeUps.skipped(fault(1, "kill-redis", { params: { restart: "rdb" }, durationMs: 8000 }));
    makeUps.skipped(fault(2, "restart-as-replica"));
    // Act
    const taken = makeUps.take(fault(7, "pause-redis"));
    // Assess
    expect(taken).toEqual({
      id: 7,
      atMs: 7000,
      kind: "kill-redis",
      target: "primary",
      pick: 0.5,
      params: { restart: "rdb", makeUpOf: 1 },
      durationMs: 8000,
    });
    expect(makeUps.pending).toBe(1);
  });

  it.each([
    {
      name: "its kind is below the quota",
      prepare: (makeUps: MakeUps) => {
        makeUps.injected("pause-redis");
        makeUps.skipped(fault(1, "kill-redis"));
      },
    },
    {
      name: "no fault was skipped",
      prepare: (makeUps: MakeUps) => {
        makeUps.injected("pause-redis");
        makeUps.injected("pause-redis");
      },
    },
    {
      name: "the skipped kind reached the quota since",
      prepare: (makeUps: MakeUps) => {
        makeUps.injected("pause-redis");
        makeUps.injected("pause-redis");
        makeUps.skipped(fault(1, "kill-redis"));
        makeUps.injected("kill-redis");
        makeUps.injected("kill-redis");
      },
    },
  ])("keeps the slot when $name", ({ prepare }) => {
    // Prepare
    const makeUps = new MakeUps(2, 60_000);
    prepare(makeUps);
    const slot = fault(7, "pause-redis");
    // Act
    const taken = makeUps.take(slot);
    // Assess
    expect(taken).toBe(slot);
  });

  it("keeps nothing and gives nothing without a quota, and clips a make-up to end before the run", () => {
    // Prepare
    const none = new MakeUps(0, 60_000);
    none.skipped(fault(1, "kill-redis"));
    const clipped = new MakeUps(1, 60_000);
    clipped.injected("pause-redis");
    clipped.skipped(fault(1, "kill-agent-long", { durationMs: 120_000 }));
    // Act
    const slot = fault(2, "pause-redis");
    const kept = none.take(slot);
    const madeUp = clipped.take(fault(58, "pause-redis"));
    // Assess
    expect(kept).toBe(slot);
    expect(none.pending).toBe(0);
    expect(madeUp).toMatchObject({ kind: "kill-agent-long", atMs: 58_000, durationMs: 1000 });
  });
});
