import { setTimeout as sleep } from "node:timers/promises";
import { Command, InvalidArgumentError } from "commander";
import { Redis } from "ioredis";
import { parseIntegerOption } from "../src/cli/options.ts";
import { abortOnSignal } from "../src/cli/signals.ts";
import { errorMessage } from "../src/core/errors.ts";
import { splitAddress, type WriteFailure, WriteWorkload } from "../src/workload/writer.ts";
import {
  type BenchConfig,
  buildReport,
  type FalseFailover,
  formatReport,
  machineInfo,
  type SystemRun,
  type TrialResult,
  writeReport,
} from "./lib/report.ts";
import { SYSTEMS } from "./systems/registry.ts";
import type { FailoverSystem, KillResult } from "./systems/types.ts";

const log = (line: string) => process.stderr.write(`${line}\n`);
const fmt = (value: number | undefined) =>
  value === undefined ? "-" : Math.round(value).toLocaleString("en-US");

/** Polls what the system advertises as primary, from a kill until stopped, and notes every change. */
class AdvertisedPrimaryWatch {
  readonly #system: FailoverSystem;
  readonly #kill: KillResult;
  readonly #seen: string[] = [];
  #firstChangeAt: number | undefined;
  #stopped = false;
  readonly #loop: Promise<void>;

  constructor(system: FailoverSystem, kill: KillResult, pollMs: number) {
    this.#system = system;
    this.#kill = kill;
    this.#loop = this.#poll(pollMs);
  }

  /** ms from the kill to the first advertised primary other than the old one. */
  get advertisedMs(): number | undefined {
    return this.#firstChangeAt === undefined ? undefined : this.#firstChangeAt - this.#kill.killedAt;
  }

  async stop(): Promise<string[]> {
    this.#stopped = true;
    await this.#loop;
    return this.#seen;
  }

  async #poll(pollMs: number): Promise<void> {
    while (!this.#stopped) {
      const address = await this.#system.primaryAddress().catch(() => undefined);
      if (address && address !== this.#kill.oldPrimary) {
        this.#firstChangeAt ??= performance.now();
        if (!this.#seen.includes(address)) this.#seen.push(address);
      }
      await sleep(pollMs);
    }
  }
}

/** SET commands that failed from `from` on (failures before a SET is sent are not writes). */
function failedWritesCounter(workload: WriteWorkload): {
  since(from: number, to: number): number;
  dispose(): void;
} {
  const failures: number[] = [];
  const onFailure = (failure: WriteFailure) => {
    if (failure.seq !== undefined) failures.push(failure.at);
  };
  workload.on("failure", onFailure);
  return {
    since: (from, to) => failures.filter((at) => at > from && at <= to).length,
    dispose: () => workload.off("failure", onFailure),
  };
}

/**
 * Waits until the writer writes steadily to the advertised primary: its last ack is recent, from
 * the advertised primary, and no write failed during the last `calmMs`.
 */
async function waitUntilSteady(
  system: FailoverSystem,
  workload: WriteWorkload,
  timeoutMs: number,
  calmMs = 500,
): Promise<void> {
  let lastFailureAt = Number.NEGATIVE_INFINITY;
  const onFailure = (failure: WriteFailure) => {
    lastFailureAt = failure.at;
  };
  workload.on("failure", onFailure);
  try {
    const deadline = performance.now() + timeoutMs;
    while (performance.now() < deadline) {
      await sleep(100);
      const advertised = await system.primaryAddress();
      const last = workload.stats().lastAck;
      const now = performance.now();
      if (last && last.address === advertised && now - last.at < 100 && now - lastFailureAt > calmMs) return;
    }
    throw new Error(
      `the writer did not write steadily to ${await system.primaryAddress()} within ${timeoutMs} ms`,
    );
  } finally {
    workload.off("failure", onFailure);
  }
}

/**
 * Nobody kills anything for `quietMs`: a change of the advertised primary, or a write acknowledged by
 * another server, is a false failover.
 */
async function quietPeriod(
  system: FailoverSystem,
  workload: WriteWorkload,
  quietMs: number,
  when: string,
): Promise<FalseFailover[]> {
  const expected = await system.primaryAddress();
  const startSeq = workload.stats().nextSeq;
  const found: FalseFailover[] = [];
  const reported = new Set<string | undefined>();
  const deadline = performance.now() + quietMs;
  while (performance.now() < deadline) {
    await sleep(100);
    const address = await system.primaryAddress().catch(() => undefined);
    if (address !== expected && !reported.has(address)) {
      reported.add(address);
      found.push({
        when,
        from: expected,
        to: address,
        detail: `advertised primary changed to ${address ?? "none"}`,
      });
    }
  }
  const elsewhere = workload.acks(startSeq).filter((ack) => ack.address !== expected);
  if (elsewhere.length > 0) {
    found.push({
      when,
      from: expected,
      to: elsewhere[0]?.address,
      detail: `${elsewhere.length} writes acknowledged by ${[...new Set(elsewhere.map((ack) => ack.address))].join(", ")}`,
    });
  }
  return found;
}

