/**
 * `npm run bench:scale -- --shards 100,1000,5000`: how long one full controller pass takes over a
 * fleet, how many requests it sends, and how much memory the controller needs. The controller is
 * the real ControllerLoop (src/controller/*) in its own process (bench/lib/scale-controller.ts,
 * bundled with esbuild as the CDK bundles the Lambda) against DynamoDB Local; the shards are simulated: each has a registered index entry, a topology,
 * a replica set and three heartbeat items (primary + 2 replicas, no redis); the primaries'
 * heartbeats are rewritten through the store's own heartbeat put just before every pass so the
 * controller sees a fresh, healthy fleet (the decision codes are reported, so it shows when not).
 * Partitions (--partitions 1,5) run the same fleet split by consistent hashing over K controller
 * processes: each partition's pass is measured alone (one Lambda per partition has its own CPU)
 * and all K at once (what this 2-core machine gives when they share it).
 *
 *   npm run bench:scale -- [--shards 100,1000,5000] [--partitions 1,5] [--passes 5] [--concurrency 32]
 *                          [--heap-mb 96] [--json] [--out FILE]
 */
import { type ChildProcess, fork } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { build } from "esbuild";
import pLimit from "p-limit";
import { CONTROLLER_BUNDLE_OPTIONS } from "../cdk/controller-props.ts";
import { createAwsAdapters } from "../src/adapters/aws-adapters.ts";
import { ENV } from "../src/adapters/env.ts";
import type { Partition } from "../src/core/partition.ts";
import { LOCAL_CREDENTIALS } from "../src/dev/local-stack/credentials.ts";
import { startLocalStack } from "../src/dev/local-stack/stack.ts";
import { ensureTable } from "../src/dev/local-stack/table.ts";
import { DYNAMO_LATENCY_MS, fitCpu, PASS_BUDGET_FRACTION, sizeController } from "./lib/lambda-sizing.ts";
import { loadPrices } from "./lib/pricing.ts";
import type { PassReport, PassRequest } from "./lib/scale-controller.ts";
import { median } from "./lib/stats.ts";

const { values } = parseArgs({
  options: {
    shards: { type: "string", default: "100,1000,5000" },
    partitions: { type: "string", default: "1,5" },
    passes: { type: "string", default: "5" },
    concurrency: { type: "string", default: "32" },
    /** V8 old-space limit of each controller process in MB (Lambda's small sizes cap the heap). */
    "heap-mb": { type: "string" },
    json: { type: "boolean", default: false },
    out: { type: "string" },
    /** Only the Lambda sizing, from earlier runs' JSON (comma-separated; written into the first). */
    from: { type: "string" },
    /** Billed seconds of one scheduled invocation, for the sizing's cost. */
    "run-seconds": { type: "string", default: "72" },
  },
});
const sizes = values.shards.split(",").map(Number);
const partitionCounts = values.partitions.split(",").map(Number);
const passes = Number(values.passes);
const concurrency = Number(values.concurrency);
const progress = (line: string) => {
  if (!values.json) process.stderr.write(`[scale] ${line}\n`);
};
const SOURCE = fileURLToPath(new URL("./lib/scale-controller.ts", import.meta.url));

const NODES = ["n1", "n2", "n3"];
/** Below MAX_CLOCK_SKEW_MS (2.5 s): decide() takes such a heartbeat as fresh, not future-dated. */
const HEARTBEAT_LEAD_MS = 1500;

/**
 * The controller Lambda sizing for 1, 100, 1,000, 5,000 and 10,000 shards, modeled from the
 * measured CPU per pass and memory (bench/lib/lambda-sizing.ts).
 */
