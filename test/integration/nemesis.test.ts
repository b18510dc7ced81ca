import { describe, expect, it } from "vitest";
import { type FaultKind, scheduleFaults } from "../../src/nemesis/faults.ts";
import { runNemesis } from "../../src/nemesis/runner.ts";

/**
 * A short nemesis run in the suite: one minute of seeded, overlapping faults against a shard of real
 * processes, limited to the kinds today's code survives (the ones that find known holes, kill-redis,
 * pause-redis past repl-timeout and restart-agent without its state dir, run in `npm run nemesis`;
 * docs/chaos.md records which seed finds which). The checker must find the run valid.
 */
const SEED = 20_260_101;
const FAULTS: FaultKind[] = [
  "pause-agent",
  "pause-controller",
  "partition-agent-store",
  "partition-agent-sqs",
  "partition-controller-store",
  "clock-skew",
  "dup-commands",
  "delay-commands",
];

describe("nemesis", () => {
  it("a one-minute fixed-seed run of combined faults keeps every guarantee the checker checks", {
    timeout: 240_000,
  }, async () => {
    // Prepare
    const schedule = scheduleFaults(SEED, {
      minutes: 1,
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
      minutes: 1,
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
    expect(injected).toBeGreaterThanOrEqual(5);
    expect(report.writes.ackedByReplica).toBeGreaterThan(500);
    expect(report.writes.lost).toBe(0);
    expect(report.samples).toBeGreaterThan(100);
  });
});
