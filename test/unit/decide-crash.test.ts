import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CRASH_CONFIRM_MS, promotionWindow } from "../../src/core/crash.ts";
import { decide } from "../../src/core/decide.ts";
import type { CrashState, Heartbeat, HeartbeatInput, Topology } from "../../src/core/model.ts";
import { aConfig, aHeartbeat, aShard, NOW, outcome, type ShardBuilder } from "../support/builders.ts";

/**
 * The crash fast path of decide(): a fresh primary is failed over before the failure timeout only
 * when its own agent confirmed a crash and a majority of the fresh replicas see the link down.
 */

interface Crash {
  readonly state?: CrashState;
  /** ms before NOW of the first and the latest observation. */
  readonly firstAgo?: number;
  readonly lastAgo?: number;
  /** ms before NOW when the database last answered. */
  readonly answeredAgo?: number;
}

function crashedPrimary(crash: Crash = {}): Partial<HeartbeatInput> & { node_id: string; ageMs: number } {
  const { state = "refused", firstAgo = 400, lastAgo = 250, answeredAgo = 600 } = crash;
  return {
    node_id: "p1",
    ageMs: answeredAgo,
    db_status: "down",
    agent_updated: (NOW - lastAgo) * 1000,
    db_crash: {
      state,
      run_id: "run-1",
      first_seen: (NOW - firstAgo) * 1000,
      last_seen: (NOW - lastAgo) * 1000,
    },
  };
}

/** p1 reports a crash; `linkDown` replicas see the link down. */
function aCrashedShard(crash: Crash = {}, linkDown: readonly string[] = ["r1", "r2"]): ShardBuilder {
  const shard = aShard().withNode(crashedPrimary(crash));
  for (const id of linkDown) shard.withNode({ node_id: id, primary_link: "down" });
  return shard;
}

