import { setTimeout as sleep } from "node:timers/promises";
import { Command, InvalidArgumentError } from "commander";
import { parseIntegerOption } from "../src/cli/options.ts";
import { abortOnSignal } from "../src/cli/signals.ts";
import {
  type FailoverConfig,
  parseFailoverConfig,
  QUORUM_MODES,
  type QuorumMode,
} from "../src/core/config.ts";
import { errorMessage } from "../src/core/errors.ts";
import { LocalCluster } from "../src/dev/local-cluster.ts";
import { WriteWorkload } from "../src/dev/workload/writer.ts";
import { loadAverage, machineInfo } from "./lib/report.ts";

/**
 * The long soak: one shard of real processes (redis-server nodes, their `shardguard agent`
 * processes, a `shardguard controller`) runs for N minutes while every agent is frozen now and
 * then (SIGSTOP, then SIGCONT) for a random time shorter than the failure timeout. No database
 * is ever killed, so every change of epoch is a false failover. A freeze near the failure timeout
 * does make the primary's heartbeat stale; what the soak measures is whether the controller then
 * fails over anyway (it must not: the replicas still see their primary, so the majority quorum is
 * not met) and how often it had to be held back. Optionally every agent is also stalled at once
 * now and then (`--stall-all-every`), as when the agents' path to the table fails for all of them.
 * A writer writes all along; its acknowledged writes are checked on the final primary.
 */

const log = (line: string) => process.stderr.write(`${line}\n`);

export interface SoakOptions {
  readonly minutes: number;
  readonly nodes: number;
  readonly config: FailoverConfig;
  /** Shortest and longest freeze of one agent, ms. */
  readonly freezeMinMs: number;
  readonly freezeMaxMs: number;
  /** Mean pause between two freezes of the same agent, ms (exponentially distributed). */
  readonly meanGapMs: number;
  /**
   * Mean pause between two stalls of every agent at once (a correlated stall: the agents' path to
   * the table, or their host), ms; 0 for none.
   */
  readonly stallAllEveryMs: number;
  readonly seed: number;
  /** Write continuously and check the acknowledged writes at the end. */
  readonly writes: boolean;
}

export interface EpochChange {
  /** s since the soak began. */
  readonly atS: number;
  readonly epoch: number;
  readonly status: string | undefined;
  readonly primary: string | undefined;
  /** From the history record of that epoch, when one was written. */
  readonly kind: string | undefined;
  readonly reason: string | undefined;
}

export interface SoakReport {
  readonly shard: string;
  readonly minutes: number;
  readonly config: FailoverConfig;
  readonly jitter: {
    freezeMinMs: number;
    freezeMaxMs: number;
    meanGapMs: number;
    stallAllEveryMs: number;
    seed: number;
  };
  readonly freezes: {
    readonly total: number;
    readonly byNode: Readonly<Record<string, number>>;
    readonly totalFrozenS: number;
    readonly longestMs: number;
    /** Freezes of the agent beside the node that was primary when the freeze began. */
    readonly ofPrimary: number;
    /** Samples in which every agent was frozen at once. */
    readonly allFrozenSamples: number;
    /** Stalls of every agent at once (`stallAllEveryMs`). */
    readonly stallsOfAll: number;
  };
  /** Epoch changes without a kill. */
  readonly falseFailovers: number;
  readonly epochChanges: readonly EpochChange[];
  readonly primaryStale: {
    /** Watch samples (every `sampleMs`) in which the primary's heartbeat was older than the failure timeout. */
    readonly samples: number;
    readonly sampleMs: number;
    readonly episodes: number;
    readonly maxAgeMs: number;
    /** Controller log: times it found the primary stale and held back because the quorum was not met. */
    readonly heldBackByQuorum: number;
    /** Controller log: times it held back because not one agent of the shard was heard. */
    readonly heldBackNoAgentHeard: number;
  };
  readonly writes:
    | {
        acked: number;
        failedWrites: number;
        checked: number;
        lost: number;
        failures: Record<string, number>;
        /** The most frequent failure messages (numbers masked), with their counts. */
        messages: Record<string, number>;
      }
    | undefined;
  /** Agent logs: a primary's agent fenced its writes (self-fencing after it could not write a heartbeat). */
  readonly selfFences: number;
  readonly loadAverage: { start: number[]; end: number[] };
  readonly cpus: number;
}