function sizing(rows: readonly Row[]) {
  const alone = rows.filter((row) => row.mode === "alone");
  const points = alone.map((row) => ({ shards: row.shards / row.partitions, cpuMs: row.cpuMsMedian }));
  // The slope from every pass; the fixed part from the smallest fleet measured (a straight line
  // through thousands of shards says little about one).
  const smallest = points.reduce((a, b) => (b.shards < a.shards ? b : a));
  const cpu = { fixedMs: smallest.cpuMs, perShardMs: fitCpu(points).perShardMs };
  // Memory: the smallest controller's resident size (code, runtime, SDK), plus twice the live
  // heap the shards add (V8 needs room to collect): RSS after a pass overstates it, V8 grows its
  // heap lazily when nothing limits it.
  const baseRss = Math.min(...alone.map((row) => row.rssMb));
  const heap = fitCpu(alone.map((row) => ({ shards: row.shards / row.partitions, cpuMs: row.heapUsedMb })));
  const rss = { fixedMs: baseRss, perShardMs: 2 * Math.max(0, heap.perShardMs) };
  const prices = loadPrices();
  const table = [1, 100, 1000, 5000, 10_000].map((shards) =>
    sizeController({
      shards,
      cpu,
      rssMb: (perPartition) => rss.fixedMs + rss.perShardMs * perPartition,
      tickMs: 1000,
      concurrency,
      runSeconds: Number(values["run-seconds"]),
      prices,
    }),
  );
  return {
    model: `CPU per pass ${cpu.fixedMs.toFixed(1)} ms (smallest fleet) + ${cpu.perShardMs.toFixed(3)} ms per shard (fit over ${points.length} measured rows); memory ${rss.fixedMs.toFixed(0)} MB (smallest RSS) + ${(rss.perShardMs * 1000).toFixed(1)} MB per 1,000 shards (twice the live heap's growth) + 15%; Lambda CPU = memory / 1,769 MB; ${DYNAMO_LATENCY_MS} ms per DynamoDB round trip; pass <= ${PASS_BUDGET_FRACTION * 1000} ms of the 1 s tick; ${values["run-seconds"]} s billed per one-minute invocation`,
    table,
  };
}

function printSizing(result: ReturnType<typeof sizing>): void {
  console.log(`\ncontroller Lambda sizing (model): ${result.model}`);
  console.log("shards  partitions  memory MB  modeled pass  Lambda $/month");
  for (const row of result.table) {
    if (!row) continue;
    console.log(
      `${String(row.shards).padStart(6)} ${String(row.partitions).padStart(11)} ${String(row.memoryMb).padStart(10)} ` +
        `${String(row.modeledPassMs).padStart(10)} ms ${row.lambdaMonthly.toFixed(2).padStart(15)}`,
    );
  }
}

if (values.from) {
  // Several runs' rows together (comma-separated files); the sizing is written into the first.
  const files = values.from.split(",");
  const runs = files.map(
    (file) => JSON.parse(readFileSync(file, "utf8")) as { rows: Row[]; lambdaSizing?: unknown },
  );
  const [first] = runs;
  if (!first) throw new Error("--from: no file");
  first.lambdaSizing = { from: files, ...sizing(runs.flatMap((run) => run.rows)) };
  writeFileSync(files[0] as string, `${JSON.stringify(first, null, 2)}\n`);
  printSizing(first.lambdaSizing as ReturnType<typeof sizing>);
  process.exit(0);
}

// Bundled and minified the way the CDK bundles the controller Lambda (SDK included), so the memory
// measured is that of the deployed code, not of Node type-stripping every source file.
const bundleDir = mkdtempSync(join(tmpdir(), "shardguard-scale-"));
const CHILD = join(bundleDir, "scale-controller.mjs");
await build({
  entryPoints: [SOURCE],
  outfile: CHILD,
  bundle: true,
  platform: "node",
  format: "esm",
  minify: true,
  target: CONTROLLER_BUNDLE_OPTIONS.target,
  mainFields: [...CONTROLLER_BUNDLE_OPTIONS.mainFields],
  banner: { js: CONTROLLER_BUNDLE_OPTIONS.banner },
  logLevel: "error",
});

const stack = await startLocalStack({ onProgress: progress });
const admin = new DynamoDBClient({
  endpoint: stack.env.AWS_ENDPOINT_URL_DYNAMODB,
  region: stack.env.AWS_REGION,
  credentials: LOCAL_CREDENTIALS,
});

interface Row {
  shards: number;
  partitions: number;
  mode: "alone" | "together";
  passes: number;
  /** Median over passes of the slowest partition's pass. */
  passMsMedian: number;
  passMsMax: number;
  cpuMsMedian: number;
  requestsPerPass: number;
  requestsByOperation: Record<string, number>;
  /** Per controller process after the passes. */
  rssMb: number;
  maxRssMb: number;
  heapUsedMb: number;
  /** Decision codes of the last pass (all `healthy` when the fleet was fresh throughout). */
  codes: Record<string, number>;
  /** Time to rewrite every heartbeat before a pass (not part of the pass). */
  refreshMsMedian: number;
  /** 1-minute load average when the row finished (the machine is shared). */
  loadAverage: number;
}

