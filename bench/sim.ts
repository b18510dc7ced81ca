import { mkdirSync, writeFileSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { simulate } from "../src/dev/sim/world.ts";

/**
 * `npm run bench:sim [-- --seconds 60 --minutes 10 --writes-per-second 25]`: the simulator's
 * throughput on one core: seeds of one 3-node shard under faults (every fault kind of
 * src/dev/sim/world.ts, the workload at `--writes-per-second`), run back to back in this one
 * process until `--seconds` of wall time have passed; reports simulated shard-minutes per wall
 * minute and writes bench/results/sim-throughput.json.
 */

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "60" },
    minutes: { type: "string", default: "10" },
    "writes-per-second": { type: "string", default: "25" },
    seed: { type: "string", default: "5000" },
    out: { type: "string", default: "bench/results/sim-throughput.json" },
  },
});
const budgetMs = Number(values.seconds) * 1000;
const minutes = Number(values.minutes);
const writesPerSecond = Number(values["writes-per-second"]);
const started = process.hrtime.bigint();
const elapsedMs = () => Number((process.hrtime.bigint() - started) / 1_000_000n);
const loadBefore = loadavg()[0] ?? 0;
const runs: Array<{
  seed: number;
  valid: unknown;
  simulatedMs: number;
  wallMs: number;
  cpuMs: number;
  writes: number;
  faults: number;
}> = [];
const cpuStarted = process.cpuUsage();
let seed = Number(values.seed);
while (elapsedMs() < budgetMs) {
  const result = await simulate({ seed, minutes, writesPerSecond });
  runs.push({
    seed,
    valid: result.valid,
    simulatedMs: result.simulatedMs,
    wallMs: result.wallMs,
    cpuMs: result.cpuMs,
    writes: result.writes,
    faults: result.faults,
  });
  console.log(
    `seed ${seed}: ${result.valid === true ? "valid" : "INVALID"}, ${(result.simulatedMs / 60_000).toFixed(1)} simulated min in ${(result.wallMs / 1000).toFixed(1)} s`,
  );
  seed++;
}
const wallMs = elapsedMs();
const cpuMs = process.cpuUsage(cpuStarted).user / 1000;
const simulatedMs = runs.reduce((sum, run) => sum + run.simulatedMs, 0);
const simulatedSeconds = simulatedMs / 1000;
const report = {
  command: `npm run bench:sim -- --seconds ${values.seconds} --minutes ${minutes} --writes-per-second ${writesPerSecond}`,
  date: new Date().toISOString(),
  cpu: cpus()[0]?.model,
  cores: cpus().length,
  loadAverageBefore: loadBefore,
  loadAverageAfter: loadavg()[0],
  shard:
    "3 nodes (redis-server model + real agent each), real controller loop, DynamoDB/SQS models under the real adapters",
  faults: "every kind in src/dev/sim/world.ts FAULT_KINDS, one at a time, 2-30 s each, 5-25 s apart",
  writesPerSimulatedSecond: runs.reduce((sum, run) => sum + run.writes, 0) / simulatedSeconds,
  seeds: runs.length,
  invalid: runs.filter((run) => run.valid !== true).length,
  simulatedShardMinutes: simulatedMs / 60_000,
  wallMinutes: wallMs / 60_000,
  simulatedShardMinutesPerWallMinute: Math.round(simulatedMs / wallMs),
  cpuMinutes: cpuMs / 60_000,
  /** The same per minute of this process's own CPU time: what one free core would do. */
  simulatedShardMinutesPerCpuMinute: Math.round(simulatedMs / cpuMs),
  runs,
};
mkdirSync(join(values.out as string, ".."), { recursive: true });
writeFileSync(values.out as string, `${JSON.stringify(report, null, 2)}\n`);
console.log(
  `${report.simulatedShardMinutes.toFixed(1)} simulated shard-minutes in ${(wallMs / 1000).toFixed(1)} s: ` +
    `${report.simulatedShardMinutesPerWallMinute} simulated shard-minutes per wall minute, ` +
    `${report.simulatedShardMinutesPerCpuMinute} per CPU minute ` +
    `(${report.writesPerSimulatedSecond.toFixed(1)} writes per simulated second, load ${loadBefore.toFixed(1)}); ${values.out}`,
);
