import { describe, expect, it } from "vitest";
import type { ControllerDeps } from "../../src/controller/deps.ts";
import { leaseFor } from "../../src/controller/lock.ts";
import { aConfig } from "../support/builders.ts";

/** The lease never outlives what the invocation can renew. */
describe("leaseFor", () => {
  const deps = { config: aConfig({ lockLeaseMs: 60_000 }) } as ControllerDeps;

  it("is the configured lease when the invocation has more time (or no limit)", () => {
    expect(leaseFor(deps, () => Number.POSITIVE_INFINITY)).toBe(60_000);
    expect(leaseFor(deps, () => 75_000)).toBe(60_000);
  });

  it("is cut to the invocation's remaining time, so a timed-out invocation's lock expires with it", () => {
    expect(leaseFor(deps, () => 12_345.6)).toBe(12_345);
  });

  it("keeps a floor of one second for the last calls of an invocation", () => {
    expect(leaseFor(deps, () => 10)).toBe(1000);
    expect(leaseFor(deps, () => -5)).toBe(1000);
  });
});
