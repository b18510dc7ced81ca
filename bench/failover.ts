import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Command, InvalidArgumentError } from "commander";
import { Redis } from "ioredis";
import { parseIntegerOption } from "../src/cli/options.ts";
import { abortOnSignal } from "../src/cli/signals.ts";
import { parseAddress } from "../src/core/address.ts";
import { errorMessage } from "../src/core/errors.ts";
import { Haproxy } from "../src/dev/local-stack/haproxy.ts";
import type { Ack } from "../src/dev/workload/ack-log.ts";
import {
  type VerifyResult,
  type WriteFailure,
  WriteWorkload,
  type WriteWorkloadStats,
} from "../src/dev/workload/writer.ts";
import {
  type BenchConfig,
  buildReport,
  type FailoverReport,
  type FalseFailover,
  formatReport,
  formatTable,
  loadAverage,
  machineInfo,
  type SystemRun,
  type TrialResult,
  writeReport,
} from "./lib/report.ts";
import { SentinelClientWorkload } from "./lib/sentinel-client-workload.ts";
import { SYSTEMS } from "./systems/registry.ts";
import { shardguardTimings } from "./systems/shardguard.ts";
import { type FailoverSystem, faultOf, type KillResult, ROWS, type Row } from "./systems/types.ts";

/**
 * What the driver needs of a writer: the benchmark's own `WriteWorkload` (asks the system where the
 * primary is) or `SentinelClientWorkload` (an ioredis client in Sentinel mode).
 */
interface BenchWorkload {
  start(): void;
  stop(): Promise<void>;
  stats(): WriteWorkloadStats & { readonly unconfirmed?: number };
  acks(fromSeq?: number, toSeq?: number): Ack[];
  waitForAckAfter(
    instant: number,
    notAddress: string | undefined,
    timeoutMs: number,
  ): Promise<Ack | undefined>;
  verify(client: Redis, range?: { fromSeq?: number; toSeq?: number }): Promise<VerifyResult>;
  on(event: "failure", listener: (failure: WriteFailure) => void): unknown;
  off(event: "failure", listener: (failure: WriteFailure) => void): unknown;
  firstContactAfter?(instant: number, notAddress?: string): Ack | undefined;
  reconnectsBetween?(from: number, to: number): { count: number; lastAt?: number; lastDelayMs?: number };
}

const log = (line: string) => process.stderr.write(`${line}\n`);
/** Sub-millisecond digits are noise here; keep one decimal in the JSON. */
const tenth = (value: number) => Math.round(value * 10) / 10;
/** A false failover can lose thousands of writes; the JSON keeps the first of them, the count keeps all. */
const MAX_LISTED_LOST = 200;
const fmt = (value: number | undefined) =>
  value === undefined ? "-" : Math.round(value).toLocaleString("en-US");

/** One change of what the system advertises as primary. */
interface Observation {
  readonly at: number;
  readonly address: string | undefined;
}

/** Polls what the system advertises as primary from a kill until stopped, keeping every change. */
class AdvertisedPrimaryWatch {
  readonly #system: FailoverSystem;
  readonly #kill: KillResult;
  readonly #changes: Observation[] = [];
  #stopped = false;
  readonly #loop: Promise<void>;

  constructor(system: FailoverSystem, kill: KillResult, pollMs: number) {
    this.#system = system;
    this.#kill = kill;
    this.#loop = this.#poll(pollMs);
  }

  /** ms from the kill to the first advertised primary other than the old one. */
  get advertisedMs(): number | undefined {
    const first = this.#changes.find((change) => change.address && change.address !== this.#kill.oldPrimary);
    return first === undefined ? undefined : first.at - this.#kill.killedAt;
  }

  /** Every primary other than the old one advertised so far, in order of first appearance. */
  get newPrimaries(): string[] {
    const addresses = this.#changes.flatMap((change) => change.address ?? []);
    return [...new Set(addresses)].filter((address) => address !== this.#kill.oldPrimary);
  }

  /**
   * Primaries advertised that no kill explains: before `stableAt`, any besides the old and the new
   * one (clients may see both while the news spreads); from `stableAt` on, any besides the new one.
   */
  unexplained(newPrimary: string, stableAt: number): Observation[] {
    return this.#changes.filter(
      (change) =>
        change.address !== undefined &&
        change.address !== newPrimary &&
        (change.at >= stableAt || change.address !== this.#kill.oldPrimary),
    );
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#loop;
  }

  async #poll(pollMs: number): Promise<void> {
    while (!this.#stopped) {
      const address = await this.#system.primaryAddress().catch(() => undefined);
      if (this.#changes.at(-1)?.address !== address || this.#changes.length === 0) {
        this.#changes.push({ at: performance.now(), address });
      }
      await sleep(pollMs);
    }
  }
}