async function verifyOn(
  workload: WriteWorkload,
  address: string,
  range: { fromSeq?: number; toSeq?: number } = {},
) {
  const endpoint = splitAddress(address);
  if (!endpoint) throw new Error(`cannot verify on ${address}: not host:port`);
  const client = new Redis(endpoint[1], endpoint[0], { maxRetriesPerRequest: 1, commandTimeout: 10_000 });
  client.on("error", () => {});
  try {
    return await workload.verify(client, range);
  } finally {
    client.disconnect();
  }
}

/** One trial: kill the primary, time the first acknowledged write on a new one, count lost writes, restore. */
async function runTrial(
  trial: number,
  system: FailoverSystem,
  workload: WriteWorkload,
  config: BenchConfig,
  fromSeq: number,
): Promise<{ result: TrialResult; nextSeq: number }> {
  const failed = failedWritesCounter(workload);
  const kill = await system.killPrimary();
  const watch = new AdvertisedPrimaryWatch(system, kill, 25);
  let ack: Awaited<ReturnType<WriteWorkload["waitForAckAfter"]>>;
  let toSeq = fromSeq;
  let advertisedPrimaries: string[] = [];
  try {
    ack = await workload.waitForAckAfter(kill.killedAt, kill.oldPrimary, config.trialTimeoutMs);
    if (!ack) {
      advertisedPrimaries = await watch.stop();
      const result: TrialResult = {
        trial,
        oldPrimary: kill.oldPrimary,
        newPrimary: advertisedPrimaries[0],
        failoverMs: undefined,
        advertisedMs: watch.advertisedMs,
        lostWrites: 0,
        lostSeqs: [],
        checkedWrites: 0,
        failedWrites: failed.since(kill.killedAt, performance.now()),
        advertisedPrimaries,
        phases: await system.phaseTimings?.(kill),
        error: `no write acknowledged by a new primary within ${config.trialTimeoutMs} ms`,
      };
      return { result, nextSeq: fromSeq };
    }
    toSeq = workload.stats().nextSeq;
    const verified = await verifyOn(workload, ack.address, { fromSeq, toSeq });
    await system.resetTrial();
    advertisedPrimaries = await watch.stop();
    const result: TrialResult = {
      trial,
      oldPrimary: kill.oldPrimary,
      newPrimary: ack.address,
      failoverMs: ack.at - kill.killedAt,
      advertisedMs: watch.advertisedMs,
      lostWrites: verified.lost.length,
      lostSeqs: verified.lost,
      checkedWrites: verified.checked,
      failedWrites: failed.since(kill.killedAt, ack.at),
      advertisedPrimaries,
      phases: await system.phaseTimings?.(kill),
      error: undefined,
    };
    return { result, nextSeq: toSeq };
  } finally {
    failed.dispose();
    await watch.stop();
  }
}

async function runSystem(
  system: FailoverSystem,
  config: BenchConfig,
  signal: AbortSignal,
): Promise<SystemRun> {
  const trials: TrialResult[] = [];
  const falseFailovers: FalseFailover[] = [];
  let quietPeriods = 0;
  let error: string | undefined;
  const tag = `[${system.name}]`;
  const workload = new WriteWorkload({ resolvePrimary: () => system.primaryAddress(), ...config.writer });
  let final = { checked: 0, lost: 0 };
  try {
    log(`${tag} setting up (failure timeout ${config.failureTimeoutMs} ms)`);
    await system.setup({
      failureTimeoutMs: config.failureTimeoutMs,
      nodeCount: config.nodeCount,
      log: (line) => log(`${tag} ${line}`),
    });
    workload.start();
    await waitUntilSteady(system, workload, 30_000);
    log(`${tag} writer steady; quiet period of ${config.quietMs} ms`);
    falseFailovers.push(...(await quietPeriod(system, workload, config.quietMs, "during warm-up")));
    quietPeriods += 1;
    let fromSeq = 0;
    for (let trial = 1; trial <= config.trials; trial++) {
      if (signal.aborted) throw new Error("interrupted");
      const { result, nextSeq } = await runTrial(trial, system, workload, config, fromSeq);
      trials.push(result);
      fromSeq = nextSeq;
      log(
        `${tag} trial ${trial}/${config.trials}: failover ${fmt(result.failoverMs)} ms ` +
          `(advertised ${fmt(result.advertisedMs)} ms), lost ${result.lostWrites}, ` +
          `failed writes ${result.failedWrites}, ${result.oldPrimary} -> ${result.newPrimary ?? "?"}` +
          (result.error ? ` — ${result.error}` : ""),
      );
      if (result.error) throw new Error(`trial ${trial}: ${result.error}`);
      await waitUntilSteady(system, workload, 30_000);
      const found = await quietPeriod(system, workload, config.quietMs, `after trial ${trial}`);
      quietPeriods += 1;
      for (const falseFailover of found)
        log(`${tag} FALSE FAILOVER ${falseFailover.when}: ${falseFailover.detail}`);
      falseFailovers.push(...found);
    }
  } catch (caught) {
    error = errorMessage(caught);
    log(`${tag} stopped early: ${error}`);
  } finally {
    await workload.stop();
    const finalPrimary = await system.primaryAddress().catch(() => undefined);
    if (finalPrimary && workload.stats().acked > 0) {
      const verified = await verifyOn(workload, finalPrimary).catch(() => undefined);
      if (verified) final = { checked: verified.checked, lost: verified.lost.length };
    }
    await system
      .teardown()
      .catch((caught: unknown) => log(`${tag} teardown failed: ${errorMessage(caught)}`));
  }
  const stats = workload.stats();
  return {
    name: system.name,
    trials,
    falseFailovers,
    quietPeriods,
    writer: {
      attempts: stats.attempts,
      acked: stats.acked,
      failedWrites: stats.failedWrites,
      checkedAtEnd: final.checked,
      lostAtEnd: final.lost,
    },
    error,
  };
}

