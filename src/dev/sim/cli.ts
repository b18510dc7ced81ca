import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { codeVersion } from "../code-version.ts";
import { ALL_FAULT_KINDS, type FaultKind, type SimOptions, type SimResult, simulate } from "./world.ts";

/**
 * `npm run sim -- --seeds N [--minutes M] [--seed S]`: runs seeds S, S+1, ... S+N-1 (S defaults
 * to 1), each M simulated minutes of faults plus a settle period, one progress line per seed;
 * writes bench/results/sim-<S>-<N>.json; for a failing seed prints the command that replays it and
 * the tail of its event trace, and writes the whole trace beside the results. `--faults a,b,b`
 * draws only those kinds (a repeated kind weighs more; `all` adds the kinds the default leaves out),
 * `--overlap` lets faults overlap.
 */

const USAGE = `usage: npm run sim -- [--seeds N] [--seed S] [--minutes M] [--writes-per-second W]
                      [--faults KIND,KIND,...] [--overlap] [--trace] [--agent-log LEVEL]
                      [--out DIR]

  --seeds N              how many seeds to run, S to S+N-1 (default 1)
  --seed S               the first seed (default 1)
  --minutes M            simulated minutes of faults per seed, plus a settle period (default 5)
  --writes-per-second W  the workload's writes per simulated second (default 25)
  --faults LIST          draw only these kinds (a repeated kind weighs more; "all" adds the kinds
                         the default leaves out): ${ALL_FAULT_KINDS.join(", ")}
  --overlap              let faults overlap
  --trace                write every seed's trace, not only a failing one's
  --agent-log LEVEL      the agents' lowest log level in the trace: warn (default), info, debug
  --out DIR              where the report and traces go (default bench/results)

A failing seed prints the command that replays it and the tail of its trace (docs/simulation.md).`;

function parse() {
  let parsed: ReturnType<typeof parseOptions>;
  try {
    parsed = parseOptions();
  } catch (error) {
    console.error(`${error instanceof Error ? error.message : String(error)}\n\n${USAGE}`);
    process.exit(2);
  }
  if (parsed.values.help === true) {
    console.log(USAGE);
    process.exit(0);
  }
  return parsed;
}

function parseOptions() {
  return parseArgs({
    options: {
      help: { type: "boolean", short: "h", default: false },
      seeds: { type: "string", default: "1" },
      seed: { type: "string", default: "1" },
      minutes: { type: "string", default: "5" },
      "writes-per-second": { type: "string", default: "25" },
      out: { type: "string", default: "bench/results" },
      trace: { type: "boolean", default: false },
      faults: { type: "string" },
      overlap: { type: "boolean", default: false },
      "agent-log": { type: "string", default: "warn" },
    },
  });
}

function parseRun() {
  const { values } = parse();
  const faultKinds = values.faults?.split(",").flatMap((kind): FaultKind[] => {
    if (kind === "all") return [...ALL_FAULT_KINDS];
    if (!(ALL_FAULT_KINDS as readonly string[]).includes(kind))
      throw new Error(`--faults: unknown kind ${kind} (one of all, ${ALL_FAULT_KINDS.join(", ")})`);
    return [kind as FaultKind];
  });
  const number = (name: string, value: string | undefined) => {
    const parsed = Number(value);
    if (!Number.isFinite(parsed) || parsed <= 0)
      throw new Error(`--${name} must be a positive number, got ${value}`);
    return parsed;
  };
  const agentLog = values["agent-log"];
  if (agentLog !== "warn" && agentLog !== "info" && agentLog !== "debug")
    throw new Error(`--agent-log must be warn, info or debug, got ${agentLog}`);
  const agentLogLevel: NonNullable<SimOptions["agentLog"]> = agentLog;
  return {
    seeds: Math.floor(number("seeds", values.seeds)),
    first: Math.floor(number("seed", values.seed)),
    minutes: number("minutes", values.minutes),
    writesPerSecond: number("writes-per-second", values["writes-per-second"]),
    out: values.out as string,
    trace: values.trace === true,
    faultKinds,
    overlap: values.overlap === true,
    agentLog: agentLogLevel,
    /** What to add to a replay command. */
    faultArgs: `${values.faults === undefined ? "" : ` --faults ${values.faults}`}${values.overlap === true ? " --overlap" : ""}`,
  };
}

/**
 * The process's memory after a seed: the heap after a full collection when `gc` is exposed
 * (`npm run sim` runs node with --expose-gc), else as it stands, and the resident set.
 */
function memory(): { heapMb: number; rssMb: number } {
  (globalThis as { gc?: () => void }).gc?.();
  const { heapUsed, rss } = process.memoryUsage();
  return { heapMb: Math.round(heapUsed / 1e5) / 10, rssMb: Math.round(rss / 1e6) };
}