/**
 * Waits until `polls` lookups in a row advertise the same primary (with Sentinel, every sentinel
 * has heard of the switch); returns it and when that began, or undefined if it keeps changing.
 */
async function waitForStablePrimary(
  system: FailoverSystem,
  timeoutMs: number,
  polls = 6,
): Promise<{ address: string; since: number } | undefined> {
  const deadline = performance.now() + timeoutMs;
  let current: string | undefined;
  let since = performance.now();
  let streak = 0;
  while (performance.now() < deadline) {
    const address = await system.primaryAddress().catch(() => undefined);
    if (address === undefined || address !== current) {
      current = address;
      since = performance.now();
      streak = 0;
    }
    streak += 1;
    if (current !== undefined && streak >= polls) return { address: current, since };
    await sleep(20);
  }
  return undefined;
}

/** SET commands that failed from `from` on (failures before a SET is sent are not writes). */
function failedWritesCounter(workload: BenchWorkload): {
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
  workload: BenchWorkload,
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
  workload: BenchWorkload,
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
  workload: BenchWorkload,
  address: string,
  range: { fromSeq?: number; toSeq?: number } = {},
) {
  const { host, port } = parseAddress(address);
  const client = new Redis(port, host, { maxRetriesPerRequest: 1, commandTimeout: 10_000 });
  client.on("error", () => {});
  try {
    return await workload.verify(client, range);
  } finally {
    client.disconnect();
  }
}

/**
 * One trial: kill the primary, time the first acknowledged write on a new one, count the
 * acknowledged writes it lacks, restore the shard, then keep writing through a quiet period. A primary
 * change that the kill does not explain (a second failover, one during the quiet period) is returned
 * as a false failover; lost writes are counted again at the end, so those a false failover loses
 * count for this trial too.
 */
async function runTrial(
  trial: number,
  system: FailoverSystem,
  workload: BenchWorkload,
  config: BenchConfig,
  fromSeq: number,
  row: Row,
): Promise<{ result: TrialResult; nextSeq: number; falseFailovers: FalseFailover[] }> {
  const failed = failedWritesCounter(workload);
  const kill = await system.killPrimary(faultOf(row));
  const watch = new AdvertisedPrimaryWatch(system, kill, 25);
  try {
    const ack = await workload.waitForAckAfter(kill.killedAt, kill.oldPrimary, config.trialTimeoutMs);
    if (!ack) {
      await watch.stop();
      const result: TrialResult = {
        trial,
        oldPrimary: kill.oldPrimary,
        newPrimary: watch.newPrimaries[0],
        failoverMs: undefined,
        advertisedMs: watch.advertisedMs,
        lostWrites: 0,
        lostAtFailover: 0,
        lostSeqs: [],
        checkedWrites: 0,
        failedWrites: failed.since(kill.killedAt, performance.now()),
        advertisedPrimaries: watch.newPrimaries,
        phases: await system.phaseTimings?.(kill),
        error: `no write acknowledged by a new primary within ${config.trialTimeoutMs} ms`,
      };
      return { result, nextSeq: fromSeq, falseFailovers: [] };
    }
    const contact = workload.firstContactAfter?.(kill.killedAt, kill.oldPrimary);
    const reconnects = workload.reconnectsBetween?.(kill.killedAt, ack.at);
    const atFailover = await verifyOn(workload, ack.address, { fromSeq, toSeq: workload.stats().nextSeq });
    const stable = await waitForStablePrimary(system, 10_000);
    await system.resetTrial();
    await watch.stop();
    const falseFailovers: FalseFailover[] = watch
      .unexplained(ack.address, stable?.since ?? Number.POSITIVE_INFINITY)
      .map((change) => ({
        when: `during trial ${trial}`,
        from: ack.address,
        to: change.address,
        detail: `advertised ${change.address} ${fmt(change.at - kill.killedAt)} ms after the kill, after the failover to ${ack.address}`,
      }));
    if (!stable) {
      falseFailovers.push({
        when: `during trial ${trial}`,
        from: ack.address,
        to: undefined,
        detail: "the advertised primary did not stay the same for 6 lookups in a row within 10 s",
      });
    }
    const reported = await system.phaseTimings?.(kill);
    const phases =
      reported && Object.fromEntries(Object.entries(reported).map(([name, ms]) => [name, tenth(ms)]));
    await waitUntilSteady(system, workload, 30_000);
    falseFailovers.push(...(await quietPeriod(system, workload, config.quietMs, `after trial ${trial}`)));
    const toSeq = workload.stats().nextSeq;
    const current = (await system.primaryAddress()) ?? ack.address;
    const atEnd = await verifyOn(workload, current, { fromSeq, toSeq });
    const result: TrialResult = {
      trial,
      oldPrimary: kill.oldPrimary,
      newPrimary: ack.address,
      failoverMs: tenth(ack.at - kill.killedAt),
      advertisedMs: watch.advertisedMs === undefined ? undefined : tenth(watch.advertisedMs),
      lostWrites: atEnd.lost.length,
      lostAtFailover: atFailover.lost.length,
      lostSeqs: atEnd.lost.slice(0, MAX_LISTED_LOST),
      checkedWrites: atEnd.checked,
      failedWrites: failed.since(kill.killedAt, ack.at),
      advertisedPrimaries: watch.newPrimaries,
      phases,
      ...(contact && contact.at <= ack.at ? { firstContactMs: tenth(contact.at - kill.killedAt) } : {}),
      ...(reconnects
        ? {
            reconnects: {
              count: reconnects.count,
              ...(reconnects.lastAt === undefined
                ? {}
                : { lastAtMs: tenth(reconnects.lastAt - kill.killedAt) }),
              ...(reconnects.lastDelayMs === undefined ? {} : { lastDelayMs: reconnects.lastDelayMs }),
            },
          }
        : {}),
      error: undefined,
    };
    return { result, nextSeq: toSeq, falseFailovers };
  } finally {
    failed.dispose();
    await watch.stop();
  }
}