/** Small seeded generator (mulberry32): a run can be repeated with the same freeze schedule. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface FreezeStats {
  total: number;
  byNode: Record<string, number>;
  frozenMs: number;
  longestMs: number;
  ofPrimary: number;
  stallsOfAll: number;
}

/**
 * SIGSTOP/SIGCONT with a count per agent: an agent frozen by its own jitter and by a stall of all
 * agents at once runs again only when both are over.
 */
class Freezer {
  readonly #cluster: LocalCluster;
  readonly #holds = new Map<string, number>();

  constructor(cluster: LocalCluster) {
    this.#cluster = cluster;
  }

  freeze(id: string): boolean {
    const holds = this.#holds.get(id) ?? 0;
    if (holds === 0 && !this.#cluster.signalAgent(id, "SIGSTOP")) return false;
    this.#holds.set(id, holds + 1);
    return true;
  }

  thaw(id: string): void {
    const holds = (this.#holds.get(id) ?? 0) - 1;
    this.#holds.set(id, Math.max(0, holds));
    if (holds <= 0) this.#cluster.signalAgent(id, "SIGCONT");
  }

  get frozen(): number {
    return [...this.#holds.values()].filter((holds) => holds > 0).length;
  }
}

/** Freezes `ids` together for one random sub-failure-timeout period; always thaws them. */
async function freezeFor(
  freezer: Freezer,
  ids: readonly string[],
  options: SoakOptions,
  next: () => number,
  stats: FreezeStats,
  primary: string | undefined,
): Promise<void> {
  const freezeMs = options.freezeMinMs + next() * (options.freezeMaxMs - options.freezeMinMs);
  const frozen = ids.filter((id) => freezer.freeze(id));
  try {
    for (const id of frozen) {
      stats.total += 1;
      stats.byNode[id] = (stats.byNode[id] ?? 0) + 1;
      if (primary === id) stats.ofPrimary += 1;
    }
    stats.longestMs = Math.max(stats.longestMs, freezeMs);
    stats.frozenMs += freezeMs * frozen.length;
    // Not abortable: a freeze always ends with SIGCONT.
    await sleep(freezeMs);
  } finally {
    for (const id of frozen) freezer.thaw(id);
  }
}

/** Repeats `round` after exponentially distributed pauses of mean `meanGapMs` until `signal`. */
async function everySoOften(
  meanGapMs: number,
  next: () => number,
  signal: AbortSignal,
  round: () => Promise<void>,
): Promise<void> {
  while (!signal.aborted) {
    await sleep(-Math.log(1 - next()) * meanGapMs, undefined, { signal }).catch(() => {});
    if (signal.aborted) return;
    await round();
  }
}

export async function runSoak(
  options: SoakOptions,
  signal: AbortSignal,
  progress: (line: string) => void,
): Promise<SoakReport> {
  const loadAtStart = loadAverage();
  const cluster = await LocalCluster.start({
    nodes: options.nodes,
    config: options.config,
    onProgress: progress,
    readyTimeoutMs: 60_000,
  });
  const writer = options.writes
    ? new WriteWorkload({ resolvePrimary: () => cluster.primaryAddress(), writeIntervalMs: 20 })
    : undefined;
  const failureMessages = new Map<string, number>();
  writer?.on("failure", (failure) => {
    const text = `${failure.kind}: ${failure.message.replace(/\d+/g, "N")}`;
    failureMessages.set(text, (failureMessages.get(text) ?? 0) + 1);
  });
  const inject = new AbortController();
  const stopInjecting = () => inject.abort();
  signal.addEventListener("abort", stopInjecting);
  const freezes: FreezeStats = {
    total: 0,
    byNode: {},
    frozenMs: 0,
    longestMs: 0,
    ofPrimary: 0,
    stallsOfAll: 0,
  };
  const freezer = new Freezer(cluster);
  const changes: Array<Omit<EpochChange, "kind" | "reason">> = [];
  const sampleMs = 100;
  const stale = { samples: 0, episodes: 0, maxAgeMs: 0, inEpisode: false };
  let allFrozenSamples = 0;
  try {
    const initial = await cluster.topology();
    let epoch = initial?.epoch ?? 0;
    let primary = initial?.primary_node_id;
    progress(
      `shard ${cluster.shard} online (epoch ${epoch}, primary ${primary}); soaking for ${options.minutes} min with agent freezes of ${options.freezeMinMs}-${options.freezeMaxMs} ms`,
    );
    writer?.start();
    const next = random(options.seed);
    const ids = cluster.redis.map((node) => node.id);
    const jitters = ids.map((id) =>
      everySoOften(options.meanGapMs, next, inject.signal, () =>
        freezeFor(freezer, [id], options, next, freezes, primary),
      ),
    );
    if (options.stallAllEveryMs > 0) {
      jitters.push(
        everySoOften(options.stallAllEveryMs, next, inject.signal, () => {
          freezes.stallsOfAll += 1;
          return freezeFor(freezer, ids, options, next, freezes, primary);
        }),
      );
    }
    const started = performance.now();
    const endAt = started + options.minutes * 60_000;
    let lastReport = started;
    while (performance.now() < endAt && !signal.aborted) {
      const snapshot = await cluster.snapshot().catch(() => undefined);
      const topology = snapshot?.topology;
      if (topology && topology.epoch !== epoch) {
        epoch = topology.epoch;
        changes.push({
          atS: Math.round((performance.now() - started) / 100) / 10,
          epoch,
          status: topology.status,
          primary: topology.primary_node_id ?? topology.failover?.new_primary_node_id,
        });
        progress(`epoch changed to ${epoch} (${topology.status}) with no kill: a false failover`);
      }
      if (topology?.primary_node_id) primary = topology.primary_node_id;
      const heartbeat = snapshot && primary ? cluster.heartbeatOf(snapshot, primary) : undefined;
      if (heartbeat) {
        const ageMs = cluster.aws.clock.now() - heartbeat.last_updated / 1000;
        stale.maxAgeMs = Math.max(stale.maxAgeMs, ageMs);
        const isStale = ageMs > options.config.failureTimeoutMs;
        if (isStale) stale.samples += 1;
        if (isStale && !stale.inEpisode) stale.episodes += 1;
        stale.inEpisode = isStale;
      }
      if (freezer.frozen === cluster.redis.length) allFrozenSamples += 1;
      if (performance.now() - lastReport > 60_000) {
        lastReport = performance.now();
        progress(
          `${Math.round((lastReport - started) / 60_000)} min: ${freezes.total} freezes, ${stale.episodes} stale-primary episodes, ${changes.length} false failovers` +
            (writer ? `, ${writer.stats().acked} writes acknowledged` : ""),
        );
      }
      await sleep(sampleMs, undefined, { signal }).catch(() => {});
    }
    stopInjecting();
    await Promise.all(jitters);
    await writer?.stop();

    const history = await cluster.aws.store.history.list(cluster.shard, 1000);
    const epochChanges = changes.map((change) => {
      const record = history.find((candidate) => candidate.epoch === change.epoch);
      return { ...change, kind: record?.kind, reason: record?.reason };
    });
    const decisions = cluster.controllerLogLines();
    const heldBackByQuorum = decisions.filter((line) => line.code === "quorum_not_met").length;
    const heldBackNoAgentHeard = decisions.filter((line) => line.code === "no_agent_heard").length;
    let writes: SoakReport["writes"];
    if (writer) {
      const finalPrimary = cluster.redis.find((node) => node.address === writer.stats().lastAck?.address);
      const client = (finalPrimary ?? cluster.node(primary ?? "node-1")).client();
      try {
        const verified = await writer.verify(client);
        const stats = writer.stats();
        writes = {
          acked: stats.acked,
          failedWrites: stats.failedWrites,
          checked: verified.checked,
          lost: verified.lost.length,
          failures: Object.fromEntries(Object.entries(stats.failures).filter(([, count]) => count > 0)),
          messages: Object.fromEntries([...failureMessages].sort((a, b) => b[1] - a[1]).slice(0, 5)),
        };
      } finally {
        client.disconnect();
      }
    }
    const selfFences = cluster.redis
      .flatMap((node) => cluster.logLines(`agent-${node.id}.log`))
      .filter((line) => String(line.message).startsWith("writes fenced")).length;
    return {
      shard: cluster.shard,
      minutes: Math.round(((performance.now() - started) / 60_000) * 100) / 100,
      config: options.config,
      jitter: {
        freezeMinMs: options.freezeMinMs,
        freezeMaxMs: options.freezeMaxMs,
        meanGapMs: options.meanGapMs,
        stallAllEveryMs: options.stallAllEveryMs,
        seed: options.seed,
      },
      freezes: {
        total: freezes.total,
        byNode: freezes.byNode,
        totalFrozenS: Math.round(freezes.frozenMs / 100) / 10,
        longestMs: Math.round(freezes.longestMs),
        ofPrimary: freezes.ofPrimary,
        allFrozenSamples,
        stallsOfAll: freezes.stallsOfAll,
      },
      falseFailovers: epochChanges.length,
      epochChanges,
      primaryStale: {
        samples: stale.samples,
        sampleMs,
        episodes: stale.episodes,
        maxAgeMs: Math.round(stale.maxAgeMs),
        heldBackByQuorum,
        heldBackNoAgentHeard,
      },
      writes,
      selfFences,
      loadAverage: { start: loadAtStart, end: loadAverage() },
      cpus: machineInfo().cpus,
    };
  } finally {
    signal.removeEventListener("abort", stopInjecting);
    stopInjecting();
    await writer?.stop();
    await cluster.stop();
  }
}

export function formatSoakReport(report: SoakReport): string {
  const { config, freezes, primaryStale, writes } = report;
  const lines = [
    `soak of shard ${report.shard}: ${report.minutes} min, ${report.cpus} CPUs, load average ${report.loadAverage.start.join(" ")} -> ${report.loadAverage.end.join(" ")}`,
    `timing: heartbeat ${config.heartbeatIntervalMs} ms, failure timeout ${config.failureTimeoutMs} ms, fence timeout ${config.fenceTimeoutMs} ms, tick ${config.tickIntervalMs} ms, quorum ${config.quorum}, cool-down ${config.cooldownMs} ms`,
    `jitter: agents frozen ${freezes.total} times (${Object.entries(freezes.byNode)
      .map(([node, count]) => `${node} ${count}`)
      .join(
        ", ",
      )}; ${freezes.ofPrimary} of the primary's agent), ${freezes.totalFrozenS} s in all, longest ${freezes.longestMs} ms, every agent frozen at once in ${freezes.allFrozenSamples} samples (${freezes.stallsOfAll} deliberate stalls of all agents)`,
    `primary heartbeat stale (> failure timeout) in ${primaryStale.episodes} episodes (${primaryStale.samples} samples of ${primaryStale.sampleMs} ms), oldest ${primaryStale.maxAgeMs} ms; controller held back by the quorum ${primaryStale.heldBackByQuorum} times, for want of any agent heard ${primaryStale.heldBackNoAgentHeard} times`,
    `FALSE FAILOVERS (epoch changes with no kill): ${report.falseFailovers}`,
    ...report.epochChanges.map(
      (change) =>
        `  +${change.atS} s: epoch ${change.epoch} ${change.status} primary ${change.primary ?? "-"} (${change.kind ?? "no history"}): ${change.reason ?? ""}`,
    ),
  ];
  if (writes) {
    lines.push(
      `writes: ${writes.acked} acknowledged, ${writes.failedWrites} failed, ${writes.lost} of ${writes.checked} acknowledged writes lost` +
        (Object.keys(writes.failures).length > 0 ? ` (failures: ${JSON.stringify(writes.failures)})` : ""),
      ...Object.entries(writes.messages).map(([message, count]) => `  ${count} x ${message}`),
    );
  }
  lines.push(`primary agents that fenced their own writes after a freeze: ${report.selfFences} times`);
  return lines.join("\n");
}

function parseQuorum(value: string): QuorumMode {
  if (!(QUORUM_MODES as readonly string[]).includes(value)) {
    throw new InvalidArgumentError(`expected one of ${QUORUM_MODES.join(", ")}, got "${value}"`);
  }
  return value as QuorumMode;
}

interface CliOptions {
  minutes: number;
  heartbeatInterval: number;
  failureTimeout: number;
  fenceTimeout?: number;
  tickInterval: number;
  quorum: QuorumMode;
  cooldown: number;
  freezeMin?: number;
  freezeMax?: number;
  meanGap: number;
  stallAllEvery: number;
  seed: number;
  writes: boolean;
  json?: boolean;
}

export function buildProgram(): Command {
  return new Command()
    .name("soak")
    .description(
      "run one shard of real processes for N minutes, freezing agents (SIGSTOP/SIGCONT) for random " +
        "sub-failure-timeout periods, and count false failovers (epoch changes with no kill)",
    )
    .option("--minutes <n>", "how long to soak", parseIntegerOption(1, 24 * 60), 30)
    .option("--heartbeat-interval <ms>", "agents' heartbeat interval", parseIntegerOption(100, 60_000), 1000)
    .option("--failure-timeout <ms>", "controller's failure timeout", parseIntegerOption(200, 600_000), 3000)
    .option(
      "--fence-timeout <ms>",
      "agents' fence timeout (default: 2/3 of the failure timeout)",
      parseIntegerOption(100, 600_000),
    )
    .option("--tick-interval <ms>", "controller's tick interval", parseIntegerOption(100, 60_000), 1000)
    .option("--quorum <mode>", `quorum mode (${QUORUM_MODES.join(", ")})`, parseQuorum, "majority")
    .option(
      "--cooldown <ms>",
      "cool-down after a failover (0 counts every false failover)",
      parseIntegerOption(0, 3_600_000),
      0,
    )
    .option(
      "--freeze-min <ms>",
      "shortest agent freeze (default: 10% of the failure timeout)",
      parseIntegerOption(1, 600_000),
    )
    .option(
      "--freeze-max <ms>",
      "longest agent freeze (default: the failure timeout)",
      parseIntegerOption(1, 600_000),
    )
    .option(
      "--mean-gap <ms>",
      "mean pause between two freezes of one agent",
      parseIntegerOption(0, 600_000),
      3000,
    )
    .option(
      "--stall-all-every <ms>",
      "mean pause between stalls of every agent at once (0: none)",
      parseIntegerOption(0, 3_600_000),
      0,
    )
    .option("--seed <n>", "seed of the freeze schedule", parseIntegerOption(0, 2 ** 31), 1)
    .option("--no-writes", "no writer")
    .option("--json", "print the report as JSON on stdout")
    .action(async (options: CliOptions) => {
      const config = parseFailoverConfig({
        heartbeatIntervalMs: options.heartbeatInterval,
        failureTimeoutMs: options.failureTimeout,
        fenceTimeoutMs: options.fenceTimeout ?? Math.floor((options.failureTimeout * 2) / 3),
        tickIntervalMs: options.tickInterval,
        quorum: options.quorum,
        cooldownMs: options.cooldown,
      });
      const freezeMaxMs = options.freezeMax ?? config.failureTimeoutMs;
      const freezeMinMs = Math.min(
        options.freezeMin ?? Math.floor(config.failureTimeoutMs / 10),
        freezeMaxMs,
      );
      const abort = abortOnSignal();
      // A second Ctrl-C exits at once; process.exit still runs the hooks that kill every child by PID.
      abort.signal.addEventListener("abort", () => process.once("SIGINT", () => process.exit(130)));
      const report = await runSoak(
        {
          minutes: options.minutes,
          nodes: 3,
          config,
          freezeMinMs,
          freezeMaxMs,
          meanGapMs: options.meanGap,
          stallAllEveryMs: options.stallAllEvery,
          seed: options.seed,
          writes: options.writes,
        },
        abort.signal,
        (line) => log(`[soak] ${line}`),
      );
      process.stdout.write(`${options.json ? JSON.stringify(report, null, 2) : formatSoakReport(report)}\n`);
      if (report.falseFailovers > 0 || (report.writes?.lost ?? 0) > 0) process.exitCode = 1;
    });
}

if (import.meta.main) {
  try {
    await buildProgram().parseAsync(process.argv);
  } catch (error) {
    log(`soak: ${errorMessage(error)}`);
    process.exitCode = 1;
  }
  process.exit();
}
