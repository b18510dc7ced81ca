import { type FaultKind, type ScheduledFault, scheduleFaults } from "../../src/dev/nemesis/faults.ts";
import { type NemesisReport, runNemesis } from "../../src/dev/nemesis/runner.ts";

/** A short fixed-seed nemesis run of the suite: its schedule, its report and its log for messages. */
export interface SuiteNemesisRun {
  readonly schedule: readonly ScheduledFault[];
  readonly report: NemesisReport;
  readonly lines: readonly string[];
  /** Every line the run printed and its wall time, for assertion messages. */
  readonly log: string;
}

/** Runs `minutes` of seed `seed` on 3 nodes with `faults`, settling within 45 s, logs removed. */
export async function runSuiteNemesis(options: {
  readonly seed: number;
  readonly minutes: number;
  readonly faults: FaultKind[];
  readonly schedule: { readonly gapMinMs: number; readonly gapMaxMs: number; readonly maxConcurrent: number };
  readonly busyWaitMs?: number;
  /** How long a fault skipped for want of a primary or a free target keeps trying (`--retry-skipped`). */
  readonly retrySkippedMs?: number;
}): Promise<SuiteNemesisRun> {
  const schedule = scheduleFaults(options.seed, {
    minutes: options.minutes,
    nodes: 3,
    faults: options.faults,
    lockLeaseMs: 5000,
    ...options.schedule,
  });
  const lines: string[] = [];
  const started = performance.now();
  const report = await runNemesis({
    seed: options.seed,
    minutes: options.minutes,
    faults: options.faults,
    schedule: options.schedule,
    settleTimeoutMs: 45_000,
    keepLogs: false,
    ...(options.busyWaitMs === undefined ? {} : { busyWaitMs: options.busyWaitMs }),
    ...(options.retrySkippedMs === undefined ? {} : { retrySkippedMs: options.retrySkippedMs }),
    onLine: (line) => lines.push(line),
  });
  const log = `${lines.join("\n")}\n(${Math.round((performance.now() - started) / 1000)} s)`;
  return { schedule, report, lines, log };
}