async function runSystem(
  system: FailoverSystem,
  config: BenchConfig,
  signal: AbortSignal,
  row: Row,
): Promise<SystemRun> {
  const trials: TrialResult[] = [];
  const falseFailovers: FalseFailover[] = [];
  let quietPeriods = 0;
  let error: string | undefined;
  const tag = `[${system.name} ${row}]`;
  const sentinelClient = row === "sentinel-client";
  const throughHaproxy = row === "haproxy";
  let haproxy: Haproxy | undefined;
  // The system's client lookup exists only after setup; until then (never used) the advertised primary.
  let resolve = () => system.primaryAddress();
  let workload: BenchWorkload = new WriteWorkload({ resolvePrimary: () => resolve(), ...config.writer });
  let final = { checked: 0, lost: 0 };
  try {
    log(`${tag} setting up (failure timeout ${config.failureTimeoutMs} ms)`);
    await system.setup({
      failureTimeoutMs: config.failureTimeoutMs,
      nodeCount: config.nodeCount,
      log: (line) => log(`${tag} ${line}`),
      sentinelEndpoints: sentinelClient,
      httpEndpoints: throughHaproxy,
    });
    resolve = system.createResolver?.() ?? resolve;
    if (sentinelClient) {
      const target = system.sentinelClient?.();
      if (!target) throw new Error(`${system.name} has no Sentinel endpoints for a Sentinel client`);
      log(
        `${tag} ioredis in Sentinel mode: name ${target.name}, sentinels ${target.sentinels.map((s) => s.port).join(", ")}`,
      );
      workload = new SentinelClientWorkload({
        target,
        writeIntervalMs: config.writer.writeIntervalMs,
        retryDelayMs: config.writer.retryDelayMs,
      });
    }
    if (throughHaproxy) {
      const backends = system.haproxyBackends?.();
      if (!backends) throw new Error(`${system.name} has no HTTP role checks for HAProxy`);
      haproxy = await Haproxy.start(backends);
      log(
        `${tag} ioredis through HAProxy ${haproxy.address} (option httpchk GET /primary, inter 500 fall 1 rise 1)`,
      );
      const { host, port } = parseAddress(haproxy.address);
      workload = new SentinelClientWorkload({
        target: { direct: { host, port } },
        writeIntervalMs: config.writer.writeIntervalMs,
        retryDelayMs: config.writer.retryDelayMs,
      });
    }
    workload.start();
    await waitUntilSteady(system, workload, 30_000);
    log(`${tag} writer steady; quiet period of ${config.quietMs} ms`);
    falseFailovers.push(...(await quietPeriod(system, workload, config.quietMs, "during warm-up")));
    quietPeriods += 1;
    let fromSeq = 0;
    for (let trial = 1; trial <= config.trials; trial++) {
      if (signal.aborted) throw new Error("interrupted");
      const outcome = await runTrial(trial, system, workload, config, fromSeq, row);
      const { result } = outcome;
      trials.push(result);
      fromSeq = outcome.nextSeq;
      quietPeriods += result.error ? 0 : 1;
      log(
        `${tag} trial ${trial}/${config.trials}: failover ${fmt(result.failoverMs)} ms ` +
          `(advertised ${fmt(result.advertisedMs)} ms` +
          (result.firstContactMs === undefined
            ? ""
            : `, client reached it ${fmt(result.firstContactMs)} ms`) +
          (result.reconnects === undefined
            ? ""
            : `; ${result.reconnects.count} reconnects, last at ${fmt(result.reconnects.lastAtMs)} ms + ${fmt(result.reconnects.lastDelayMs)} ms`) +
          `), lost ${result.lostAtFailover} at failover ` +
          `and ${result.lostWrites} by the end of the trial, ${result.oldPrimary} -> ${result.newPrimary ?? "?"}` +
          (result.error ? ` — ${result.error}` : ""),
      );
      for (const falseFailover of outcome.falseFailovers) {
        log(`${tag} FALSE FAILOVER ${falseFailover.when}: ${falseFailover.detail}`);
      }
      falseFailovers.push(...outcome.falseFailovers);
      if (result.error) throw new Error(`trial ${trial}: ${result.error}`);
    }
  } catch (caught) {
    error = errorMessage(caught);
    log(`${tag} stopped early: ${error}`);
  } finally {
    await workload.stop();
    await haproxy?.stop();
    // A system whose setup failed throws synchronously here: not a reason to lose the other rows.
    const finalPrimary = await Promise.resolve()
      .then(() => system.primaryAddress())
      .catch(() => undefined);
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
      ...(stats.unconfirmed === undefined ? {} : { unconfirmed: stats.unconfirmed }),
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

function parseFaults(value: string): Row[] {
  const names = value
    .split(",")
    .map((name) => name.trim())
    .filter(Boolean);
  const unknown = names.filter((name) => !(ROWS as readonly string[]).includes(name));
  if (names.length === 0 || unknown.length > 0) {
    throw new InvalidArgumentError(
      `unknown fault ${unknown.join(", ") || "(none)"}; known: ${ROWS.join(", ")}`,
    );
  }
  return names as Row[];
}

/** One row per fault: each system's median and p99, and Shardguard's ratios to Sentinel. */
export interface FaultRow {
  readonly fault: Row;
  readonly systems: Record<
    string,
    {
      median: number | null;
      p99: number | null;
      trials: number;
      falseFailovers: number;
      lost: number;
      /** Sentinel-client row: medians of where the client's time went (ms). */
      client?: {
        killToContact: number | null;
        advertisedToContact: number | null;
        advertisedToAck: number | null;
        contactToAck: number | null;
      };
    }
  >;
  readonly ratio: number | null;
  readonly p99Ratio: number | null;
}

export function faultRow(fault: Row, report: FailoverReport): FaultRow {
  const systems: FaultRow["systems"] = {};
  const medianOf = (summary: { median: number } | undefined) => (summary ? tenth(summary.median) : null);
  for (const system of report.systems) {
    const ms = system.summary.failoverMs;
    const client = system.summary.client;
    systems[system.name] = {
      median: ms ? tenth(ms.median) : null,
      p99: ms ? tenth(ms.p99) : null,
      trials: system.trials.filter((trial) => trial.failoverMs !== undefined).length,
      falseFailovers: system.falseFailovers.length,
      lost: system.trials.reduce((sum, trial) => sum + trial.lostWrites, 0),
      ...(client
        ? {
            client: {
              killToContact: medianOf(client.killToContactMs),
              advertisedToContact: medianOf(client.advertisedToContactMs),
              advertisedToAck: medianOf(client.advertisedToAckMs),
              contactToAck: medianOf(client.contactToAckMs),
            },
          }
        : {}),
    };
  }
  const round = (value: number | null) => (value === null ? null : Math.round(value * 100) / 100);
  return { fault, systems, ratio: round(report.ratio.value), p99Ratio: round(report.ratio.p99) };
}

/** The rows file as a previous run wrote it, or undefined. */
interface RowsFile {
  readonly generatedAt?: string;
  readonly config?: { readonly failureTimeoutMs?: number };
  readonly rows?: readonly (FaultRow & { measuredAt?: string })[];
}

function readRowsFile(path: string): RowsFile | undefined {
  if (!existsSync(path)) return undefined;
  try {
    return JSON.parse(readFileSync(path, "utf8")) as RowsFile;
  } catch {
    return undefined;
  }
}

/**
 * The rows file after a run of some rows: this run's rows, plus the previous file's rows for the
 * faults not run now, when it was measured at the same failure timeout (so `--faults sentinel-client`
 * adds its row without discarding the others). Each row keeps `measuredAt`: rows measured in different
 * runs must not be compared as if they were one run. Ordered as `ROWS`.
 */
export function mergeRows(
  previous: RowsFile | undefined,
  fresh: readonly (FaultRow & { measuredAt?: string })[],
  failureTimeoutMs: number,
): (FaultRow & { measuredAt?: string })[] {
  const byFault = new Map<string, FaultRow & { measuredAt?: string }>();
  if (previous?.config?.failureTimeoutMs === failureTimeoutMs) {
    for (const row of previous.rows ?? []) {
      byFault.set(row.fault, { ...row, measuredAt: row.measuredAt ?? previous.generatedAt });
    }
  }
  for (const row of fresh) byFault.set(row.fault, row);
  const order = (fault: string) => {
    const index = (ROWS as readonly string[]).indexOf(fault);
    return index < 0 ? ROWS.length : index;
  };
  return [...byFault.values()].sort((a, b) => order(a.fault) - order(b.fault));
}

function formatRows(rows: readonly FaultRow[]): string {
  const names = [...new Set(rows.flatMap((row) => Object.keys(row.systems)))];
  return formatTable(
    ["fault", ...names.flatMap((name) => [`${name} median`, `${name} p99`]), "ratio", "p99 ratio"],
    rows.map((row) => [
      row.fault,
      ...names.flatMap((name) => [
        fmt(row.systems[name]?.median ?? undefined),
        fmt(row.systems[name]?.p99 ?? undefined),
      ]),
      row.ratio?.toFixed(2) ?? "-",
      row.p99Ratio?.toFixed(2) ?? "-",
    ]),
  );
}

interface CliOptions {
  faults: Row[];
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
    .option(
      "--faults <list>",
      "comma-separated rows: crash (SIGKILL redis-server), host (redis-server and its agent), hang (SIGSTOP), " +
        "switchover (planned: shardguard switchover / SENTINEL FAILOVER, from the request), " +
        "sentinel-client (crash, with ioredis in Sentinel mode at the sentinels / the agents, WAIT-confirmed writes), " +
        "haproxy (crash, the same client through a real HAProxy checking the agents' GET /primary; shardguard only)",
      parseFaults,
      [...ROWS],
    )
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
        shardguard: shardguardTimings(options.failureTimeout),
        writer: { commandTimeoutMs: 250, writeIntervalMs: 2, retryDelayMs: 10 },
      };
      const abort = abortOnSignal();
      // A second Ctrl-C exits at once; process.exit still runs the hooks that kill every child by PID.
      abort.signal.addEventListener("abort", () => process.once("SIGINT", () => process.exit(130)));
      const machine = machineInfo();
      const rows: (FaultRow & { measuredAt?: string })[] = [];
      for (const fault of options.faults) {
        const runs: SystemRun[] = [];
        for (const name of config.systems) {
          const factory = SYSTEMS[name];
          if (!factory || abort.signal.aborted) continue;
          const system = factory(config);
          // HAProxy's check is the agents' GET /primary: a system without it has no haproxy row.
          if (fault === "haproxy" && !system.haproxyBackends) continue;
          runs.push(await runSystem(system, config, abort.signal, fault));
        }
        const report = {
          ...buildReport(config, { ...machine, loadAverageAtEnd: loadAverage() }, runs),
          fault,
        };
        process.stdout.write(`\n## ${fault}\n${formatReport(report)}\n`);
        // The crash row keeps the file names of the single-fault benchmark.
        const paths = writeReport(
          report,
          options.out,
          fault === "crash" ? "failover" : `failover-${fault}`,
          `Failover (${fault}): fault of the primary to first acknowledged write`,
        );
        log(`wrote ${paths.json} and ${paths.svg}`);
        rows.push({ ...faultRow(fault, report), measuredAt: report.generatedAt });
        if (runs.some((run) => run.error)) process.exitCode = 1;
      }
      process.stdout.write(`\n${formatRows(rows)}\n`);
      const rowsPath = join(options.out, "failover-rows.json");
      const merged = mergeRows(readRowsFile(rowsPath), rows, config.failureTimeoutMs);
      writeFileSync(
        rowsPath,
        `${JSON.stringify({ generatedAt: new Date().toISOString(), config, machine, loadAverageAtEnd: loadAverage(), rows: merged }, null, 2)}\n`,
      );
      log(`wrote ${rowsPath}`);
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
