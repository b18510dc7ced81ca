import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  FENCE_POLICIES,
  planWriteGuard,
  storeWitnessesOf,
  WITNESS_ADVANCE,
  type WriteGuardInput,
} from "../../src/core/write-guard.ts";

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
});
