import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Command } from "commander";
import { parseIntegerOption } from "../src/cli/options.ts";
import { LocalCluster } from "../src/dev/local-cluster.ts";
import { WriteWorkload } from "../src/dev/workload/writer.ts";
import { loadAverage, machineInfo } from "./lib/report.ts";
import { type RollingResult, rollingRestart } from "./lib/rolling.ts";

/**
 * `npm run bench:rolling`: a rolling restart of all three nodes of a shard (docs/runbook.md: drain,
 * restart, undrain; the primary last, its drain a switchover), `--runs` times on one shard, under a
 * steady `WAIT 1` writer with the default timings. Reports per run the longest write gap of each step
 * and the total, checks that no acknowledged write was lost, and writes bench/results/rolling.json.
 */

const log = (line: string) => process.stderr.write(`${line}\n`);
const median = (values: readonly number[]) =>
  [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? 0;

const program = new Command("bench:rolling")
  .description("rolling restart of a 3-node shard under a WAIT 1 writer: per-step longest write gap, 0 lost")
  .option("--runs <n>", "rolling restarts, one after the other", parseIntegerOption(1, 100), 5)
  .option("--out <dir>", "where rolling.json goes", "bench/results")
  .action(async (options: { runs: number; out: string }) => {
    const loadAtStart = loadAverage();
    const cluster = await LocalCluster.start({ readyTimeoutMs: 120_000, onProgress: log });
    const writer = new WriteWorkload({ resolvePrimary: () => cluster.primaryAddress(), waitReplicas: 1 });
    try {
      writer.start();
      await cluster.waitFor("acknowledged writes", () => writer.stats().acked > 50, 30_000);
      const runs: RollingResult[] = [];
      for (let run = 1; run <= options.runs; run++) {
        log(`run ${run}/${options.runs}`);
        runs.push(await rollingRestart(cluster, writer, { log }));
      }
      await writer.stop();
      const primary = (await cluster.topology())?.primary_node_id as string;
      const client = cluster.node(primary).client();
      const verified = await writer.verify(client);
      client.disconnect();
      const replicaGaps = runs.flatMap((run) =>
        run.steps.filter((step) => !step.wasPrimary).map((s) => s.longestGapMs),
      );
      const primaryGaps = runs.flatMap((run) =>
        run.steps.filter((step) => step.wasPrimary).map((s) => s.longestGapMs),
      );
      const report = {
        generatedAt: new Date().toISOString(),
        machine: machineInfo(),
        loadAverage: { start: loadAtStart, end: loadAverage() },
        runs: options.runs,
        writer: "SET then WAIT 1 (acknowledged when a replica confirmed), default timings",
        acknowledged: verified.checked,
        lost: verified.lost.length,
        medians: {
          replicaStepLongestGapMs: median(replicaGaps),
          primaryStepLongestGapMs: median(primaryGaps),
          totalMs: median(runs.map((run) => run.totalMs)),
          unavailableMs: median(runs.map((run) => run.unavailableMs)),
        },
        max: {
          replicaStepLongestGapMs: Math.max(...replicaGaps),
          primaryStepLongestGapMs: Math.max(...primaryGaps),
        },
        results: runs,
      };
      mkdirSync(options.out, { recursive: true });
      const file = join(options.out, "rolling.json");
      writeFileSync(file, `${JSON.stringify(report, null, 2)}\n`);
      process.stdout.write(
        `rolling restart x${options.runs}: longest gap median per replica step ${report.medians.replicaStepLongestGapMs} ms ` +
          `(max ${report.max.replicaStepLongestGapMs}), per primary step ${report.medians.primaryStepLongestGapMs} ms ` +
          `(max ${report.max.primaryStepLongestGapMs}); ${verified.checked} acknowledged writes, ${verified.lost.length} lost; wrote ${file}\n`,
      );
      if (verified.lost.length > 0) process.exitCode = 1;
    } finally {
      await writer.stop();
      await cluster.stop();
    }
  });

await program.parseAsync();