describe("decide: the crash fast path", () => {
  it.each([
    {
      name: "fails over a fresh primary whose agent confirmed a refused connection and whose replicas see the link down",
      shard: () => aCrashedShard(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "promotes the replica holding the most even outside the replica set when the primary's agent confirms its process dead (nothing left to fence)",
      shard: () =>
        aCrashedShard()
          .withNode({ node_id: "r1", primary_link: "down", last_txn_id: 700 })
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 990 })
          .guardedBy(["r1"]),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "fails over on a confirmed reset",
      shard: () => aCrashedShard({ state: "reset" }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over on a restart without the data",
      shard: () => aCrashedShard({ state: "restarted" }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "waits while the crash was observed only once (two observations less than 100 ms apart)",
      shard: () => aCrashedShard({ firstAgo: 300, lastAgo: 300 - CRASH_CONFIRM_MS + 1 }),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "counts two observations exactly 100 ms apart as confirmed",
      shard: () => aCrashedShard({ firstAgo: 300, lastAgo: 300 - CRASH_CONFIRM_MS }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "ignores a crash first seen before the database last answered (an old report)",
      shard: () => aCrashedShard({ firstAgo: 800, lastAgo: 500, answeredAgo: 600 }),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "ignores a report whose latest observation is older than the failure timeout",
      shard: () =>
        aShard()
          .withNode({ ...crashedPrimary({ firstAgo: 3200, lastAgo: 3100, answeredAgo: 2900 }), ageMs: 2900 })
          .withNode({ node_id: "r1", primary_link: "down" })
          .withNode({ node_id: "r2", primary_link: "down" }),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "waits when only a minority of the replicas see the link down",
      shard: () => aCrashedShard({}, []),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "waits while one fresh replica still reports the link up (its offset may not be final)",
      shard: () => aCrashedShard({}, ["r1", "r2"]).withNode({ node_id: "r3", last_txn_id: 900 }),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "ranks by offsets read after the links dropped: the replica that received more wins",
      shard: () => aCrashedShard({}, ["r1", "r2"]).withNode({ node_id: "r2", last_txn_id: 995 }),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "does not count probe reports (unreachable) as link down on the fast path",
      shard: () =>
        aCrashedShard({}, []).withNode({ node_id: "r1", primary_probe: "unreachable" }).withNode({
          node_id: "r2",
          primary_probe: "unreachable",
        }),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "needs every fresh replica even under quorum none (1 of 2 is not enough)",
      shard: () => aCrashedShard({}, ["r1"]),
      config: { quorum: "none" as const },
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "never takes the fast path with no fresh replica to confirm",
      shard: () => aCrashedShard({}, []).without("r1").without("r2"),
      config: { quorum: "none" as const },
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "does not mark the shard offline on the fast path when nobody is eligible",
      shard: () =>
        aCrashedShard()
          .withNode({ node_id: "r1", repl_id: "other" })
          .withNode({ node_id: "r2", repl_id: "other" }),
      expected: { kind: "none", code: "crash_no_candidate" },
    },
    {
      name: "hung primary (database stopped answering, no crash report) waits the full failure timeout",
      shard: () =>
        aShard()
          .withNode({ node_id: "p1", ageMs: 2900 })
          .withNode({ node_id: "r1", primary_probe: "unreachable" })
          .withNode({ node_id: "r2", primary_probe: "unreachable" }),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "unreachable primary (agent and database silent, links down) waits the full failure timeout",
      shard: () =>
        aShard()
          .withNode({ node_id: "p1", ageMs: 2900 })
          .withNode({ node_id: "r1", primary_link: "down" })
          .withNode({ node_id: "r2", primary_link: "down" }),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "a database reported down without crash evidence (a timeout) waits the full failure timeout",
      shard: () =>
        aShard()
          .withNode({ node_id: "p1", ageMs: 2900, db_status: "down", agent_updated: NOW * 1000 })
          .withNode({ node_id: "r1", primary_link: "down" })
          .withNode({ node_id: "r2", primary_link: "down" }),
      expected: { kind: "none", code: "healthy" },
    },
  ])("$name", ({ shard, expected, config }) => {
    // Prepare
    const snapshot = shard().build();
    // Act
    const decision = decide(snapshot, aConfig(config), NOW);
    // Assess
    expect(outcome(decision)).toMatchObject(expected);
    expect(decision.reason.length).toBeGreaterThan(10);
  });

  it("names the crash in the failover's reason and carries the report", () => {
    const decision = decide(aCrashedShard().build(), aConfig(), NOW);
    expect(decision.kind).toBe("failover");
    expect(decision.reason).toMatch(/saw its database die \(refused, process run-1, confirmed over 150 ms\)/);
    expect(decision.kind === "failover" ? decision.crash?.state : undefined).toBe("refused");
  });
});

const replicaArb = fc.record({
  ageMs: fc.integer({ min: -500, max: 6000 }),
  primary_link: fc.constantFrom("up" as const, "down" as const, undefined),
  primary_probe: fc.constantFrom("ok" as const, "unreachable" as const, "fenced" as const, undefined),
  db_status: fc.constantFrom("up" as const, "up" as const, "down" as const),
  priority: fc.constantFrom(0, 1, 100),
});

const primaryArb = fc.record({
  answeredAgo: fc.integer({ min: 0, max: 2999 }),
  db_status: fc.constantFrom("up" as const, "down" as const),
  crash: fc.option(
    fc.record({
      state: fc.constantFrom<CrashState>("refused", "reset", "restarted"),
      firstAgo: fc.integer({ min: -3000, max: 4000 }),
      spanMs: fc.integer({ min: 0, max: 400 }),
    }),
    { nil: undefined },
  ),
});

type PrimaryCase = typeof primaryArb extends fc.Arbitrary<infer P> ? P : never;
type ReplicaCase = typeof replicaArb extends fc.Arbitrary<infer R> ? R : never;

function buildShard(primary: PrimaryCase, replicas: readonly ReplicaCase[]) {
  const nodes: Heartbeat[] = [
    aHeartbeat({
      node_id: "p1",
      role: "primary",
      primary_node_id: undefined,
      primary_link: undefined,
      ageMs: primary.answeredAgo,
      db_status: primary.db_status,
      agent_updated: NOW * 1000,
      ...(primary.crash
        ? {
            db_crash: {
              state: primary.crash.state,
              run_id: "run-1",
              first_seen: Math.max(0, (NOW - primary.crash.firstAgo) * 1000),
              last_seen: Math.max(0, (NOW - primary.crash.firstAgo + primary.crash.spanMs) * 1000),
            },
          }
        : {}),
    }),
    ...replicas.map((replica, index) => aHeartbeat({ node_id: `r${index}`, ...replica })),
  ];
  const snapshot = aShard().build();
  return { ...snapshot, nodes, replicaSets: { p1: replicas.map((_, index) => `r${index}`) } };
}

describe("decide: crash fast path properties", () => {
  it("never fails over a fresh primary without a confirmed crash report from its own agent", () => {
    fc.assert(
      fc.property(primaryArb, fc.array(replicaArb, { maxLength: 5 }), (primary, replicas) => {
        const snapshot = buildShard(primary, replicas);
        const decision = decide(snapshot, aConfig(), NOW);
        const crash = snapshot.nodes[0]?.db_crash;
        const confirmed =
          primary.db_status === "down" &&
          crash !== undefined &&
          crash.last_seen - crash.first_seen >= CRASH_CONFIRM_MS * 1000 &&
          crash.first_seen >= (NOW - primary.answeredAgo) * 1000;
        if (!confirmed) expect(decision.kind).toBe("none");
      }),
    );
  });

  it("fails over a fresh primary only when every fresh replica, at least one, sees the link down", () => {
    fc.assert(
      fc.property(primaryArb, fc.array(replicaArb, { maxLength: 5 }), (primary, replicas) => {
        const snapshot = buildShard(primary, replicas);
        const decision = decide(snapshot, aConfig({ quorum: "none" }), NOW);
        if (decision.kind !== "failover" && decision.kind !== "mark_offline") return;
        expect(decision.kind).toBe("failover");
        const voters = replicas.filter((r) => r.db_status === "up" && r.ageMs <= 3000 && r.ageMs >= -2500);
        const down = voters.filter((r) => r.primary_link === "down").length;
        expect(voters.length).toBeGreaterThan(0);
        expect(down).toBe(voters.length);
      }),
    );
  });

  it("fails over a confirmed crash with every fresh replica seeing the link down and one eligible", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 2999 }),
        fc.integer({ min: CRASH_CONFIRM_MS, max: 1000 }),
        fc.integer({ min: 1, max: 4 }),
        (answeredAgo, spanMs, replicaCount) => {
          const firstAgo = answeredAgo;
          const snapshot = buildShard(
            {
              answeredAgo,
              db_status: "down",
              crash: { state: "refused", firstAgo, spanMs: Math.min(spanMs, firstAgo) },
            },
            Array.from({ length: replicaCount }, () => ({
              ageMs: 100,
              primary_link: "down" as const,
              primary_probe: undefined,
              db_status: "up" as const,
              priority: 100,
            })),
          );
          const decision = decide(snapshot, aConfig(), NOW);
          if (Math.min(spanMs, firstAgo) >= CRASH_CONFIRM_MS) expect(decision.kind).toBe("failover");
          else expect(decision.kind).toBe("none");
        },
      ),
    );
  });
});