function parseSystems(value: string): string[] {
  const names = value
    .split(",")
    .map((name) => name.trim())
    .filter(Boolean);
  const unknown = names.filter((name) => !(name in SYSTEMS));
  if (names.length === 0 || unknown.length > 0) {
    throw new InvalidArgumentError(
      `unknown system ${unknown.join(", ") || "(none)"}; registered: ${Object.keys(SYSTEMS).join(", ")}`,
    );
  }
  return names;
}

interface CliOptions {
  trials: number;
  failureTimeout: number;
  systems: string[];
  out: string;
  quietMs: number;
  trialTimeout?: number;
  sentinelFailoverTimeout: number;
}

export function buildProgram(): Command {
  return new Command()
    .name("bench:failover")
    .description(
      "SIGKILL the primary N times per system and measure kill -> first acknowledged write on the new primary, " +
        "and acknowledged writes lost",
    )
    .option("--trials <n>", "trials per system", parseIntegerOption(1, 1000), 10)
    .option(
      "--failure-timeout <ms>",
      "failure timeout of every system (Sentinel down-after-milliseconds)",
      parseIntegerOption(200, 600_000),
      3000,
    )
    .option("--systems <list>", "comma-separated systems to run", parseSystems, Object.keys(SYSTEMS))
    .option("--out <dir>", "where failover.json and failover.svg go", "bench/results")
    .option(
      "--quiet-ms <ms>",
      "quiet period after each trial checked for false failovers",
      parseIntegerOption(0, 600_000),
      5000,
    )
    .option(
      "--trial-timeout <ms>",
      "give up a trial after this (default: failure timeout + 30 s)",
      parseIntegerOption(1000, 3_600_000),
    )
    .option(
      "--sentinel-failover-timeout <ms>",
      "Sentinel failover-timeout",
      parseIntegerOption(1000, 3_600_000),
      10_000,
    )
    .action(async (options: CliOptions) => {
      const config: BenchConfig = {
        trials: options.trials,
        failureTimeoutMs: options.failureTimeout,
        systems: options.systems,
        nodeCount: 3,
        quietMs: options.quietMs,
        trialTimeoutMs: options.trialTimeout ?? options.failureTimeout + 30_000,
        sentinel: { sentinels: 3, quorum: 2, failoverTimeoutMs: options.sentinelFailoverTimeout },
        writer: { commandTimeoutMs: 250, writeIntervalMs: 2, retryDelayMs: 10 },
      };
      const abort = abortOnSignal();
      // A second Ctrl-C exits at once; process.exit still runs the hooks that kill every child by PID.
      abort.signal.addEventListener("abort", () => process.once("SIGINT", () => process.exit(130)));
      const machine = machineInfo();
      const runs: SystemRun[] = [];
      for (const name of config.systems) {
        const factory = SYSTEMS[name];
        if (!factory || abort.signal.aborted) continue;
        runs.push(await runSystem(factory(config), config, abort.signal));
      }
      const report = buildReport(config, machine, runs);
      process.stdout.write(`${formatReport(report)}\n`);
      const paths = writeReport(report, options.out);
      log(`wrote ${paths.json} and ${paths.svg}`);
      if (runs.some((run) => run.error)) process.exitCode = 1;
    });
}

if (import.meta.main) {
  try {
    await buildProgram().parseAsync(process.argv);
  } catch (error) {
    log(`bench:failover: ${errorMessage(error)}`);
    process.exitCode = 1;
  }
  // Sentinel and redis clients may hold the loop open briefly; every child was stopped by PID above.
  process.exit();
}