function summary(result: SimResult, mem: { heapMb: number; rssMb: number }) {
  const { check } = result;
  return {
    seed: result.seed,
    valid: result.valid,
    modelErrors: result.modelErrors,
    simulatedMs: result.simulatedMs,
    wallMs: result.wallMs,
    cpuMs: result.cpuMs,
    speedup: Math.round(result.simulatedMs / Math.max(1, result.wallMs)),
    faults: result.faults,
    faultsSkipped: result.faultsSkipped,
    writes: result.writes,
    timersFired: result.timersFired,
    violations: result.violations,
    lost: check.lost.length,
    twoWritable: check.twoWritable.length,
    stats: check.stats,
    ...mem,
  };
}

async function main(): Promise<void> {
  let options: ReturnType<typeof parseRun>;
  try {
    options = parseRun();
  } catch (error) {
    console.error(`${error instanceof Error ? error.message : String(error)}\n\n${USAGE}`);
    process.exit(2);
  }
  mkdirSync(options.out, { recursive: true });
  const results: ReturnType<typeof summary>[] = [];
  const started = process.hrtime.bigint();
  let failed = 0;
  for (let seed = options.first; seed < options.first + options.seeds; seed++) {
    const result = await simulate({
      seed,
      minutes: options.minutes,
      writesPerSecond: options.writesPerSecond,
      faultKinds: options.faultKinds,
      overlap: options.overlap,
      agentLog: options.agentLog,
    });
    const mem = memory();
    const line = summary(result, mem);
    results.push(line);
    const verdict =
      result.modelErrors.length > 0
        ? "MODEL ERROR"
        : result.valid === true
          ? "valid"
          : result.valid === false
            ? "INVALID"
            : "unknown";
    console.log(
      `seed ${seed}: ${verdict}, ${(result.simulatedMs / 60_000).toFixed(1)} simulated min in ${(result.wallMs / 1000).toFixed(1)} s (${line.speedup}x; CPU ${(result.cpuMs / 1000).toFixed(1)} s, ${Math.round(result.simulatedMs / Math.max(1, result.cpuMs))}x; heap ${mem.heapMb} MB, rss ${mem.rssMb} MB), ` +
        `${result.faults} faults${result.faultsSkipped > 0 ? ` (${result.faultsSkipped} kills skipped: last copy)` : ""}, ${line.stats.epochChanges} epoch changes, ${line.stats.ackedByReplica} replica-acked writes, ${line.lost} lost`,
    );
    const bad = result.valid !== true || result.modelErrors.length > 0;
    if (bad || options.trace) {
      const tracePath = join(options.out, `sim-trace-${seed}.txt`);
      writeFileSync(tracePath, `${result.trace.join("\n")}\n`);
      if (bad) {
        failed++;
        for (const violation of [...result.violations, ...result.modelErrors]) console.log(`  ${violation}`);
        console.log(
          `  replay: npm run sim -- --seed ${seed} --seeds 1 --minutes ${options.minutes} --writes-per-second ${options.writesPerSecond}${options.faultArgs}`,
        );
        console.log(`  trace: ${tracePath} (last 40 lines below)`);
        for (const traceLine of result.trace.slice(-40)) console.log(`    ${traceLine}`);
      }
    }
  }
  const wallMs = Number((process.hrtime.bigint() - started) / 1_000_000n);
  const simulatedMs = results.reduce((sum, r) => sum + r.simulatedMs, 0);
  const report = {
    command: `npm run sim -- --seeds ${options.seeds} --seed ${options.first} --minutes ${options.minutes}${options.faultArgs}`,
    ...codeVersion(),
    seeds: options.seeds,
    minutes: options.minutes,
    writesPerSecond: options.writesPerSecond,
    failed,
    simulatedHours: simulatedMs / 3_600_000,
    wallSeconds: wallMs / 1000,
    simulatedMinutesPerWallMinute: Math.round(simulatedMs / Math.max(1, wallMs)),
    simulatedMinutesPerCpuMinute: Math.round(
      simulatedMs /
        Math.max(
          1,
          results.reduce((sum, r) => sum + r.cpuMs, 0),
        ),
    ),
    results,
  };
  const path = join(options.out, `sim-${options.first}-${options.seeds}.json`);
  writeFileSync(path, `${JSON.stringify(report, null, 2)}\n`);
  console.log(
    `${options.seeds} seeds, ${failed} failed; ${report.simulatedHours.toFixed(2)} simulated hours in ${report.wallSeconds.toFixed(0)} s ` +
      `(${report.simulatedMinutesPerWallMinute} simulated min per wall min); ${path}`,
  );
  process.exitCode = failed > 0 ? 1 : 0;
}

await main();
