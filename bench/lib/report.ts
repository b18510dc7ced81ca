import { spawnSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { renderFailoverChart } from "./chart.ts";
import { type Summary, summarize } from "./stats.ts";

/** What one benchmark run was configured with; stored in the JSON so a result can be reproduced. */
export interface BenchConfig {
  readonly trials: number;
  readonly failureTimeoutMs: number;
  readonly systems: readonly string[];
  readonly nodeCount: number;
  /** Pause after each reset during which any primary change is a false failover. */
  readonly quietMs: number;
  /** How long a trial waits for the first acknowledged write on a new primary. */
  readonly trialTimeoutMs: number;
  readonly sentinel: {
    readonly sentinels: number;
    readonly quorum: number;
    readonly failoverTimeoutMs: number;
  };
  /** Shardguard's timings at this failure timeout (heartbeat, tick, fence), quorum majority, no cool-down. */
  readonly shardguard: {
    readonly heartbeatIntervalMs: number;
    readonly tickIntervalMs: number;
    readonly fenceTimeoutMs: number;
  };
  readonly writer: {
    readonly commandTimeoutMs: number;
    readonly writeIntervalMs: number;
    readonly retryDelayMs: number;
  };
}

export interface TrialResult {
  readonly trial: number;
  readonly oldPrimary: string;
  readonly newPrimary: string | undefined;
  /** ms from the SIGKILL to the first write acknowledged by a server other than the old primary; undefined: none in time. */
  readonly failoverMs: number | undefined;
  /** ms from the SIGKILL to when the system first advertised a primary other than the old one. */
  readonly advertisedMs: number | undefined;
  /**
   * Acknowledged writes of this trial's window (from the end of the previous trial to the end of this
   * one's quiet period) that the primary at the end of the trial does not hold.
   */
  readonly lostWrites: number;
  /** Of the same window up to the first acknowledged write on the new primary: those the new primary lacked then. */
  readonly lostAtFailover: number;
  /** Sequence numbers of the lost writes (the first 200). */
  readonly lostSeqs: readonly number[];
  /** Acknowledged writes looked up at the end of the trial. */
  readonly checkedWrites: number;
  /** Writes sent between the kill and the first acknowledged write on the new primary that were not acknowledged. */
  readonly failedWrites: number;
  /** Every primary other than the old one that the system advertised from the kill to the end of the reset. */
  readonly advertisedPrimaries: readonly string[];
  /** Durations of the system's own failover phases, in order, when it reports them. */
  readonly phases: Readonly<Record<string, number>> | undefined;
  /**
   * Sentinel-client row: ms from the SIGKILL to the client's first reply of any kind from the new
   * primary (an ack, a refusal such as NOREPLICAS, a WAIT that counted no replica): when discovery
   * had brought it there. `failoverMs - firstContactMs` is the new primary's write guard (or, for
   * Sentinel, the wait for a replica to follow it) plus the client's retry pause.
   */
  readonly firstContactMs?: number;
  /**
   * Sentinel-client row: ioredis's reconnects between the kill and the first acknowledged write, and
   * the last one: ms after the kill it was scheduled and its retryStrategy delay.
   */
  readonly reconnects?: { readonly count: number; readonly lastAtMs?: number; readonly lastDelayMs?: number };
  readonly error: string | undefined;
}

/** A primary change no kill explains: during warm-up, a quiet period, or a second failover within a trial. */
export interface FalseFailover {
  readonly when: string;
  readonly from: string | undefined;
  readonly to: string | undefined;
  readonly detail: string;
}

export interface SystemRun {
  readonly name: string;
  readonly trials: readonly TrialResult[];
  readonly falseFailovers: readonly FalseFailover[];
  /** Quiet periods checked for false failovers. */
  readonly quietPeriods: number;
  /** The writer over the whole run, and one last check of every acknowledged write on the final primary. */
  readonly writer: {
    readonly attempts: number;
    readonly acked: number;
    readonly failedWrites: number;
    readonly checkedAtEnd: number;
    readonly lostAtEnd: number;
    /** Sentinel-client row: SETs that succeeded but whose WAIT counted no replica (not acknowledged). */
    readonly unconfirmed?: number;
  };
  /** Set when the run stopped early (setup failed, a reset failed). */
  readonly error: string | undefined;
}

export interface SystemSummary {
  readonly successfulTrials: number;
  readonly failedTrials: number;
  readonly failoverMs: Summary | undefined;
  readonly advertisedMs: Summary | undefined;
  readonly lostWrites: { readonly total: number; readonly perTrial: Summary | undefined };
  readonly falseFailovers: number;
  readonly phases: Readonly<Record<string, Summary>>;
  /** Sentinel-client row: where the client's time goes (see `clientBreakdown`). */
  readonly client?: ClientBreakdown;
}

/**
 * Where a Sentinel client's failover time goes, over the trials that have each instant: kill -> first
 * contact with the new primary; the system advertising it (`advertisedMs`: Shardguard's topology
 * online, a sentinel answering the new address) -> first contact (discovery) and -> first
 * acknowledged write; first contact -> first acknowledged write (the write guard / replica wait).
 */
export interface ClientBreakdown {
  readonly killToContactMs: Summary | undefined;
  readonly advertisedToContactMs: Summary | undefined;
  readonly advertisedToAckMs: Summary | undefined;
  readonly contactToAckMs: Summary | undefined;
}

export function clientBreakdown(trials: readonly TrialResult[]): ClientBreakdown | undefined {
  const withContact = trials.filter(
    (trial) => trial.firstContactMs !== undefined && trial.failoverMs !== undefined,
  );
  if (withContact.length === 0) return undefined;
  const each = (value: (trial: TrialResult) => number | undefined) =>
    summarize(withContact.flatMap((trial) => value(trial) ?? []));
  const since = (trial: TrialResult, end: number | undefined) =>
    trial.advertisedMs === undefined || end === undefined ? undefined : end - trial.advertisedMs;
  return {
    killToContactMs: each((trial) => trial.firstContactMs),
    advertisedToContactMs: each((trial) => since(trial, trial.firstContactMs)),
    advertisedToAckMs: each((trial) => since(trial, trial.failoverMs)),
    contactToAckMs: each((trial) => (trial.failoverMs as number) - (trial.firstContactMs as number)),
  };
}

export interface MachineInfo {
  readonly cpus: number;
  readonly cpuModel: string;
  readonly node: string;
  readonly platform: string;
  readonly totalMemoryGiB: number;
  /** 1, 5 and 15 minute load averages when the run started; on a shared machine, read results against them. */
  readonly loadAverage: readonly number[];
  /** The same when the run ended. */
  readonly loadAverageAtEnd?: readonly number[];
  readonly redisServer: string;
}

export interface FailoverReport {
  readonly generatedAt: string;
  readonly config: BenchConfig;
  readonly machine: MachineInfo;
  readonly systems: readonly (SystemRun & { readonly summary: SystemSummary })[];
  readonly ratio: {
    readonly metric: string;
    /** Shardguard's median over Sentinel's; null unless both ran with at least one successful trial. */
    readonly value: number | null;
    readonly p99: number | null;
    readonly target: number;
    /** Median ratio within target and no false failover on Shardguard's side; null when not measurable. */
    readonly met: boolean | null;
  };
}

export const RATIO_TARGET = 0.8;

export function machineInfo(): MachineInfo {
  const cpus = os.cpus();
  const version = spawnSync("redis-server", ["--version"], { encoding: "utf8", timeout: 5000 });
  return {
    cpus: cpus.length,
    cpuModel: cpus[0]?.model.trim() ?? "unknown",
    node: process.version,
    platform: `${os.platform()} ${os.release()} ${os.arch()}`,
    totalMemoryGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
    loadAverage: loadAverage(),
    redisServer: version.stdout?.trim() || "redis-server not found",
  };
}

export function loadAverage(): number[] {
  return os.loadavg().map((load) => Math.round(load * 100) / 100);
}

export function summarizeRun(run: SystemRun): SystemSummary {
  const ok = run.trials.filter((trial) => trial.failoverMs !== undefined);
  const phaseNames = [...new Set(run.trials.flatMap((trial) => Object.keys(trial.phases ?? {})))];
  const phases: Record<string, Summary> = {};
  for (const name of phaseNames) {
    const summary = summarize(run.trials.flatMap((trial) => trial.phases?.[name] ?? []));
    if (summary) phases[name] = summary;
  }
  return {
    successfulTrials: ok.length,
    failedTrials: run.trials.length - ok.length,
    failoverMs: summarize(ok.map((trial) => trial.failoverMs as number)),
    advertisedMs: summarize(run.trials.flatMap((trial) => trial.advertisedMs ?? [])),
    lostWrites: {
      total: run.trials.reduce((sum, trial) => sum + trial.lostWrites, 0),
      perTrial: summarize(run.trials.map((trial) => trial.lostWrites)),
    },
    falseFailovers: run.falseFailovers.length,
    phases,
    ...(clientBreakdown(run.trials) ? { client: clientBreakdown(run.trials) } : {}),
  };
}

export function buildReport(
  config: BenchConfig,
  machine: MachineInfo,
  runs: readonly SystemRun[],
): FailoverReport {
  const systems = runs.map((run) => ({ ...run, summary: summarizeRun(run) }));
  const sentinel = systems.find((system) => system.name === "sentinel")?.summary;
  const shardguard = systems.find((system) => system.name === "shardguard")?.summary;
  const value =
    sentinel?.failoverMs && shardguard?.failoverMs
      ? shardguard.failoverMs.median / sentinel.failoverMs.median
      : null;
  const p99 =
    sentinel?.failoverMs && shardguard?.failoverMs
      ? shardguard.failoverMs.p99 / sentinel.failoverMs.p99
      : null;
  return {
    generatedAt: new Date().toISOString(),
    config,
    machine,
    systems,
    ratio: {
      metric: "median kill -> first acknowledged write on the new primary, shardguard / sentinel",
      value,
      p99,
      target: RATIO_TARGET,
      met:
        value === null || !shardguard
          ? null
          : value <= RATIO_TARGET && shardguard.falseFailovers === 0 && shardguard.failedTrials === 0,
    },
  };
}

/** Pads columns to a common width; numeric-looking cells are right-aligned. */
export function formatTable(headers: readonly string[], rows: readonly (readonly string[])[]): string {
  const widths = headers.map((header, column) =>
    Math.max(header.length, ...rows.map((row) => (row[column] ?? "").length)),
  );
  const numeric = (cell: string) => /^[-+]?[\d,.]+( ?ms|%|x)?$|^(n\/a|-)$/.test(cell);
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, column) =>
        numeric(cell) ? cell.padStart(widths[column] ?? 0) : cell.padEnd(widths[column] ?? 0),
      )
      .join("  ")
      .trimEnd();
  return [line(headers), line(widths.map((width) => "-".repeat(width))), ...rows.map(line)].join("\n");
}

