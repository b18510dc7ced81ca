import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { FENCE_POLICIES, planWriteGuard, type WriteGuardInput } from "../../src/core/write-guard.ts";

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
});
