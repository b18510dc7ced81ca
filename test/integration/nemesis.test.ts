import { describe, expect, it } from "vitest";
import { FAULT_KINDS, type FaultKind, scheduleFaults } from "../../src/dev/nemesis/faults.ts";
import { runNemesis } from "../../src/dev/nemesis/runner.ts";

/**
 * A short nemesis run in the suite: two minutes of seeded, overlapping faults of every kind against
 * a shard of real processes (the 30-minute runs are `npm run nemesis`, recorded in docs/chaos.md).
 * The checker must find the run valid.
 */
const SEED = 20_261_123;
const MINUTES = 2;
const FAULTS: FaultKind[] = [...FAULT_KINDS];

describe("nemesis", () => {
  it("a two-minute fixed-seed run of combined faults of every kind keeps every guarantee the checker checks", {
    timeout: 420_000,
  }, async () => {
    // Prepare
    const schedule = scheduleFaults(SEED, {
      minutes: MINUTES,
      nodes: 3,
      faults: FAULTS,
      lockLeaseMs: 5000,
      gapMinMs: 3000,
      gapMaxMs: 6000,
    });
    const lines: string[] = [];

    // Act
    const report = await runNemesis({
      seed: SEED,
      minutes: MINUTES,
      faults: FAULTS,
      schedule: { gapMinMs: 3000, gapMaxMs: 6000 },
      settleTimeoutMs: 45_000,
      keepLogs: false,
      onLine: (line) => lines.push(line),
    });

    // Assess
    const injected = Object.values(report.faultsByKind).reduce((sum, kind) => sum + kind.injected, 0);
    expect(report.violations, `${lines.join("\n")}\nviolations`).toEqual([]);
    expect(report.valid).toBe(true);
    expect(report.settled).toBe(true);
    expect(injected + Object.values(report.faultsByKind).reduce((sum, kind) => sum + kind.skipped, 0)).toBe(
      schedule.length,
    );
    expect(injected).toBeGreaterThanOrEqual(10);
    expect(report.writes.ackedByReplica).toBeGreaterThan(500);
    expect(report.writes.lost).toBe(0);
    expect(report.samples).toBeGreaterThan(100);
  });
});