describe("promotionWindow", () => {
  const oldPrimary = (overrides: Partial<HeartbeatInput> = {}) =>
    aHeartbeat({ ...crashedPrimary(), role: "primary", ...overrides });

  it.each([
    {
      name: "skips the window when the old primary's agent confirmed the death of the process this node followed",
      input: { oldPrimary: oldPrimary(), lastPrimaryRunId: "run-1", linkDown: true },
      expected: "skip",
    },
    {
      name: "waits when the crashed process is another one than this node followed",
      input: { oldPrimary: oldPrimary(), lastPrimaryRunId: "run-2", linkDown: true },
      expected: "wait",
    },
    {
      name: "waits when this node never learned its primary's run_id",
      input: { oldPrimary: oldPrimary(), lastPrimaryRunId: undefined, linkDown: true },
      expected: "wait",
    },
    {
      name: "waits while this node's link to the old primary is up",
      input: { oldPrimary: oldPrimary(), lastPrimaryRunId: "run-1", linkDown: false },
      expected: "wait",
    },
    {
      name: "waits when the old primary reports its database up again",
      input: { oldPrimary: oldPrimary({ db_status: "up" }), lastPrimaryRunId: "run-1", linkDown: true },
      expected: "wait",
    },
    {
      name: "waits when the crash is unconfirmed",
      input: {
        oldPrimary: oldPrimary({
          db_crash: {
            state: "refused",
            run_id: "run-1",
            first_seen: NOW * 1000,
            last_seen: NOW * 1000 + 50_000,
          },
        }),
        lastPrimaryRunId: "run-1",
        linkDown: true,
      },
      expected: "wait",
    },
    {
      name: "waits without the old primary's heartbeat (a hang or a partition: the window is needed)",
      input: { oldPrimary: undefined, lastPrimaryRunId: "run-1", linkDown: true },
      expected: "wait",
    },
  ])("$name", ({ input, expected }) => {
    expect(promotionWindow(input).kind).toBe(expected);
  });
});

