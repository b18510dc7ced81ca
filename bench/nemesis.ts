import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Command, InvalidArgumentError } from "commander";
import { parseIntegerOption } from "../src/cli/options.ts";
import { abortOnSignal } from "../src/cli/signals.ts";
import { errorMessage } from "../src/core/errors.ts";
import { FAULT_KINDS, parseFaultKinds } from "../src/dev/nemesis/faults.ts";
import { formatReport, formatTimeline, runNemesis, writeNemesisReport } from "../src/dev/nemesis/runner.ts";

/**
 * `npm run nemesis -- --minutes N --seed S [--faults a,b,c] [--nodes 3]`: randomized, combined faults
 * against one shard of real processes, a write workload recording a history, and a checker that
 * reads the history and the final state of every node (docs/chaos.md, "Nemesis"). Exit code 1 on
 * any violation or an unknown verdict, with the seed and the fault timeline.
 */

const log = (line: string) => process.stderr.write(`${line}\n`);
const RESULTS = fileURLToPath(new URL("./results/", import.meta.url));

interface CliOptions {
  minutes: number;
  seed: number;
  faults?: string;
  nodes: number;
  fenceWindow: number;
  gap: { min: number; max: number };
  maxConcurrent: number;
  retrySkipped: number;
  makeUp: number;
  out?: string;
  json?: boolean;
}

/** "3000-7000" -> { min: 3000, max: 7000 } (ms, 100 <= min <= max <= 10 min). */
export function parseGap(text: string): { min: number; max: number } {
  const match = /^(\d+)-(\d+)$/.exec(text.trim());
  const min = Number(match?.[1]);
  const max = Number(match?.[2]);
  if (!match || min < 100 || max < min || max > 600_000) {
    throw new InvalidArgumentError(
      `expected <min>-<max> in ms with 100 <= min <= max <= 600000, got "${text}"`,
    );
  }
  return { min, max };
}

export function buildProgram(): Command {
  return new Command()
    .name("nemesis")
    .description("randomized faults against a local shard, with a history checker")
    .option("--minutes <n>", "how long to inject faults", parseIntegerOption(1, 24 * 60), 5)
    .option("--seed <n>", "seed of the fault schedule", parseIntegerOption(0, 2 ** 31), 1)
    .option("--faults <kinds>", `comma-separated fault kinds (default: all of ${FAULT_KINDS.join(", ")})`)
    .option("--nodes <n>", "redis-server nodes", parseIntegerOption(2, 7), 3)
    .option(
      "--fence-window <ms>",
      "tolerated two-writable time after a change of epoch or primary (docs/agent.md: 3000)",
      parseIntegerOption(0, 600_000),
      3000,
    )
    .option(
      "--gap <min-max>",
      "pause between two fault starts in ms, drawn uniformly (a 30-minute run with every kind: 3000-7000)",
      parseGap,
      { min: 4000, max: 10_000 },
    )
    .option("--max-concurrent <n>", "faults active at once", parseIntegerOption(1, 6), 2)
    .option(
      "--retry-skipped <ms>",
      "try a fault that would be skipped (no primary, the copies rule, busy targets) again every 500 ms for this long (0: skip at once, as the recorded runs did)",
      parseIntegerOption(0, 600_000),
      0,
    )
    .option(
      "--make-up <n>",
      "once a kind was injected n times, its later slots go to skipped faults of kinds injected fewer times (0: none; the issue-29 runs use 10)",
      parseIntegerOption(0, 1000),
      0,
    )
    .option("--out <file>", "report path (default bench/results/nemesis-<seed>.json)")
    .option("--json", "print the report as JSON on stdout")
    .action(async (options: CliOptions) => {
      const faults = options.faults ? parseFaultKinds(options.faults) : undefined;
      const abort = abortOnSignal();
      abort.signal.addEventListener("abort", () => process.once("SIGINT", () => process.exit(130)));
      const report = await runNemesis({
        seed: options.seed,
        minutes: options.minutes,
        nodes: options.nodes,
        faults,
        fenceWindowMs: options.fenceWindow,
        schedule: {
          gapMinMs: options.gap.min,
          gapMaxMs: options.gap.max,
          maxConcurrent: options.maxConcurrent,
        },
        retrySkippedMs: options.retrySkipped,
        makeUpQuota: options.makeUp,
        signal: abort.signal,
        onLine: (line) => log(`[nemesis] ${line}`),
      });
      const out = options.out ?? join(RESULTS, `nemesis-${options.seed}.json`);
      writeNemesisReport(report, out);
      process.stdout.write(`${options.json ? JSON.stringify(report, null, 2) : formatReport(report)}\n`);
      log(`report: ${out}`);
      if (report.valid !== true) {
        log(`\nseed ${report.seed} FAILED (${report.valid === false ? "violations" : "unknown verdict"}):`);
        for (const violation of report.violations) log(`  ${violation}`);
        log(formatTimeline(report));
        process.exitCode = 1;
      }
    });
}

if (import.meta.main) {
  try {
    await buildProgram().parseAsync(process.argv);
  } catch (error) {
    log(`nemesis: ${errorMessage(error)}`);
    process.exitCode = 1;
  }
}
