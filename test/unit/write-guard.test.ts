import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { AgentContext, type AgentDeps } from "../../src/agent/context.ts";
import type { Database } from "../../src/agent/database.ts";
import { parseAgentOptions } from "../../src/agent/options.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import { currentPlan } from "../../src/agent/write-guard.ts";
import {
  classifyReplicas,
  FENCE_POLICIES,
  type ListedReplica,
  nodeIdsByAddress,
  PROMOTION_FENCE_WINDOW_MS,
  planWriteGuard,
  storeWitnessesOf,
  WITNESS_ADVANCE,
  type WriteGuardInput,
  type WriteGuardPlan,
} from "../../src/core/write-guard.ts";
import { memoryState, RecordingLogger } from "../support/agent-harness.ts";

const base: WriteGuardInput = {
  policy: "failsafe",
  role: "primary",
  confirmed: true,
  members: ["r1", "r2"],
  attached: ["r1", "r2"],
  msSinceHeartbeatWritten: 100,
  fenceTimeoutMs: 2000,
  restarted: false,
  promotionWindowOpen: false,
};

describe("the write guard", () => {
  it.each([
    ["a replica is left alone", { role: "replica" }, { kind: "replica" }],
    ["a restarted primary is fenced", { restarted: true }, { kind: "fence" }],
    ["a primary the topology does not confirm is fenced", { confirmed: false }, { kind: "fence" }],
    ["a freshly promoted node is fenced during the window", { promotionWindowOpen: true }, { kind: "fence" }],
    [
      "a fenced primary stays fenced while this cycle's topology read failed, whatever its writes",
      { fenced: true, topologyFresh: false, policy: "fence" },
      { kind: "fence", reason: "fenced until a topology read confirms this primary again" },
    ],
    [
      "a fenced primary whose topology read confirms it is opened",
      { fenced: true, topologyFresh: true, policy: "fence" },
      { kind: "open", reason: "confirmed" },
    ],
    [
      "an open primary keeps serving through a failed read while its heartbeats are written",
      { fenced: false, topologyFresh: false, policy: "fence" },
      { kind: "open" },
    ],
    ["failsafe demands every member", {}, { kind: "guard", minReplicas: 2, join: [], leave: [] }],
    [
      "failsafe keeps demanding every member while cut off from the store",
      { confirmed: undefined, msSinceHeartbeatWritten: 60_000 },
      { kind: "guard", minReplicas: 2 },
    ],
    [
      "failsafe raises the demand for an attached replica before the store lists it",
      { attached: ["r1", "r2", "r3"] },
      { kind: "guard", minReplicas: 3, join: ["r3"], leave: [] },
    ],
    [
      "failsafe keeps demanding a detached member until the store removed it",
      { attached: ["r1"] },
      { kind: "guard", minReplicas: 2, join: [], leave: ["r2"] },
    ],
    [
      "failsafe without a replica serves while the store answers",
      { members: [], attached: [] },
      { kind: "guard", minReplicas: 0 },
    ],
    [
      "failsafe without a replica fences when cut off (no witness)",
      { members: [], attached: [], msSinceHeartbeatWritten: 2000 },
      { kind: "fence" },
    ],
    [
      "failsafe fences when cut off while a majority of the replica set reaches the store",
      { msSinceHeartbeatWritten: 2000, storeWitnesses: ["r1", "r2"] },
      { kind: "fence" },
    ],
    [
      "failsafe keeps serving when only half the replica set reaches the store (a partial outage)",
      { msSinceHeartbeatWritten: 2000, storeWitnesses: ["r1"] },
      { kind: "guard", minReplicas: 2 },
    ],
    [
      "failsafe waits out the fence timeout even with witnesses",
      { msSinceHeartbeatWritten: 1999, storeWitnesses: ["r1", "r2"] },
      { kind: "guard", minReplicas: 2 },
    ],
    [
      "failsafe does not count a witness outside the replica set",
      { msSinceHeartbeatWritten: 5000, members: ["r1"], attached: ["r1"], storeWitnesses: ["r9"] },
      { kind: "guard", minReplicas: 1 },
    ],
    [
      "failsafe with one replica fences when that replica reaches the store",
      { msSinceHeartbeatWritten: 5000, members: ["r1"], attached: ["r1"], storeWitnesses: ["r1"] },
      { kind: "fence" },
    ],
    [
      "failsafe demands the replicas outside the set too: two anonymous replicas cannot stand for two members",
      { outsiders: 2 },
      { kind: "guard", minReplicas: 4, join: [], leave: [] },
    ],
    [
      "failsafe keeps demanding a detached member and the outsiders until the store removed the member",
      { attached: ["r1"], outsiders: 2 },
      { kind: "guard", minReplicas: 4, join: [], leave: ["r2"] },
    ],
    [
      "failsafe demands a joiner and an outsider beside the members",
      { attached: ["r1", "r2", "r3"], outsiders: 1 },
      { kind: "guard", minReplicas: 4, join: ["r3"], leave: [] },
    ],
    [
      "failsafe with an empty set demands the outsiders while the store answers",
      { members: [], attached: [], outsiders: 2 },
      {
        kind: "guard",
        minReplicas: 2,
        reason: "no replica in the replica set; 2 replicas outside the replica set must acknowledge too",
      },
    ],
    [
      "failsafe with an empty set still fences when cut off: an outsider cannot witness",
      { members: [], attached: [], outsiders: 2, msSinceHeartbeatWritten: 2000 },
      { kind: "fence" },
    ],
    [
      "failsafe keeps demanding members and outsiders while cut off from the store",
      { confirmed: undefined, msSinceHeartbeatWritten: 60_000, outsiders: 1 },
      { kind: "guard", minReplicas: 3 },
    ],
    ["policy fence serves while heartbeats are written", { policy: "fence" }, { kind: "open" }],
    [
      "policy fence fences after the fence timeout",
      { policy: "fence", msSinceHeartbeatWritten: 2000 },
      { kind: "fence" },
    ],
    [
      "policy keep-serving serves when cut off",
      { policy: "keep-serving", msSinceHeartbeatWritten: 60_000 },
      { kind: "open" },
    ],
  ] as const)("%s", (_name, overrides, expected) => {
    expect(planWriteGuard({ ...base, ...overrides })).toMatchObject(expected);
  });

  it("never lets a primary accept writes unless every member it last stored must acknowledge them", () => {
    const ids = fc.uniqueArray(fc.constantFrom("r1", "r2", "r3", "r4"), { maxLength: 4 });
    fc.assert(
      fc.property(
        fc.record({
          policy: fc.constant("failsafe" as const),
          members: ids,
          attached: ids,
          confirmed: fc.constantFrom(true, false, undefined),
          msSinceHeartbeatWritten: fc.nat(100_000),
          restarted: fc.boolean(),
          promotionWindowOpen: fc.boolean(),
        }),
        (input) => {
          const plan = planWriteGuard({ ...base, ...input });
          if (plan.kind === "guard") expect(plan.minReplicas).toBeGreaterThanOrEqual(input.members.length);
          expect(plan.kind === "open").toBe(false);
        },
      ),
    );
  });

  it("fences every policy whose topology does not confirm it", () => {
    for (const policy of FENCE_POLICIES) {
      expect(planWriteGuard({ ...base, policy, confirmed: false }).kind).toBe("fence");
    }
  });

  it.each([
    ["no count moved", { r1: 10, r2: 7 }, { r1: 10, r2: 7 }, []],
    ["one write may have been in flight: not a witness", { r1: 10, r2: 7 }, { r1: 11, r2: 8 }, []],
    ["two writes past the baseline", { r1: 10, r2: 7 }, { r1: 12, r2: 8 }, ["r1"]],
    ["a restarted agent's count went down", { r1: 10, r2: 7 }, { r1: 2, r2: 9 }, ["r2"]],
    ["a member never seen before has no baseline", { r1: 10 }, { r1: 10, r2: 50 }, []],
    ["a member no longer seen", { r1: 10, r2: 7 }, { r2: 9 }, ["r2"]],
  ] as const)("store witnesses: %s", (_name, before, after, expected) => {
    const members = ["r1", "r2"];
    expect(
      storeWitnessesOf(members, new Map(Object.entries(before)), new Map(Object.entries(after))),
    ).toEqual(expected);
  });

  it("a witness is a member whose count moved at least WITNESS_ADVANCE, whatever the counts", () => {
    fc.assert(
      fc.property(fc.nat(1000), fc.integer({ min: -1000, max: 1000 }), (before, delta) => {
        const witnesses = storeWitnessesOf(
          ["r1"],
          new Map([["r1", before]]),
          new Map([["r1", before + delta]]),
        );
        expect(witnesses.length === 1).toBe(delta >= WITNESS_ADVANCE);
      }),
    );
  });

  it("under failsafe, a cut-off primary fences only with a strict majority of members as witnesses", () => {
    const ids = fc.uniqueArray(fc.constantFrom("r1", "r2", "r3", "r4", "r5"), { minLength: 1, maxLength: 5 });
    fc.assert(
      fc.property(ids, ids, (members, witnesses) => {
        const plan = planWriteGuard({
          ...base,
          members,
          attached: members,
          msSinceHeartbeatWritten: 10_000,
          storeWitnesses: witnesses,
        });
        const counted = witnesses.filter((id) => members.includes(id)).length;
        expect(plan.kind === "fence").toBe(counted * 2 > members.length);
      }),
    );
  });

  it.each([
    [
      "members by their ids",
      [
        ["a1", "r1", true],
        ["a2", "r2", true],
      ],
      ["r1", "r2"],
      0,
    ],
    [
      "a replica without a known id is an outsider",
      [
        ["a1", "r1", true],
        ["a9", undefined, true],
      ],
      ["r1"],
      1,
    ],
    ["a known non-member is attached (it joins)", [["a3", "r3", true]], ["r3"], 0],
    ["an address mapped to this node's own id is an outsider", [["a0", "p1", true]], [], 1],
    [
      "a second address claiming the same id is an outsider",
      [
        ["a1", "r1", true],
        ["a8", "r1", true],
      ],
      ["r1"],
      1,
    ],
    [
      "a replica not acknowledging within the lag is neither",
      [
        ["a1", "r1", false],
        ["a9", undefined, false],
      ],
      [],
      0,
    ],
  ] as const)("classifies the replicas: %s", (_name, listed, attached, outsiders) => {
    const replicas: ListedReplica[] = listed.map(([address, nodeId, acknowledging]) => ({
      address,
      nodeId,
      acknowledging,
    }));
    expect(classifyReplicas(replicas, "p1")).toEqual({ attached, outsiders });
  });

  it("reaching the guard's count takes every member: no other acknowledging replica can stand in", () => {
    const replica = fc.record({
      nodeId: fc.constantFrom("r1", "r2", "r3", "p1", undefined),
      acknowledging: fc.boolean(),
    });
    fc.assert(
      fc.property(
        fc.array(replica, { maxLength: 6 }),
        fc.uniqueArray(fc.constantFrom("r1", "r2", "r3"), { maxLength: 3 }),
        (listed, members) => {
          const replicas = listed.map((entry, index) => ({ ...entry, address: `a${index}` }));
          const { attached, outsiders } = classifyReplicas(replicas, "p1");
          const plan = planWriteGuard({ ...base, members, attached, outsiders });
          if (plan.kind !== "guard") return;
          // Redis counts every acknowledging replica; the count is reached only if each counted
          // one that is not a member is matched by one more demanded beyond the members.
          const counted = replicas.filter((entry) => entry.acknowledging).length;
          const standingForMembers = attached.filter((id) =>
            (members as readonly string[]).includes(id),
          ).length;
          expect(plan.minReplicas - members.length).toBeGreaterThanOrEqual(counted - standingForMembers);
        },
      ),
    );
  });

  describe("the address map", () => {
    const NOW_MS = 1_000_000;
    const MAX_AGE_MS = 23_000;
    const claim = (node_id: string, node_address: string, ageMs: number) => ({
      node_id,
      node_address,
      written_us: (NOW_MS - ageMs) * 1000,
    });

    it.each([
      ["a fresh heartbeat names its address", [claim("r1", "a1", 1000)], [], { a1: "r1" }],
      [
        "the freshest heartbeat of a reused address wins, whatever the order read",
        [claim("r2", "a1", 1000), claim("r1", "a1", 5000)],
        [],
        { a1: "r2" },
      ],
      [
        "a node moved to a new address is known there only",
        [claim("r1", "a1", 9000), claim("r1", "a2", 1000)].reverse(),
        [],
        { a2: "r1" },
      ],
      [
        "a node at the address of an older heartbeat of another id takes it",
        [claim("r1", "a1", 9000), claim("r1", "a2", 1000), claim("r9", "a1", 500)],
        [],
        { a2: "r1", a1: "r9" },
      ],
      ["a heartbeat older than the max age names nothing", [claim("r1", "a1", MAX_AGE_MS + 1)], [], {}],
      [
        "an old heartbeat of a kept node (a member, the primary) still names its address",
        [claim("r1", "a1", 60_000)],
        ["r1"],
        { a1: "r1" },
      ],
      [
        "a kept node's older claim never beats a fresher claim of its address",
        [claim("r1", "a1", 60_000), claim("r2", "a1", 40_000)],
        ["r1"],
        {},
      ],
    ] as const)("%s", (_name, claims, kept, expected) => {
      // Act
      const map = nodeIdsByAddress(claims, NOW_MS, MAX_AGE_MS, (c) => kept.some((id) => id === c.node_id));

      // Assess
      expect(Object.fromEntries(map)).toEqual(expected);
    });
  });
});