const ms = (value: number | undefined) =>
  value === undefined ? "-" : Math.round(value).toLocaleString("en-US");

/** The human-readable report: per-trial rows, a summary per system, phases, and the ratio. */
export function formatReport(report: FailoverReport): string {
  const { config, machine } = report;
  const out: string[] = [
    `Failover benchmark: ${config.trials} trials per system, failure timeout ${config.failureTimeoutMs} ms, ` +
      `${machine.cpus} CPUs, node ${machine.node}, ${machine.redisServer.split(" ").slice(0, 3).join(" ")}`,
    `Load average at start ${machine.loadAverage.join(" ")}` +
      (machine.loadAverageAtEnd ? `, at end ${machine.loadAverageAtEnd.join(" ")}` : ""),
    "",
    "Per trial: ms from SIGKILL of the primary to the first write acknowledged by the new primary",
    formatTable(
      [
        "system",
        "trial",
        "failover ms",
        "advertised ms",
        "lost at failover",
        "lost in trial",
        "failed writes",
        "old -> new primary",
        "note",
      ],
      report.systems.flatMap((system) =>
        system.trials.map((trial) => [
          system.name,
          String(trial.trial),
          ms(trial.failoverMs),
          ms(trial.advertisedMs),
          String(trial.lostAtFailover),
          String(trial.lostWrites),
          String(trial.failedWrites),
          `${trial.oldPrimary} -> ${trial.newPrimary ?? "?"}`,
          trial.error ?? "",
        ]),
      ),
    ),
    "",
    "Summary",
    formatTable(
      [
        "system",
        "ok/trials",
        "median ms",
        "p99 ms",
        "mean ms",
        "min ms",
        "max ms",
        "lost writes",
        "lost at end",
        "acked writes",
        "false failovers",
      ],
      report.systems.map(({ name, summary, trials, writer }) => [
        name,
        `${summary.successfulTrials}/${trials.length}`,
        ms(summary.failoverMs?.median),
        ms(summary.failoverMs?.p99),
        ms(summary.failoverMs?.mean),
        ms(summary.failoverMs?.min),
        ms(summary.failoverMs?.max),
        String(summary.lostWrites.total),
        String(writer.lostAtEnd),
        String(writer.acked),
        String(summary.falseFailovers),
      ]),
    ),
  ];
  for (const system of report.systems) {
    const names = Object.keys(system.summary.phases);
    if (names.length === 0) continue;
    out.push(
      "",
      `Phases of ${system.name} (median ms; each phase starts where the previous ended, the first at the kill)`,
      formatTable(names, [names.map((name) => ms(system.summary.phases[name]?.median))]),
    );
  }
  const clients = report.systems.filter((system) => system.summary.client);
  if (clients.length > 0) {
    out.push(
      "",
      "Where the Sentinel client's time goes (median ms; advertised = the system first named the new primary)",
      formatTable(
        ["system", "kill -> contact", "advertised -> contact", "advertised -> ack", "contact -> ack"],
        clients.map(({ name, summary }) => [
          name,
          ms(summary.client?.killToContactMs?.median),
          ms(summary.client?.advertisedToContactMs?.median),
          ms(summary.client?.advertisedToAckMs?.median),
          ms(summary.client?.contactToAckMs?.median),
        ]),
      ),
    );
  }
  for (const system of report.systems) {
    if (system.error) out.push("", `${system.name} stopped early: ${system.error}`);
    for (const falseFailover of system.falseFailovers) {
      out.push(`${system.name} false failover ${falseFailover.when}: ${falseFailover.detail}`);
    }
  }
  const { ratio } = report;
  out.push(
    "",
    ratio.value === null
      ? `Ratio shardguard/sentinel: n/a (needs both systems with a successful trial); target <= ${ratio.target}`
      : `Ratio shardguard/sentinel: median ${ratio.value.toFixed(2)}, p99 ${ratio.p99?.toFixed(2)}; ` +
          `target <= ${ratio.target}: ${ratio.met ? "met" : "NOT met"}`,
  );
  return out.join("\n");
}

/** Writes failover.json and failover.svg into `outDir`; returns their paths. */
export function writeReport(
  report: FailoverReport,
  outDir: string,
  baseName = "failover",
  title = "Failover: SIGKILL of the primary to first acknowledged write",
): { json: string; svg: string } {
  mkdirSync(outDir, { recursive: true });
  const json = join(outDir, `${baseName}.json`);
  const svg = join(outDir, `${baseName}.svg`);
  writeFileSync(json, `${JSON.stringify(report, null, 2)}\n`);
  writeFileSync(
    svg,
    renderFailoverChart(
      report.systems.map((system) => ({
        name: system.name,
        values: system.trials.flatMap((trial) => trial.failoverMs ?? []),
      })),
      {
        title,
        subtitle: `failure timeout ${report.config.failureTimeoutMs} ms, ${report.config.trials} trials, ${report.machine.cpus} CPUs`,
        yLabel: "kill → first acknowledged write (ms)",
        references: [
          {
            label: `failure timeout ${report.config.failureTimeoutMs} ms`,
            value: report.config.failureTimeoutMs,
          },
        ],
      },
    ),
  );
  return { json, svg };
}