/** A controller process on `table`; resolves once it is ready for passes. */
async function startController(table: string): Promise<ChildProcess> {
  const child = fork(CHILD, [], {
    env: {
      ...process.env,
      ...stack.env,
      [ENV.table]: table,
    },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    execArgv: values["heap-mb"] ? [`--max-old-space-size=${values["heap-mb"]}`] : [],
  });
  await new Promise<void>((resolve, reject) => {
    child.once("message", () => resolve());
    child.once("exit", (code) => reject(new Error(`scale controller exited with ${code}`)));
  });
  return child;
}

function pass(child: ChildProcess, request: PassRequest): Promise<PassReport> {
  return new Promise((resolve) => {
    child.once("message", (report) => resolve(report as PassReport));
    child.send(request);
  });
}

async function stopController(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.send("stop");
  const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
  await exited;
  clearTimeout(timer);
}

/**
 * Seeding and refreshing on a loaded machine: a write that timed out is tried again (all of them
 * are idempotent: the topology write is conditional on absence and its lost race is `false`).
 */
async function retried<T>(write: () => Promise<T>, attempts = 5): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await write();
    } catch (error) {
      if (attempt >= attempts) throw error;
    }
  }
}

const rows: Row[] = [];
const children = new Set<ChildProcess>();
try {
  for (const size of sizes) {
    const table = `scale-${size}`;
    await ensureTable(admin, table);
    const aws = createAwsAdapters({
      env: { ...process.env, ...stack.env },
      tableName: table,
      maxAttempts: 5,
    });
    const shards = Array.from({ length: size }, (_, i) => `s${String(i).padStart(5, "0")}`);
    const limit = pLimit(16);
    progress(`${size} shards: registering, topology and replica sets`);
    await Promise.all(
      shards.map((shard) =>
        limit(() =>
          retried(async () => {
            await aws.store.shards.register(shard);
            await aws.store.topology.compareAndSet(shard, undefined, {
              shard,
              epoch: 1,
              primary_node_id: "n1",
              primary_address: `${shard}-n1:6379`,
              status: "online",
              updated_at: aws.clock.now(),
            });
            await aws.store.replicaSets.add(shard, "n1", ["n2", "n3"]);
          }),
        ),
      ),
    );
    let offset = 0;
    const heartbeat = (shard: string, node: string, stamp: number) =>
      retried(() =>
        aws.store.heartbeats.put({
          shard,
          node_id: node,
          node_address: `${shard}-${node}:6379`,
          role: node === "n1" ? "primary" : "replica",
          primary_node_id: "n1",
          last_updated: stamp * 1000,
          agent_updated: stamp,
          last_txn_id: 1_000_000 + offset,
          repl_id: `lineage-${shard}`,
          primary_link: node === "n1" ? undefined : "up",
          db_status: "up",
          epoch: 1,
          priority: 100,
        }),
      );
    progress(`${size} shards: ${size * NODES.length} heartbeat items`);
    await Promise.all(
      shards.flatMap((shard) => NODES.map((node) => limit(() => heartbeat(shard, node, aws.clock.now())))),
    );
    /**
     * Rewrites every primary's heartbeat, as its agent would, in the order the controller reads
     * the shards, dated HEARTBEAT_LEAD_MS ahead (within the clock-skew bound that decide()
     * accepts) so a fleet of thousands, rewritten on a loaded 2-core machine, is still fresh when
     * the pass reads it. The replicas' items stay as written: a fresh primary is what a healthy
     * decision needs. Says how long the rewrite took.
     */
    const refresh = async (): Promise<number> => {
      const started = performance.now();
      offset += 1;
      await Promise.all(
        shards.map((shard) => limit(() => heartbeat(shard, "n1", aws.clock.now() + HEARTBEAT_LEAD_MS))),
      );
      return performance.now() - started;
    };

    for (const count of partitionCounts) {
      for (const mode of count === 1 ? (["alone"] as const) : (["alone", "together"] as const)) {
        const partitions: Array<Partition | undefined> =
          count === 1 ? [undefined] : Array.from({ length: count }, (_, index) => ({ index, count }));
        const controllers: ChildProcess[] = [];
        for (const _ of partitions) {
          const child = await startController(table);
          children.add(child);
          controllers.push(child);
        }
        const passMs: number[] = [];
        const cpuMs: number[] = [];
        const refreshMs: number[] = [];
        let requests: Record<string, number> = {};
        let last: PassReport[] = [];
        // One warm-up pass (first-pass log lines, connection set-up), then the measured passes.
        for (let round = 0; round <= passes; round++) {
          refreshMs.push(await refresh());
          let reports: PassReport[] = [];
          if (mode === "together") {
            reports = await Promise.all(
              controllers.map((child, i) => pass(child, { partition: partitions[i], concurrency })),
            );
          } else {
            for (const [i, child] of controllers.entries()) {
              if (i > 0) refreshMs.push(await refresh());
              reports.push(await pass(child, { partition: partitions[i], concurrency }));
            }
          }
          if (round === 0) continue;
          passMs.push(Math.max(...reports.map((report) => report.wallMs)));
          cpuMs.push(Math.max(...reports.map((report) => report.cpuMs)));
          requests = {};
          for (const report of reports)
            for (const [op, n] of Object.entries(report.requests)) requests[op] = (requests[op] ?? 0) + n;
          last = reports;
        }
        const codes: Record<string, number> = {};
        for (const report of last)
          for (const [code, n] of Object.entries(report.codes)) codes[code] = (codes[code] ?? 0) + n;
        const row: Row = {
          shards: size,
          partitions: count,
          mode,
          passes,
          passMsMedian: Math.round(median(passMs)),
          passMsMax: Math.max(...passMs),
          cpuMsMedian: Math.round(median(cpuMs)),
          requestsPerPass: Object.values(requests).reduce((sum, n) => sum + n, 0),
          requestsByOperation: requests,
          rssMb: Math.max(...last.map((report) => report.rssMb)),
          maxRssMb: Math.max(...last.map((report) => report.maxRssMb)),
          heapUsedMb: Math.max(...last.map((report) => report.heapUsedMb)),
          codes,
          refreshMsMedian: Math.round(median(refreshMs)),
          loadAverage: Math.round((loadavg()[0] ?? 0) * 10) / 10,
        };
        rows.push(row);
        progress(
          `${size} shards, ${count} partition(s) ${mode}: pass ${row.passMsMedian} ms median (max ${row.passMsMax}), ` +
            `cpu ${row.cpuMsMedian} ms, ${row.requestsPerPass} requests, rss ${row.rssMb} MB (peak ${row.maxRssMb}), ` +
            `decisions ${JSON.stringify(codes)}, load ${row.loadAverage}`,
        );
        for (const child of controllers) {
          await stopController(child);
          children.delete(child);
        }
      }
    }
    aws.destroy();
  }
  const result = {
    bench: "scale",
    at: new Date().toISOString(),
    machine: { cpus: cpus().length, model: cpus()[0]?.model, loadAverageAtEnd: loadavg() },
    setup: {
      passes,
      concurrency,
      heapLimitMb: values["heap-mb"] ? Number(values["heap-mb"]) : undefined,
      nodesPerShard: NODES.length,
      store: "DynamoDB Local (in memory)",
    },
    rows,
    lambdaSizing: sizing(rows),
  };
  const out =
    values.out ?? fileURLToPath(new URL(`./results/scale-${sizes.join("-")}.json`, import.meta.url));
  writeFileSync(out, `${JSON.stringify(result, null, 2)}\n`);
  if (values.json) console.log(JSON.stringify(result));
  else {
    console.log("shards  K  mode      pass median  pass max  cpu/pass  requests/pass  rss MB  peak rss MB");
    for (const row of rows)
      console.log(
        `${String(row.shards).padStart(6)} ${String(row.partitions).padStart(2)}  ${row.mode.padEnd(8)} ` +
          `${String(row.passMsMedian).padStart(8)} ms ${String(row.passMsMax).padStart(6)} ms ` +
          `${String(row.cpuMsMedian).padStart(6)} ms ${String(row.requestsPerPass).padStart(13)} ` +
          `${String(row.rssMb).padStart(7)} ${String(row.maxRssMb).padStart(11)}`,
      );
    printSizing(result.lambdaSizing);
    console.log(`\nwritten to ${out}`);
  }
} finally {
  for (const child of children) child.kill("SIGKILL");
  admin.destroy();
  await stack.stop();
  rmSync(bundleDir, { recursive: true, force: true });
}