describe("promotionWindow in a switchover", () => {
  /** The topology of a switchover from p1 to r1 at epoch 4, at `phase`. */
  const switchover = (
    overrides: Partial<Topology> = {},
    kind: "switchover" | "failover" = "switchover",
  ): Topology => ({
    shard: "s1",
    epoch: 4,
    status: "failing_over",
    phase: "promote",
    primary_node_id: "p1",
    primary_address: "p1.local:6379",
    updated_at: NOW,
    failover: {
      kind,
      old_primary_node_id: "p1",
      new_primary_node_id: "r1",
      new_primary_address: "r1.local:6379",
      reason: "switchover requested",
      started_at: NOW - 500,
      candidates: [],
      phase_started: {},
    },
    ...overrides,
  });
  const oldPrimary = (epoch: number, overrides: Partial<HeartbeatInput> = {}) =>
    aHeartbeat({
      node_id: "p1",
      role: "primary",
      primary_node_id: undefined,
      primary_link: undefined,
      epoch,
      ...overrides,
    });
  const live = { lastPrimaryRunId: "run-1", linkDown: false };

  it.each([
    {
      name: "skips the window when the old primary's heartbeat shows the switchover's PAUSE_WRITES applied (its writes are fenced)",
      input: { ...live, oldPrimary: oldPrimary(4), topology: switchover() },
      expected: "skip",
    },
    {
      name: "skips it when the old primary already follows at the switchover's epoch (a replica takes no writes)",
      input: {
        ...live,
        oldPrimary: oldPrimary(4, { role: "replica", primary_node_id: "r1" }),
        topology: switchover(),
      },
      expected: "skip",
    },
    {
      name: "waits when the old primary's heartbeat is below the switchover's epoch (the pause not seen applied)",
      input: { ...live, oldPrimary: oldPrimary(3), topology: switchover() },
      expected: "wait",
    },
    {
      name: "waits in a failover (nothing paused the old primary)",
      input: { ...live, oldPrimary: oldPrimary(4), topology: switchover({}, "failover") },
      expected: "wait",
    },
    {
      name: "waits when the heartbeat read is another node's than the switchover's old primary",
      input: { ...live, oldPrimary: oldPrimary(4, { node_id: "r2" }), topology: switchover() },
      expected: "wait",
    },
    {
      name: "waits when the topology is no longer failing over",
      input: { ...live, oldPrimary: oldPrimary(4), topology: switchover({ status: "online" }) },
      expected: "wait",
    },
    {
      name: "waits without the old primary's heartbeat (deleted at cleanup: a replayed PROMOTE proves nothing)",
      input: { ...live, oldPrimary: undefined, topology: switchover() },
      expected: "wait",
    },
    {
      name: "waits when no topology was read",
      input: { ...live, oldPrimary: oldPrimary(4) },
      expected: "wait",
    },
  ])("$name", ({ input, expected }) => {
    expect(promotionWindow(input).kind).toBe(expected);
  });
});