/**
 * Nemesis seed 7381 (guarantee 1): node-42a's database clock stepped forward 9 s 0.25 s before its
 * agent lifted its promotion fence. Redis then reported node-9r's lag as 9 s until its next ACK, so
 * the guard lifted the fence with an empty replica set and min-replicas-to-write 0 while `WAIT 1`
 * still counted node-9r; node-9r, nobody's member, was not waited for and 14 writes were lost.
 */
describe("the agent's write guard across a forward step of its database's clock", () => {
  const T0 = 1_800_000_000_000;
  function primaryAgent(members: readonly string[]) {
    let now = 0;
    const ctx = new AgentContext({
      options: parseAgentOptions({ shard: "s1", redis: "127.0.0.1:6379", address: "n1:6379" }),
      nodeId: "n1",
      deps: { clock: { now: () => T0 + now }, monotonicNow: () => now } as Partial<AgentDeps> as AgentDeps,
      db: {} as Database,
      state: memoryState({ highest_epoch: 1 }),
      logger: new RecordingLogger(),
    });
    ctx.confirmed = true;
    ctx.topologyFresh = true;
    ctx.guardMembers = members;
    ctx.knownNodes.set("r1:6379", "r1");
    return {
      ctx,
      /** One INFO `ms` later, the server's clock `stepMs` ahead of real time, r1 `lag` seconds late. */
      plan(ms: number, serverMs: number, lag: number): WriteGuardPlan {
        now += ms;
        const info: ReplicationInfo = {
          role: "primary",
          offset: 100,
          replId: "a".repeat(40),
          primary: undefined,
          replicas: [{ address: "r1:6379", state: "online", offset: 100, lagSeconds: lag }],
          clock: { serverTimeMs: T0 + serverMs, sentAtMs: now - 2, receivedAtMs: now },
        };
        return currentPlan(ctx, info);
      },
    };
  }

  it("demands the acknowledging replica the step makes look late, instead of no replica", () => {
    const agent = primaryAgent([]);
    expect(agent.plan(0, 0, 0)).toMatchObject({ kind: "guard", minReplicas: 1, join: ["r1"] });
    agent.ctx.guardMembers = [];
    // The step: r1's lag reads 9 s until its next ACK.
    expect(agent.plan(300, 9300, 9)).toMatchObject({
      kind: "guard",
      minReplicas: 1,
      join: ["r1"],
      leave: [],
    });
  });

  it("keeps a member whose lag reads the step, and judges the lag again once the freeze is past", () => {
    const agent = primaryAgent(["r1"]);
    expect(agent.plan(0, 0, 0)).toMatchObject({ kind: "guard", minReplicas: 1, leave: [] });
    expect(agent.plan(300, 9300, 9)).toMatchObject({ kind: "guard", minReplicas: 1, leave: [] });
    expect(agent.plan(1000, 10_300, 9)).toMatchObject({ kind: "guard", minReplicas: 1, leave: [] });
    // Past the freeze a replica still late is late: it leaves as before.
    expect(agent.plan(PROMOTION_FENCE_WINDOW_MS, 14_800, 9)).toMatchObject({ kind: "guard", leave: ["r1"] });
  });
});
