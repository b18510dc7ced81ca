import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { type FailoverConfig, type FailoverConfigInput, parseFailoverConfig } from "../../core/config.ts";
import { dataLineageOf, decide } from "../../core/decide.ts";
import { errorMessage } from "../../core/errors.ts";
import type { Topology } from "../../core/model.ts";
import { PROMOTION_FENCE_WINDOW_MS } from "../../core/write-guard.ts";
import { codeVersion } from "../code-version.ts";
import { LocalCluster } from "../local-cluster.ts";
import { freePort, type ManagedProcess } from "../local-stack/processes.ts";
import { FENCED_START_ARGS, type NodeNetwork, RedisNode } from "../local-stack/redis-nodes.ts";
import { type LocalStack, startLocalStack } from "../local-stack/stack.ts";
import { NetLab, type PartitionSpec } from "../netlab/netlab.ts";
import { type CheckResult, check } from "./checker.ts";
import { buildClockShim } from "./clock-shim.ts";
import { CommandTap } from "./command-tap.ts";
import {
  agentProtects,
  copiesUncertain,
  intactCopies,
  primaryRolledBack as isPrimaryRolledBack,
  type RoleRead,
} from "./copies.ts";
import {
  capZeros,
  describeFault,
  drawPriorities,
  FAULT_KINDS,
  type FaultKind,
  MakeUps,
  type ScheduledFault,
  type ScheduleOptions,
  scheduleFaults,
} from "./faults.ts";
import { type EpochValue, type FaultValue, History, type WriteValue } from "./history.ts";
import { mostDataFirst, OnCallOperator, OPERATOR_GIVES, recoverCandidates } from "./on-call.ts";
import { Random } from "./random.ts";
import { DYNAMODB_INTERNAL_ERROR, DYNAMODB_THROTTLED, PASS, type ProxyMode, TcpProxy } from "./tcp-proxy.ts";
import {
  NemesisWriter,
  readFinalWithRereads,
  readRoles,
  type SampledNode,
  StrayWriter,
  TopologyObserver,
  WritableSampler,
} from "./workload.ts";

/**
 * One nemesis run: the local stack (or the endpoints in the environment), N redis-server nodes with
 * a `shardguard agent` each, two `shardguard controller` processes, every agent and controller
 * talking to DynamoDB and SQS through its own TCP proxy; the writer, the sampler and the observer
 * recording into one history; the seeded fault schedule injected and healed on time; at the end
 * every fault healed, the shard given time to settle, the final reads, and the checker's verdict.
 */

/** Timings for the run: a failover within seconds on two shared cores; a lease short enough to pause past. */
export const NEMESIS_CONFIG = {
  heartbeatIntervalMs: 500,
  failureTimeoutMs: 2000,
  fenceTimeoutMs: 1300,
  tickIntervalMs: 1000,
  lockLeaseMs: 5000,
  cooldownMs: 0,
} as const satisfies FailoverConfigInput;

/**
 * The fence window docs/agent.md states ("Promotion window": a promoted node refuses writes until
 * 3 s after its last contact with the old primary): the only time two writable nodes are tolerated.
 */
export const FENCE_WINDOW_MS = 3000;

/**
 * Guarantee 3's bound with every fault healed (docs/safety.md: "replaced within the failure timeout
 * plus the graces"): the failure timeout, the waits of up to 3 failure timeouts
 * (REPLICA_AHEAD_GRACE), the promotion window, one controller tick, and 2 s for a client to re-read
 * the topology and connect.
 */
export function availabilityLimitMs(config: FailoverConfig): number {
  return 4 * config.failureTimeoutMs + PROMOTION_FENCE_WINDOW_MS + config.tickIntervalMs + 2000;
}

/** How long the on-call operator takes to act on a page (OnCallOperator). */
const OPERATOR_PAGE_MS = 10_000;

/** How long the shard may stay offline after heal-all before the nemesis recovers it as an operator. */
const OPERATOR_PATIENCE_MS = 20_000;

/** How long a live node whose settle or final read failed is read again before it is judged unread. */
const FINAL_REREAD_MS = 15_000;

/**
 * `shardguard recover` on the live node with the most data, when the controller reports the
 * offline shard has no candidate; what was done (or why nothing), as one sentence. When that node
 * has priority 0 the operator does what the hold's reason says instead (gate
 * `priority_zero_ahead_offline`): restarts its agent with a priority, and the controller brings the
 * shard back on it. Recovering on a node with less would drop what only it holds (nemesis seed
 * 4711: `recover --to node-3`, restarted from an older RDB, lost 3 writes node-1 held at priority 0).
 */
async function recoverAsOperator(
  active: LocalCluster,
  config: FailoverConfig,
  givePriority: (id: string) => void,
): Promise<string> {
  const snapshot = await active.snapshot();
  const decision = decide(snapshot, config, active.aws.clock.now());
  if (decision.kind !== "none" || decision.code !== "offline_no_candidate") {
    return `not recovered: the controller's decision is ${decision.kind}${decision.kind === "none" ? `/${decision.code}` : ""}`;
  }
  // What an operator reads in `shardguard status`: a fenced node restarted from its RDB holds its
  // earlier lineage (`prior_lineage`), and may hold more than any node that answers as itself.
  // A holder of the stored lineage first; only when no live node holds it, the most data.
  const now = active.aws.clock.now();
  const node = recoverCandidates(snapshot, config, now)[0] ?? mostDataFirst(snapshot, config, now)[0];
  if (node === undefined) return "not recovered: no live node";
  const keep = { node, data: dataLineageOf(node) };
  if (keep.node.priority === 0) {
    givePriority(keep.node.node_id);
    return (
      `operator: ${keep.node.node_id} holds the most data (lineage ${keep.data.repl_id} up to ${keep.data.last_txn_id}) ` +
      `at priority 0: its agent restarted with --priority ${OPERATOR_GIVES}, for the controller to bring the shard back on it`
    );
  }
  const result = await active.runCli([
    "recover",
    "--shard",
    active.shard,
    "--to",
    keep.node.node_id,
    "--reason",
    "nemesis: offline_no_candidate after heal-all; keeping the live node that holds the most data",
  ]);
  return result.code === 0
    ? `operator recovery: shardguard recover --to ${keep.node.node_id} (holds lineage ${keep.data.repl_id} up to ${keep.data.last_txn_id})`
    : `operator recovery refused: ${(result.stderr || result.stdout).trim().split("\n").pop()}`;
}

/** libfaketime, preloaded into an agent for `clock-skew` (what the `faketime` wrapper does, without its extra process). */
const LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

export interface NemesisOptions {
  readonly seed: number;
  readonly minutes: number;
  readonly nodes?: number;
  readonly faults?: readonly FaultKind[];
  readonly config?: FailoverConfigInput;
  /** Checker: tolerated two-writable time after an epoch change. @default FENCE_WINDOW_MS */
  readonly fenceWindowMs?: number;
  /** Checker (g3): longest stretch with no fault active and no acknowledged write. @default availabilityLimitMs(config) */
  readonly availabilityLimitMs?: number;
  /** Checker: a stretch without an acknowledged write longer than this is reported. @default 10000 */
  readonly maxWriteGapMs?: number;
  /** Checker: how long after its heal a fault may still cause an epoch change. @default 15000 */
  readonly causeWindowMs?: number;
  /** How long the final heal waits for one primary with every live node following it. @default 60000 */
  readonly settleTimeoutMs?: number;
  /**
   * How long a fault whose every target is busy with another fault waits for one to be free before
   * it is skipped (a scale-down's drains can hold the primary for 30-50 s). 0 keeps the recorded
   * runs' replays. @default 0
   */
  readonly busyWaitMs?: number;
  /**
   * How long a fault that would be skipped for any reason (no primary during a failover, the
   * copies rule while a node resyncs, its targets busy) is tried again, every 500 ms, before it is
   * skipped: the run then injects each kind about as often as it draws it. 0 keeps the recorded
   * runs' replays. @default 0
   */
  readonly retrySkippedMs?: number;
  /**
   * Make-ups (\`MakeUps\`, faults.ts): a later slot of a kind injected this many times goes to a
   * skipped fault of a kind below it. 0 or unset: none.
   */
  readonly makeUpQuota?: number;
  /** Passed to the schedule (gaps, concurrency, warm-up). */
  readonly schedule?: Partial<Pick<ScheduleOptions, "gapMinMs" | "gapMaxMs" | "maxConcurrent" | "warmupMs">>;
  /** Keep the agents' and controllers' logs (their temp dir) after the run. @default true */
  readonly keepLogs?: boolean;
  /** An already running stack (the integration tests share one). */
  readonly stack?: LocalStack;
  /** Where the JSONL history goes. @default a new temp dir */
  readonly historyPath?: string;
  /** One line per event (progress). */
  readonly onLine?: (line: string) => void;
  readonly signal?: AbortSignal;
}

export interface FaultOutcome {
  readonly id: number;
  readonly kind: FaultKind;
  readonly target: string;
  readonly nodes: readonly string[];
  readonly params: Readonly<Record<string, unknown>>;
  readonly injectedAtS: number;
  readonly healedAtS: number | undefined;
  readonly skipped: string | undefined;
  /** The fault hit the node that was primary when it was injected. */
  readonly hitPrimary: boolean;
  /** Epoch changes from the inject until the fault's outcome was read. */
  readonly epochs: ReadonlyArray<{ epoch: number; primary: string | undefined; atS: number }>;
  /** ms from the inject to the first write a new primary acknowledged (when there was a failover). */
  readonly timeToWritableMs: number | undefined;
  /** Longest gap between two acknowledged writes from the inject to the outcome. */
  readonly longestWriteGapMs: number;
  readonly lostByReplica: number;
  readonly lostAsyncOnly: number;
  readonly line: string;
}

export interface NemesisReport {
  readonly seed: number;
  readonly minutes: number;
  readonly nodes: number;
  readonly faultsEnabled: readonly FaultKind[];
  readonly config: FailoverConfig;
  readonly command: string;
  readonly shard: string;
  readonly historyPath: string;
  readonly logDir: string;
  readonly faultsByKind: Readonly<Record<string, { injected: number; skipped: number }>>;
  readonly failovers: number;
  readonly timeToWritableMs: {
    readonly median: number | undefined;
    readonly p99: number | undefined;
    readonly samples: number;
  };
  readonly writes: {
    readonly attempted: number;
    readonly ackedByReplica: number;
    readonly ackedAsyncOnly: number;
    readonly failed: number;
    readonly indeterminate: number;
    readonly lost: number;
    readonly asyncOnlyLost: number;
    readonly recovered: number;
    readonly unexpected: number;
  };
  readonly samples: number;
  readonly twoWritableSamples: number;
  /** Stretches with no acknowledged write longer than `maxWriteGapMs`, with the faults active then. */
  readonly unavailable: CheckResult["unavailable"];
  /** (g3) Stretches with every fault healed and no acknowledged write past the limit. */
  readonly availability: CheckResult["availability"];
  readonly availabilityLimitMs: number;
  /** Promotion priorities the run started with (`priorities` enabled), node-1 first. */
  readonly priorities: readonly number[] | undefined;
  /** Writes the stray writer sent to a node other than the advertised primary. */
  readonly strayWrites: number;
  readonly twoWritableInWindow: number;
  readonly settled: boolean;
  /** What the nemesis did as an operator when the shard stayed offline after heal-all, if anything. */
  readonly operatorRecovery: string | undefined;
  /** How often the on-call operator was paged: a priority-0 node alone held the data (OnCallOperator). */
  readonly operatorPages: number;
  /** Commands an agent had received that `dup-commands` sent to its queue again. */
  readonly duplicatedCommands: number;
  readonly settleMs: number;
  readonly valid: CheckResult["valid"];
  readonly violations: readonly string[];
  readonly lostSeqs: readonly number[];
  readonly timeline: readonly FaultOutcome[];
}

function percentile(values: readonly number[], p: number): number | undefined {
  if (values.length === 0) return undefined;
  const sorted = [...values].sort((x, y) => x - y);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)}`;

/** Faults hold resources so two faults never fight over one process or proxy. */
function resourcesOf(fault: Pick<ScheduledFault, "kind" | "params">, target: string): string[] {
  switch (fault.kind) {
    case "kill-redis":
    case "pause-redis":
      return [`redis:${target}`];
    case "restart-as-replica":
      return [`redis:${target}`];
    case "pause-agent":
    case "restart-agent":
    case "clock-skew":
    case "priorities":
      return [`agent:${target}`];
    case "kill-agent-long":
      // One agent dead for minutes at a time, make-ups included (BACKGROUND_REST_MS).
      return [`agent:${target}`, "background"];
    case "redis-clock-step":
      return [`clock:${target}`];
    case "operator":
      return ["operator"];
    case "membership":
      // One change at a time; a replaced node's processes are the fault's alone.
      return fault.params.change === "replace"
        ? ["membership", `redis:${target}`, `agent:${target}`]
        : ["membership"];
    case "partition-nodes":
      // The lab's heal lifts every cut: one partition at a time.
      return ["netlab"];
    case "store-slow":
    case "store-throttle":
    case "partition-agent-store":
      return [`store:${target}`];
    case "partition-agent-sqs":
    case "dup-commands":
    case "delay-commands":
      return [`sqs:${target}`];
    case "pause-controller":
      return [`controller:${target}`];
    case "partition-controller-store":
      return [`cstore:${target}`];
    case "store-outage":
      // Shares the store proxies with the partitions: cuts are counted (`cut`/`uncut`), so no
      // fault's heal lifts another's cut and neither has to wait for the other.
      return [];
  }
}

interface ActiveFault {
  readonly fault: ScheduledFault;
  readonly targets: readonly string[];
  heal: () => Promise<void>;
  healed: boolean;
}

export async function runNemesis(options: NemesisOptions): Promise<NemesisReport> {
  const line = options.onLine ?? (() => {});
  const nodeCount = options.nodes ?? 3;
  const config = parseFailoverConfig({ ...NEMESIS_CONFIG, ...options.config });
  const faultsEnabled = options.faults && options.faults.length > 0 ? [...options.faults] : [...FAULT_KINDS];
  const schedule = scheduleFaults(options.seed, {
    minutes: options.minutes,
    faults: faultsEnabled,
    nodes: nodeCount,
    lockLeaseMs: config.lockLeaseMs,
    ...options.schedule,
  });
  const controllersCount = 2;
  const historyPath =
    options.historyPath ??
    join(mkdtempSync(join(tmpdir(), `shardguard-nemesis-${options.seed}-`)), "history.jsonl");
  const history = new History({ path: historyPath });
  const gap =
    options.schedule?.gapMinMs !== undefined
      ? ` --gap ${options.schedule.gapMinMs}-${options.schedule.gapMaxMs ?? options.schedule.gapMinMs}`
      : "";
  const concurrent =
    options.schedule?.maxConcurrent !== undefined
      ? ` --max-concurrent ${options.schedule.maxConcurrent}`
      : "";
  const retry = `${options.retrySkippedMs ? ` --retry-skipped ${options.retrySkippedMs}` : ""}${options.makeUpQuota ? ` --make-up ${options.makeUpQuota}` : ""}`;
  const command = `npm run nemesis -- --minutes ${options.minutes} --seed ${options.seed}${options.faults ? ` --faults ${faultsEnabled.join(",")}` : ""} --nodes ${nodeCount}${gap}${concurrent}${retry}`;
  line(
    `seed ${options.seed}: ${schedule.length} faults over ${options.minutes} min (${command}); history ${historyPath}`,
  );

  const stack = options.stack ?? (await startLocalStack({ onProgress: (text) => line(`stack: ${text}`) }));
  const ownsStack = options.stack === undefined;
  // The run's node set: what faults target, the workload samples and the checker reads. `membership`
  // changes it at run time (scale adds two nodes for a while, replace swaps one for good).
  const nodeIds: string[] = Array.from({ length: nodeCount }, (_, index) => `node-${index + 1}`);
  const agentStore = new Map<string, TcpProxy>();
  const agentSqs = new Map<string, TcpProxy>();
  const controllerStore = new Map<string, TcpProxy>();
  const dynamoUrl = stack.env.AWS_ENDPOINT_URL_DYNAMODB;
  const sqsUrl = stack.env.AWS_ENDPOINT_URL_SQS;
  const received = new Map<string, CommandTap>();
  /** A node's agent's own proxies to DynamoDB and SQS (the latter tapped for `dup-commands`). */
  const addAgentProxies = (id: string): TcpProxy[] => {
    const storeProxy = TcpProxy.forUrl(dynamoUrl, `${id} -> DynamoDB`);
    agentStore.set(id, storeProxy);
    const sqsProxy = TcpProxy.forUrl(sqsUrl, `${id} -> SQS`);
    const tap = new CommandTap();
    sqsProxy.tap = (chunk, link) => tap.push(chunk, link);
    agentSqs.set(id, sqsProxy);
    received.set(id, tap);
    return [storeProxy, sqsProxy];
  };
  for (const id of nodeIds) addAgentProxies(id);
  let duplicatesSent = 0;
  for (let serial = 1; serial <= controllersCount; serial++) {
    controllerStore.set(
      `controller-${serial}`,
      TcpProxy.forUrl(dynamoUrl, `controller-${serial} -> DynamoDB`),
    );
  }
  const proxies = [...agentStore.values(), ...agentSqs.values(), ...controllerStore.values()];
  // `priorities`: random per-node priorities from the start, 0 included, never all 0.
  const priorities = faultsEnabled.includes("priorities")
    ? drawPriorities(options.seed, nodeCount)
    : undefined;
  const currentPriorities = new Map(nodeIds.map((id, index) => [id, priorities?.[index] ?? 100]));
  // `redis-clock-step`: every redis-server runs under the clock shim from its start (offset 0).
  let clockDir: string | undefined;
  let clockShim: string | undefined;
  let clockShimMissing: string | undefined;
  if (faultsEnabled.includes("redis-clock-step")) {
    clockDir = mkdtempSync(join(tmpdir(), "shardguard-nemesis-clock-"));
    try {
      clockShim = buildClockShim(clockDir);
      for (const id of nodeIds) writeFileSync(join(clockDir, `${id}.offset`), "0");
    } catch (error) {
      clockShimMissing = `no clock shim: ${errorMessage(error)}`;
      line(`redis-clock-step will be skipped: ${clockShimMissing}`);
    }
  }
  const clockFile = (id: string) => join(clockDir ?? tmpdir(), `${id}.offset`);
  // `partition-nodes`: every node in its own network namespace (src/dev/netlab), where there are.
  const labMissing = faultsEnabled.includes("partition-nodes") ? NetLab.unavailableReason() : undefined;
  const useLab = faultsEnabled.includes("partition-nodes") && labMissing === undefined;
  if (labMissing) line(`partition-nodes will be skipped: no network lab here (${labMissing})`);
  /** The lab's AWS address once it exists: the agents reach their proxies there. */
  let labAws: string | undefined;
  const viaLab = (url: string | undefined) =>
    url && labAws ? url.replace("//127.0.0.1:", `//${labAws}:`) : url;
  let cluster: LocalCluster | undefined;
  /**
   * Every redis-server the run started, retired ones included: a heal that restarts a node after a
   * membership change retired it would otherwise leave a process the cluster no longer stops, and
   * the run would not exit (nemesis 7211: a redis-server at a replaced node's address outlived the
   * report). The final cleanup stops them all.
   */
  const everStarted = new Set<RedisNode>();
  // Logs and the history stay when asked, and always after a run that did not pass.
  let keepLogs = options.keepLogs ?? true;
  try {
    await Promise.all(proxies.map((proxy) => proxy.start()));
    const agentEnv = (id: string): NodeJS.ProcessEnv => ({
      AWS_ENDPOINT_URL_DYNAMODB: viaLab(agentStore.get(id)?.urlFor(dynamoUrl)),
      AWS_ENDPOINT_URL_SQS: viaLab(agentSqs.get(id)?.urlFor(sqsUrl)),
    });
    cluster = await LocalCluster.start({
      stack,
      nodes: nodeCount,
      controllers: controllersCount,
      config,
      shard: `nemesis-${options.seed}-${Math.floor(performance.now()) % 100_000}`,
      readyTimeoutMs: 60_000,
      agentEnv,
      controllerEnv: (serial) => ({
        AWS_ENDPOINT_URL_DYNAMODB: controllerStore.get(`controller-${serial}`)?.urlFor(dynamoUrl),
      }),
      ...(priorities ? { priorities } : {}),
      ...(useLab
        ? {
            network: "netns" as const,
            onNetlab: async (lab: NetLab) => {
              labAws = lab.awsAddress;
              await Promise.all(
                [...agentStore.values(), ...agentSqs.values()].map((proxy) =>
                  proxy.listenAlso(lab.awsAddress),
                ),
              );
            },
          }
        : {}),
      ...(clockShim
        ? { redisEnv: (id: string) => ({ LD_PRELOAD: clockShim, SHARDGUARD_CLOCK_FILE: clockFile(id) }) }
        : {}),
      onProgress: (text) => line(`cluster: ${text}`),
    });
    const active = cluster;
    const controllers: ManagedProcess[] = [...active.controllers];
    const dead = new Set<string>();
    const redisById = new Map(active.redis.map((node) => [node.id, node]));
    for (const node of active.redis) everStarted.add(node);
    const byAddress = new Map(active.redis.map((node) => [node.address, node.id]));
    const enableRdb = async (node: RedisNode) => {
      const client = node.client({ maxRetriesPerRequest: 0, retryStrategy: () => null, lazyConnect: true });
      client.on("error", () => {});
      try {
        await client.connect();
        await client.config("SET", "save", "2 1");
      } catch {
        // A node that does not answer now keeps no RDB; kill-redis "rdb" then restarts it empty.
      } finally {
        client.disconnect();
      }
    };
    await Promise.all(active.redis.map(enableRdb));
    /** The redis-server of every node in the run's node set now. */
    const memberNodes = () => nodeIds.map((id) => redisById.get(id) as RedisNode);
    const sampledOf = (node: RedisNode): SampledNode => ({
      id: node.id,
      address: node.address,
      alive: () => !dead.has(node.id),
    });
    /** What the sampler and the stray writer probe: the node set, read anew every round. */
    const sampled: SampledNode[] = active.redis.map(sampledOf);
    /** The lab node (namespace) a node runs in: its own, or the one of the node it replaced at its address. */
    const labNameOf = (id: string): string =>
      active.netlab?.nodes.find((lab) => lab.namespace === redisById.get(id)?.network?.namespace)?.name ?? id;

    /**
     * `membership`: a new node joins as docs/runbook.md says (a new id; redis-server started fenced,
     * as a replica of `replicaOf` or as an empty master its agent repoints; its agent beside it),
     * with its own proxies, clock file and, in the lab, its own namespace unless `network` (the
     * address of the node it replaces) is given. It joins the node set once its agent runs.
     */
    const joinNode = async (
      id: string,
      options: { port?: number; network?: NodeNetwork; replicaOf?: string | undefined },
    ): Promise<RedisNode> => {
      const fresh = addAgentProxies(id);
      proxies.push(...fresh);
      await Promise.all(fresh.map((proxy) => proxy.start()));
      if (labAws) await Promise.all(fresh.map((proxy) => proxy.listenAlso(labAws as string)));
      currentPriorities.set(id, 100);
      const lab = active.netlab;
      let network = options.network;
      if (lab && network === undefined) {
        const labNode = await lab.addNode(id);
        network = { namespace: labNode.namespace, host: labNode.address };
      }
      const node = new RedisNode(options.port ?? (await freePort()), id);
      node.network = network;
      if (clockShim) {
        writeFileSync(clockFile(id), "0");
        node.env = { LD_PRELOAD: clockShim, SHARDGUARD_CLOCK_FILE: clockFile(id) };
      }
      active.attach(node);
      redisById.set(id, node);
      everStarted.add(node);
      await node.start({ timeoutMs: 15_000, replicaOf: options.replicaOf, extraArgs: FENCED_START_ARGS });
      await enableRdb(node);
      active.startAgent(id);
      byAddress.set(node.address, id);
      sampled.push(sampledOf(node));
      nodeIds.push(id);
      return node;
    };

    /** Takes `id` out of the node set: no fault targets it, the workload stops probing it. */
    const leaveNodeSet = (id: string) => {
      const index = nodeIds.indexOf(id);
      if (index >= 0) nodeIds.splice(index, 1);
      const at = sampled.findIndex((node) => node.id === id);
      if (at >= 0) sampled.splice(at, 1);
    };

    /**
     * Stops node `id`'s agent and redis-server for good (`SIGKILL` for a lost machine, `SIGTERM` for
     * a shrink) and forgets it; its namespace goes too unless a replacement keeps its address.
     */
    const retireNode = async (id: string, signal: "SIGKILL" | "SIGTERM", keepNamespace: boolean) => {
      leaveNodeSet(id);
      const node = redisById.get(id) as RedisNode;
      const labName = labNameOf(id);
      await active.stopAgent(id, signal);
      if (signal === "SIGKILL") node.signal("SIGKILL");
      await node.destroy();
      dead.delete(id);
      const at = active.redis.indexOf(node);
      if (at >= 0) active.redis.splice(at, 1);
      if (byAddress.get(node.address) === id) byAddress.delete(node.address);
      if (active.netlab && !keepNamespace) await active.netlab.removeNode(labName);
    };

    /**
     * Nodes whose database this run restarted (from its RDB or empty), with the topology's epoch
     * read after the restart: while that node is still the primary at that epoch, it and the
     * replicas linked to it may hold less than what was acknowledged (its RDB is older), so the
     * copies rule counts none of them (seed 5401: a replica replaced for good 12 s after the primary
     * came back from its RDB was the only full copy left; the shard was offline 27 minutes).
     */
    const restartedAtEpoch = new Map<string, number>();
    const noteRestart = async (id: string) => {
      // An unreadable topology (a store outage) records nothing: the rule is then the plain one.
      const topology = await active.topology().catch(() => undefined);
      if (topology !== undefined) restartedAtEpoch.set(id, topology.epoch);
    };
    const primaryRolledBack = (topology: Topology | undefined): boolean =>
      isPrimaryRolledBack(topology, restartedAtEpoch);

    /**
     * Whether destroying node `id`'s copy keeps guarantee 1's premise: it is dead already, or the
     * shard is online (not mid-failover, when the topology's primary may be the deposed one and a
     * "replica" the promoted one), `id` answers `ROLE` as a replica, and another node holds the
     * data intact (src/dev/nemesis/copies.ts).
     */
    const safeToDestroy = async (id: string, leaving: readonly string[] = []): Promise<boolean> => {
      if (dead.has(id)) return true;
      const topology = await active.topology().catch(() => undefined);
      if (topology?.status !== "online" || topology.primary_node_id === undefined) return false;
      if (primaryRolledBack(topology)) return false;
      // Not while a fault may depose the primary or hide a replica's true link state (seed 6002).
      const faults = [...activeFaults]
        .filter((entry) => !entry.healed)
        .map((entry) => ({ kind: entry.fault.kind, targets: entry.targets }));
      if (copiesUncertain(faults, topology.primary_node_id) !== undefined) return false;
      // The other nodes of a shrink under way still hold data until they are stopped (the primary
      // among them, when a drain handed it there: nemesis seed 5102 kept a node for good so).
      const nodes = new Set([
        ...memberNodes(),
        ...[id, ...leaving].filter((each) => !dead.has(each)).map((each) => redisById.get(each) as RedisNode),
      ]);
      const roles = await readRoles([...nodes].map((each) => ({ node: each, alive: !dead.has(each.id) })));
      return roles.get(id)?.role === "slave" && intactCopies(id, roles, topology.primary_node_id).length > 0;
    };

    /** `shardguard <args>` until it exits 0 or `timeoutMs` passes; the last line it printed. */
    const cliUntilDone = async (
      args: string[],
      timeoutMs: number,
    ): Promise<{ ok: boolean; said: string }> => {
      const deadline = performance.now() + timeoutMs;
      let said = "";
      for (;;) {
        const result = await active.runCli(args);
        said =
          (result.code === 0 ? result.stdout : result.stderr || result.stdout).trim().split("\n").pop() ?? "";
        if (result.code === 0) return { ok: true, said };
        if (performance.now() > deadline || options.signal?.aborted) return { ok: false, said };
        await sleep(1000);
      }
    };

    /** Roles of the node set now (for the copies rule, src/dev/nemesis/copies.ts). */
    const memberRoles = (): Promise<Map<string, RoleRead | undefined>> =>
      readRoles(memberNodes().map((node) => ({ node, alive: !dead.has(node.id) })));
    /** Sends the last (up to) 3 commands `id`'s agent received to its queue again; what was sent. */
    const duplicateCommands = async (id: string): Promise<string[]> => {
      const commands = (received.get(id) as CommandTap).commands.slice(-3);
      const sent: string[] = [];
      for (const command of commands) {
        try {
          await active.aws.bus.send(active.shard, id, command);
          duplicatesSent++;
          sent.push(`${command.type} epoch ${command.epoch}`);
          history.append({
            process: "nemesis",
            type: "info",
            f: "duplicate",
            value: { node: id, type: command.type, epoch: command.epoch, command_id: command.command_id },
          });
        } catch (error) {
          line(
            `  dup-commands ${id}: could not send ${command.type} epoch ${command.epoch} again: ${errorMessage(error)}`,
          );
        }
      }
      return sent;
    };

    const keyPrefix = `nemesis:${options.seed}:`;
    const writer = new NemesisWriter({
      history,
      resolvePrimary: () => active.primaryAddress(),
      nodeOf: (address) => byAddress.get(address),
      keyPrefix,
    });
    const sampler = new WritableSampler(history, () => sampled, keyPrefix);
    const stray = new StrayWriter(history, () => sampled, writer);
    const observer = new TopologyObserver(history, () => active.topology());
    await observer.poll();
    observer.start();
    writer.start();
    stray.start();
    sampler.start();
    // The operator gives a priority-0 node that alone holds the data a priority (on-call.ts).
    const givePriority = (id: string) => {
      currentPriorities.set(id, OPERATOR_GIVES);
      active.startAgent(id, { priority: OPERATOR_GIVES });
    };
    const onCall = new OnCallOperator({
      history,
      snapshot: () => active.snapshot(),
      now: () => active.aws.clock.now(),
      config,
      givePriority,
      undrain: async (id) => {
        const undrained = await cliUntilDone(["undrain", "--shard", active.shard, "--node", id], 30_000);
        line(`  on-call: undrain ${id}: ${undrained.ok ? "done" : undrained.said}`);
      },
      pageAfterMs: OPERATOR_PAGE_MS,
      log: line,
    });
    onCall.start();
    line(
      `shard ${active.shard} online, primary ${observer.last?.primary_node_id} at epoch ${observer.last?.epoch}; logs in ${active.logDir}`,
    );

    const busy = new Set<string>();
    // What the active faults do to each proxy: how many cut it (it passes again when the last of
    // them heals), and the slow or failing answers of the others (the latest applies). A cut wins.
    const effects = new Map<TcpProxy, { cuts: number; modes: ProxyMode[] }>();
    const effectOf = (proxy: TcpProxy) => {
      let effect = effects.get(proxy);
      if (!effect) {
        effect = { cuts: 0, modes: [] };
        effects.set(proxy, effect);
      }
      return effect;
    };
    const apply = (proxy: TcpProxy) => {
      const effect = effectOf(proxy);
      const mode: ProxyMode = effect.cuts > 0 ? { kind: "drop" } : (effect.modes.at(-1) ?? PASS);
      if (mode !== proxy.mode || mode.kind === "drop") proxy.setMode(mode);
    };
    const cut = (proxy: TcpProxy) => {
      effectOf(proxy).cuts++;
      apply(proxy);
    };
    const uncut = (proxy: TcpProxy) => {
      const effect = effectOf(proxy);
      effect.cuts = Math.max(0, effect.cuts - 1);
      apply(proxy);
    };
    /** Adds a slow or failing answer to a proxy; the returned function removes it. */
    const degrade = (proxy: TcpProxy, mode: ProxyMode) => {
      effectOf(proxy).modes.push(mode);
      apply(proxy);
      return () => {
        const effect = effectOf(proxy);
        effect.modes = effect.modes.filter((other) => other !== mode);
        apply(proxy);
      };
    };
    const activeFaults = new Set<ActiveFault>();
    const outcomes: FaultOutcome[] = [];
    const skippedByKind = new Map<string, number>();
    const makeUps = new MakeUps(options.makeUpQuota ?? 0, options.minutes * 60_000);
    const started = performance.now();

    const resolveTargets = async (
      fault: ScheduledFault,
    ): Promise<{ targets: string[]; why?: string; primary?: string; busy?: boolean }> => {
      const topology: Topology | undefined = await active.topology().catch(() => undefined);
      const primary = topology?.primary_node_id;
      const kindNeedsRedis =
        fault.kind === "kill-redis" ||
        fault.kind === "pause-redis" ||
        fault.kind === "restart-as-replica" ||
        fault.kind === "redis-clock-step";
      if (fault.kind === "redis-clock-step" && clockShimMissing)
        return { targets: [], why: clockShimMissing };
      if (fault.kind === "partition-nodes" && !useLab)
        return { targets: [], why: `no network lab (${labMissing ?? "not started"})` };
      const liveNodes = nodeIds.filter((id) => !(kindNeedsRedis && dead.has(id)));
      let candidates: string[];
      switch (fault.target) {
        case "primary":
          // Not a node leaving the set (a shrink under way drains it first).
          candidates = primary && nodeIds.includes(primary) ? [primary] : [];
          break;
        case "replica":
          candidates = liveNodes.filter((id) => id !== primary);
          break;
        case "random-node":
        case "all-nodes":
          candidates = liveNodes;
          break;
        case "random-controller":
        case "all-controllers":
          candidates = [...controllerStore.keys()];
          break;
        case "everyone":
          candidates = [...nodeIds, ...controllerStore.keys()];
          break;
        case "shard":
          candidates = ["shard"];
          break;
      }
      candidates = candidates.filter((id) => !(kindNeedsRedis && dead.has(id)));
      let free = candidates.filter((id) => resourcesOf(fault, id).every((r) => !busy.has(r)));
      if (free.length === 0) {
        return {
          targets: [],
          why:
            candidates.length === 0
              ? `no ${fault.target} (primary ${primary ?? "none"})`
              : `${fault.target} busy with another fault`,
          busy: candidates.length > 0,
        };
      }
      if (fault.kind === "membership" && fault.params.change === "replace") {
        // A node lost for good is what a replacement is for: one already dead (kill-redis with no
        // restart) is replaced first; a live replica only while another node holds the data intact.
        if (primary === undefined) return { targets: [], why: "no primary to replace a replica of" };
        free = free.filter((id) => id !== primary);
        const deadOnes = free.filter((id) => dead.has(id));
        if (deadOnes.length > 0) free = deadOnes;
        else {
          const safe = await Promise.all(free.map((id) => safeToDestroy(id)));
          free = free.filter((_, index) => safe[index]);
        }
        if (free.length === 0) {
          return { targets: [], why: "no replica to replace while another node holds the data intact" };
        }
      }
      if (fault.kind === "kill-redis" || fault.kind === "restart-as-replica") {
        // A kill destroys its node's copy: only while another node holds the data (src/dev/nemesis/copies.ts).
        // A replica keeps its copy through the primary's restart only while its agent runs, free
        // to park it: Redis resyncs a replica from the restarted (older) process (docs/safety.md,
        // guarantee 1's assumption; seed 5103: primary node-1 restarted from its RDB while both
        // replicas' agents were dead, and both replicas resynced from it).
        const roles = await memberRoles();
        // An agent started a moment ago has not seen the primary's process yet (seed 6001).
        const parkable = (id: string) =>
          agentProtects({
            running: active.agentRunning(id),
            busy: busy.has(`agent:${id}`),
            upForMs: active.agentUpForMs(id),
          });
        // Only while the shard is online: mid-failover the "replica" may be the node being promoted,
        // the only holder (nemesis seed 7341: node-2, parked with every write after primary node-3
        // restarted empty, was restarted empty itself 100 ms before its PROMOTE arrived).
        free =
          topology?.status !== "online" || primaryRolledBack(topology)
            ? []
            : free.filter((id) =>
                intactCopies(id, roles, primary).some((copy) => copy === primary || parkable(copy)),
              );
        if (free.length === 0) {
          return {
            targets: [],
            why: "no other node holds the data intact now (a second destroyed copy is beyond guarantee 1)",
          };
        }
      }
      if (
        fault.target === "all-nodes" ||
        fault.target === "all-controllers" ||
        fault.target === "everyone" ||
        fault.target === "shard"
      )
        return { targets: free, primary };
      return { targets: [free[Math.floor(fault.pick * free.length)] as string], primary };
    };

    /** Heals an active fault before its time (its `runFault` then only releases its resources). */
    const healNow = async (entry: ActiveFault, note?: string) => {
      entry.healed = true;
      await entry.heal().catch((error) => line(`heal #${entry.fault.id}: ${errorMessage(error)}`));
      const { id, kind, target } = entry.fault;
      history.append({
        process: "nemesis",
        type: "info",
        f: "heal",
        value: { id, kind, target, nodes: entry.targets, ...(note ? { note } : {}) },
      });
    };

    /**
     * `membership` scale: two new nodes (`node-<fault id>a`, `-b`) join for the fault's duration; the
     * heal returned shrinks the shard back.
     */
    const scaleOut = async (fault: ScheduledFault): Promise<() => Promise<void>> => {
      const joined: string[] = [];
      try {
        for (const id of [`node-${fault.id}a`, `node-${fault.id}b`]) {
          const replicaOf =
            fault.params.replicaof === true
              ? await active.primaryAddress().catch(() => undefined)
              : undefined;
          const node = await joinNode(id, { replicaOf });
          joined.push(id);
          line(
            `  membership: ${id} joined at ${node.address} (${replicaOf ? `started as a replica of ${replicaOf}` : "started as a fenced empty master"}, agent beside it)`,
          );
        }
      } catch (error) {
        await shrinkBack(fault, joined);
        throw error;
      }
      return () => shrinkBack(fault, joined);
    };

    /**
     * docs/runbook.md's shrink: every leaving node drained first (the primary last, so that its
     * switchover goes to a node that stays), then node by node: stop the agent and redis-server,
     * decommission, undrain. The nodes leave the set first (no new fault
     * targets them) and the faults active on them end now, as heal-all would end them. A drain still
     * refused after 45 s (e.g. no other node eligible: a priority 0, a node dead for good) does not
     * keep the node: it is stopped as a replica that dies would be, once it is safe to (see
     * `safeToDestroy`); a node that is not safe to stop within 60 s stays in the set, undrained.
     */
    const shrinkBack = async (fault: ScheduledFault, ids: readonly string[]) => {
      for (const id of ids) {
        const index = nodeIds.indexOf(id);
        if (index >= 0) nodeIds.splice(index, 1);
      }
      for (const entry of [...activeFaults]) {
        if (entry.healed || entry.fault.id === fault.id || !entry.targets.some((id) => ids.includes(id)))
          continue;
        await healNow(entry, `ended early: membership #${fault.id} removes its node`);
        line(
          `  membership: #${entry.fault.id} ${entry.fault.kind} on ${entry.targets.join(",")} healed early`,
        );
      }
      // Every leaving node is drained before any is stopped, the primary last: its drain's
      // switchover then goes to a node that stays, never to another leaving one (seed 5102).
      const primaryId = (await active.topology().catch(() => undefined))?.primary_node_id;
      const order = [...ids].sort((a, b) => Number(a === primaryId) - Number(b === primaryId));
      const drains = new Map<string, { ok: boolean; said: string }>();
      for (const id of order)
        drains.set(id, await cliUntilDone(["drain", "--shard", active.shard, "--node", id], 45_000));
      for (const id of order) {
        const drained = drains.get(id) ?? { ok: false, said: "not tried" };
        const others = order.filter((other) => other !== id);
        let safe = false;
        for (const deadline = performance.now() + 60_000; !safe && performance.now() < deadline; ) {
          safe = await safeToDestroy(id, others);
          if (!safe) await sleep(500);
        }
        if (!safe) {
          // Never the last copy: a node that still answers as primary, or holds what no other node
          // holds, stays in the set for the rest of the run (the settle and the final read count
          // it), undrained: a drained node ranks as priority 0, and a kept one may be the only
          // holder the shard can come back on (seed 5102: offline 18 minutes).
          nodeIds.push(id);
          const undrained = await cliUntilDone(["undrain", "--shard", active.shard, "--node", id], 30_000);
          line(
            `  membership: ${id} ${drained.ok ? "drained" : `not drained (${drained.said})`}, KEPT: not safe to stop within 60 s (a primary, or no other intact copy, or the shard not online), ${undrained.ok ? "undrained" : `not undrained (${undrained.said})`}`,
          );
          continue;
        }
        await retireNode(id, "SIGTERM", false);
        const retired = await cliUntilDone(["decommission", "--shard", active.shard, "--node", id], 15_000);
        const undrained = await cliUntilDone(["undrain", "--shard", active.shard, "--node", id], 30_000);
        line(
          `  membership: ${id} ${drained.ok ? "drained" : `not drained (${drained.said})`}, stopped, ${retired.ok ? "decommissioned" : `not decommissioned (${retired.said})`}, ${undrained.ok ? "undrained" : `not undrained (${undrained.said})`}`,
        );
      }
    };

    /**
     * `membership` replace: the replica `id` is lost for good now (its redis-server and agent
     * killed; it leaves the node set); the heal returned is the replacement arriving after the
     * fault's duration: `node-<fault id>r` at the same address (port, and namespace in the lab) or a
     * new one, joining as docs/runbook.md says, and the old id decommissioned. Heal means the new
     * node is started: it stays for the rest of the run (the node set changed for good), and the
     * final settle waits for it to follow the primary like any node.
     */
    const replaceNode = async (fault: ScheduledFault, id: string): Promise<() => Promise<void>> => {
      const old = redisById.get(id) as RedisNode;
      const same = fault.params.address === "same";
      const { port, network, address } = old;
      const wasDead = dead.has(id);
      await retireNode(id, "SIGKILL", same);
      const newId = `node-${fault.id}r`;
      line(
        `  membership: ${id} (${address}) ${wasDead ? "dead for good already, retired" : "lost for good (redis-server and agent killed)"}; ${newId} replaces it at ${same ? "the same address" : "a new address"} in ${seconds(fault.durationMs)} s`,
      );
      return async () => {
        const replicaOf =
          fault.params.replicaof === true ? await active.primaryAddress().catch(() => undefined) : undefined;
        const node = await joinNode(newId, same ? { port, network, replicaOf } : { replicaOf });
        const retired = await cliUntilDone(["decommission", "--shard", active.shard, "--node", id], 15_000);
        line(
          `  membership: ${newId} joined at ${node.address} (${replicaOf ? `started as a replica of ${replicaOf}` : "started as a fenced empty master"}); ${id} ${retired.ok ? "decommissioned" : `not decommissioned (${retired.said})`}`,
        );
      };
    };

    const inject = async (
      fault: ScheduledFault,
      targets: readonly string[],
    ): Promise<() => Promise<void>> => {
      const heals: Array<() => Promise<void> | void> = [];
      for (const id of targets) {
        switch (fault.kind) {
          case "kill-redis": {
            const node = redisById.get(id) as RedisNode;
            node.signal("SIGKILL");
            dead.add(id);
            await node.stop();
            const restart = fault.params.restart;
            heals.push(async () => {
              if (restart === "none") return;
              if (restart === "empty") node.wipeData();
              // As docs/deploy.md asks of a supervisor: the database starts fenced, its agent opens it.
              await node.start({ timeoutMs: 15_000, extraArgs: FENCED_START_ARGS });
              dead.delete(id);
              await noteRestart(id);
              await enableRdb(node);
            });
            break;
          }
          case "pause-redis": {
            const node = redisById.get(id) as RedisNode;
            node.signal("SIGSTOP");
            heals.push(() => node.signal("SIGCONT"));
            break;
          }
          case "pause-agent":
            active.signalAgent(id, "SIGSTOP");
            heals.push(() => {
              active.signalAgent(id, "SIGCONT");
            });
            break;
          case "restart-agent":
            await active.stopAgent(id, "SIGKILL");
            heals.push(() => active.startAgent(id, { wipeStateDir: fault.params.wipeState === true }));
            break;
          case "clock-skew": {
            const offsetS = Number(fault.params.offsetS);
            active.startAgent(id, {
              env: {
                LD_PRELOAD: LIBFAKETIME,
                FAKETIME: `${offsetS >= 0 ? "+" : ""}${offsetS}s`,
                FAKETIME_DONT_FAKE_MONOTONIC: "1",
              },
            });
            heals.push(() => active.startAgent(id));
            break;
          }
          case "pause-controller": {
            const proc = controllers[Number(id.split("-")[1]) - 1];
            proc?.child.kill("SIGSTOP");
            heals.push(() => {
              proc?.child.kill("SIGCONT");
            });
            break;
          }
          case "partition-agent-store":
          case "partition-agent-sqs":
          case "partition-controller-store":
          case "store-outage": {
            const map =
              fault.kind === "partition-agent-sqs"
                ? agentSqs
                : fault.kind === "partition-controller-store" || id.startsWith("controller-")
                  ? controllerStore
                  : agentStore;
            const proxy = map.get(id) as TcpProxy;
            cut(proxy);
            heals.push(() => uncut(proxy));
            break;
          }
          case "delay-commands": {
            const proxy = agentSqs.get(id) as TcpProxy;
            proxy.setMode({ kind: "delay", delayMs: Number(fault.params.delayMs) });
            heals.push(() => proxy.heal());
            break;
          }
          case "kill-agent-long":
            // Killed and left dead; "until the end" faults last until the final heal restarts it.
            await active.stopAgent(id, "SIGKILL");
            heals.push(() => {
              if (!active.agentRunning(id)) active.startAgent(id);
            });
            break;
          case "restart-as-replica": {
            // Killed, then restarted by a supervisor whose redis.conf says `replicaof <another node>`
            // (and, as docs/deploy.md asks, starts fenced).
            const node = redisById.get(id) as RedisNode;
            const others = nodeIds.filter((other) => other !== id);
            const of = redisById.get(others[Math.floor(Number(fault.params.of) * others.length)] as string);
            node.signal("SIGKILL");
            dead.add(id);
            await node.stop();
            line(`  restart-as-replica ${id}: will come back with replicaof ${of?.id} (${of?.address})`);
            heals.push(async () => {
              if (fault.params.restart === "empty") node.wipeData();
              await node.start({ timeoutMs: 15_000, replicaOf: of?.address, extraArgs: FENCED_START_ARGS });
              dead.delete(id);
              await noteRestart(id);
              await enableRdb(node);
            });
            break;
          }
          case "priorities": {
            // The operator's new --priority, never leaving more zeros than a failure tolerates.
            const next = new Map(currentPriorities).set(id, Number(fault.params.priority));
            const capped = capZeros(nodeIds.map((other) => next.get(other) ?? 100));
            const priority = capped[nodeIds.indexOf(id)] ?? 100;
            currentPriorities.set(id, priority);
            active.startAgent(id, { priority });
            line(
              `  priorities ${id}: agent restarted with --priority ${priority} (now ${capped.join(", ")})`,
            );
            break;
          }
          case "store-slow":
          case "store-throttle": {
            const proxy = (id.startsWith("controller-") ? controllerStore : agentStore).get(id) as TcpProxy;
            // The fault's own stream: which requests fail is replayed with the seed.
            const random = new Random(Math.floor(fault.pick * 2 ** 32) ^ fault.id);
            const mode: ProxyMode =
              fault.kind === "store-slow"
                ? { kind: "delay", delayMs: Number(fault.params.delayMs) }
                : {
                    kind: "http-error",
                    fraction: Number(fault.params.fraction),
                    status: fault.params.error === "500" ? 500 : 400,
                    body: fault.params.error === "500" ? DYNAMODB_INTERNAL_ERROR : DYNAMODB_THROTTLED,
                    draw: () => random.next(),
                  };
            heals.push(degrade(proxy, mode));
            break;
          }
          case "redis-clock-step": {
            const offsetMs = Number(fault.params.offsetS) * 1000;
            writeFileSync(clockFile(id), String(offsetMs));
            heals.push(() => writeFileSync(clockFile(id), "0"));
            break;
          }
          case "partition-nodes": {
            // Every node of the set now, added ones included (each has a namespace), by the name of the
            // namespace it runs in (a node that replaced another at its address runs in the old one's).
            const self = labNameOf(id);
            const others = nodeIds.filter((other) => other !== id).map(labNameOf);
            const other = others[Math.floor(Number(fault.params.with) * others.length)] as string;
            // The groups hold every node still running, not only the set: a node a shrink is draining
            // left the set but still replicates until it is stopped, and leaving it out made an
            // isolation a non-transitive cut (nemesis 7342: the isolated primary's one linked
            // replica was a leaving node, so it kept acknowledging writes).
            const running = [...new Set(active.redis.map((node) => labNameOf(node.id)))].filter(
              (name) => name !== self,
            );
            const rest = running.filter((node) => node !== other);
            const spec: PartitionSpec =
              fault.params.shape === "one-way"
                ? { cuts: [{ from: self, to: other, oneWay: true }] }
                : fault.params.shape === "two-way"
                  ? { cuts: [{ from: self, to: other }] }
                  : fault.params.shape === "split"
                    ? // An AZ split: this node with one other | the rest with the store and the controllers.
                      {
                        groups: [
                          [self, other],
                          [...rest, "aws"],
                        ],
                      }
                    : { groups: [[self], [...running, "aws"]] };
            const cuts = await active.partition(spec);
            line(`  partition-nodes: ${cuts.map((cut) => `${cut.from}->${cut.to}`).join(" ")}`);
            heals.push(() => active.heal());
            break;
          }
          case "membership": {
            if (fault.params.change === "scale") {
              heals.push(await scaleOut(fault));
              break;
            }
            if (fault.params.change === "replace") {
              heals.push(await replaceNode(fault, id));
              break;
            }
            // A redis-server with no agent, following the primary from the host side: Redis counts
            // it, no heartbeat names it. It stays on that node after a failover (nobody repoints
            // it), as an unmanaged replica would; the heal stops it.
            const primaryNode = redisById.get(id) as RedisNode;
            const anonymous = new RedisNode(await freePort(), `anonymous-${fault.id}`);
            everStarted.add(anonymous);
            await anonymous.start({ timeoutMs: 15_000, replicaOf: primaryNode.address });
            line(`  membership: anonymous replica ${anonymous.address} of ${id} (${primaryNode.address})`);
            heals.push(() => anonymous.destroy());
            break;
          }
          case "operator": {
            const note = await actAsOperator(fault);
            line(`  operator: ${note}`);
            history.append({
              process: "nemesis",
              type: "info",
              f: "operator",
              value: { id: fault.id, note },
            });
            if (fault.params.action === "pause") {
              heals.push(async () => {
                const result = await active.runCli([
                  "resume",
                  "--shard",
                  active.shard,
                  "--reason",
                  "nemesis",
                ]);
                line(
                  `  operator: resume -> ${result.code === 0 ? "ok" : (result.stderr || result.stdout).trim().split("\n").pop()}`,
                );
              });
            }
            break;
          }
          case "dup-commands": {
            // Reset the agent's SQS connections every few hundred ms: a ReceiveMessage whose answer is
            // lost leaves the message in flight and a DeleteMessage that is lost leaves an applied
            // command to be delivered again when its visibility timeout ends.
            const proxy = agentSqs.get(id) as TcpProxy;
            const timer = setInterval(() => {
              proxy.setMode({ kind: "reset" });
              proxy.setMode({ kind: "pass" });
            }, 300);
            proxy.setMode({ kind: "reset" });
            proxy.setMode({ kind: "pass" });
            // And real duplicates: the last commands this agent received, sent to its queue again
            // (same command_id, old epoch), as SQS's at-least-once delivery may, however late.
            const copies = await duplicateCommands(id);
            heals.push(() => {
              clearInterval(timer);
              proxy.heal();
            });
            if (copies.length > 0) line(`  dup-commands ${id}: sent again ${copies.join(", ")}`);
            break;
          }
        }
      }
      return async () => {
        for (const heal of heals) await heal();
      };
    };

    /** An operator's action through the real CLI (`shardguard switchover|pause|recover`); what happened. */
    const actAsOperator = async (fault: ScheduledFault): Promise<string> => {
      const action = String(fault.params.action);
      const reason = ["--reason", `nemesis operator, fault #${fault.id}`];
      let args: string[];
      if (action === "switchover") {
        const topology = await active.topology().catch(() => undefined);
        const replicas = nodeIds.filter((id) => id !== topology?.primary_node_id && !dead.has(id));
        const to = replicas[Math.floor(fault.pick * replicas.length)];
        args = [
          "switchover",
          "--shard",
          active.shard,
          ...(fault.params.to === "named" && to ? ["--to", to] : []),
          ...reason,
        ];
      } else if (action === "pause") {
        args = ["pause", "--shard", active.shard, ...reason];
      } else {
        // What an on-call engineer picks from `shardguard status`: the live node with the most
        // data among those that hold the stored lineage; none such, and the operator waits.
        const snapshot = await active.snapshot();
        const best = recoverCandidates(snapshot, config, active.aws.clock.now())[0];
        if (!best) {
          const stored = snapshot.topology?.lineage;
          return `recover: not issued; no live node holds the stored lineage${stored ? ` ${stored.repl_id} up to ${stored.last_txn_id}` : ""} (its holder's agent is awaited)`;
        }
        args = ["recover", "--shard", active.shard, "--to", best.node_id, ...reason];
      }
      const result = await active.runCli(args);
      const answer = (result.code === 0 ? result.stdout : result.stderr || result.stdout)
        .trim()
        .split("\n")
        .pop();
      return `shardguard ${args.slice(0, args.indexOf("--reason")).join(" ")} -> exit ${result.code}: ${answer}`;
    };

    /** What a fault did, from the history: epoch changes, time to a writable new primary, write gaps, losses. */
    const outcomeOf = async (
      fault: ScheduledFault,
      targets: readonly string[],
      injectedAt: number,
      healedAt: number | undefined,
    ) => {
      const until = history.elapsed();
      const ops = history.ops.filter((op) => op.t >= injectedAt && op.t <= until);
      const changes = ops.filter((op) => op.process === "observer" && op.f === "epoch");
      const epochs = changes
        .filter((op) => {
          const value = op.value as EpochValue;
          return value.previousEpoch !== undefined && value.previousEpoch !== value.epoch;
        })
        .map((op) => {
          const value = op.value as EpochValue;
          return { epoch: value.epoch, primary: value.primary, atS: Math.round(op.t / 100) / 10 };
        });
      const acks = ops.filter((op) => op.process === "writer" && op.type === "ok");
      let timeToWritableMs: number | undefined;
      const lastOnline = [...changes].reverse().find((op) => (op.value as EpochValue).status === "online");
      const newPrimary =
        epochs.length > 0 ? (lastOnline?.value as EpochValue | undefined)?.primary : undefined;
      if (lastOnline && newPrimary) {
        const first = acks.find((op) => op.node === newPrimary && op.t >= lastOnline.t - 1000);
        if (first) timeToWritableMs = Math.round(first.t - injectedAt);
      }
      let longestWriteGapMs = 0;
      let previous = injectedAt;
      for (const op of acks) {
        longestWriteGapMs = Math.max(longestWriteGapMs, op.t - previous);
        previous = op.t;
      }
      longestWriteGapMs = Math.round(Math.max(longestWriteGapMs, until - previous));
      // Writes acknowledged from a little before the inject to the heal, looked up on every live node
      // now: a write missing from all of them is lost for good (the final check is authoritative; the
      // primary alone can be a node restarted empty a moment ago, with the data still on its replicas).
      const from = injectedAt - 2000;
      const to = healedAt ?? until;
      const acked = history.ops.filter(
        (op) => op.process === "writer" && op.type === "ok" && op.t >= from && op.t <= to,
      );
      let lostByReplica = 0;
      let lostAsyncOnly = 0;
      const present = new Set<number>();
      let answered = 0;
      const silent: string[] = [];
      // Every redis-server the run still runs, not only the node set: a node leaving it (a shrink
      // whose drain was refused) may be the primary holding the writes (nemesis 7304, #31: "159
      // missing" while the primary node-21b, outside the set, held them all).
      for (const node of active.redis.filter((candidate) => !dead.has(candidate.id))) {
        if (acked.length === 0) break;
        const client = node.client({
          maxRetriesPerRequest: 0,
          retryStrategy: () => null,
          lazyConnect: true,
          commandTimeout: 3000,
        });
        client.on("error", () => {});
        try {
          await client.connect();
          for (let start = 0; start < acked.length; start += 1000) {
            const batch = acked.slice(start, start + 1000);
            const values = await client.mget(batch.map((op) => writer.keyOf((op.value as WriteValue).seq)));
            batch.forEach((op, index) => {
              if (values[index] !== null) present.add((op.value as WriteValue).seq);
            });
          }
          answered++;
        } catch {
          // A node that does not answer now (hung, restarting): the final read will tell.
          silent.push(node.id);
        } finally {
          client.disconnect();
        }
      }
      if (answered > 0) {
        for (const op of acked) {
          const value = op.value as WriteValue;
          if (present.has(value.seq)) continue;
          if ((value.replicas ?? 0) >= 1) lostByReplica++;
          else lostAsyncOnly++;
        }
      }
      const params = Object.entries(fault.params).map(([key, value]) => `${key} ${String(value)}`);
      const what = `${fault.kind} ${fault.target} ${targets.join(",")}${params.length > 0 ? ` (${params.join(", ")})` : ""} for ${seconds(fault.durationMs)} s`;
      const failover =
        epochs.length === 0
          ? "no failover"
          : `epoch -> ${epochs.map((e) => e.epoch).join(", ")}, ${newPrimary ? `primary ${newPrimary}` : "no primary online"}${timeToWritableMs !== undefined ? ` writable ${seconds(timeToWritableMs)} s after the inject` : ", no write acknowledged by it yet"}`;
      const text = `t=${seconds(injectedAt)}s #${fault.id} ${what} -> ${failover}; longest write gap ${seconds(longestWriteGapMs)} s; ${lostByReplica} missing from every live node${silent.length > 0 ? ` that answered (not ${silent.join(", ")})` : ""}${lostAsyncOnly > 0 ? ` (+${lostAsyncOnly} async-only)` : ""}`;
      return { epochs, timeToWritableMs, longestWriteGapMs, lostByReplica, lostAsyncOnly, line: text };
    };

    const runFault = async (fault: ScheduledFault): Promise<void> => {
      let resolved = await resolveTargets(fault);
      // Never past the run's end: the final heal takes over there.
      const runEnd = started + options.minutes * 60_000;
      const busyUntil = Math.min(performance.now() + (options.busyWaitMs ?? 0), runEnd);
      const retryUntil = Math.min(performance.now() + (options.retrySkippedMs ?? 0), runEnd);
      while (resolved.targets.length === 0 && !options.signal?.aborted) {
        const until = resolved.busy ? Math.max(busyUntil, retryUntil) : retryUntil;
        if (performance.now() >= until) break;
        await sleep(500);
        resolved = await resolveTargets(fault);
      }
      const { targets, why, primary: primaryAtInject } = resolved;
      if (targets.length === 0) {
        skippedByKind.set(fault.kind, (skippedByKind.get(fault.kind) ?? 0) + 1);
        makeUps.skipped(fault);
        const text = `t=${seconds(history.elapsed())}s #${fault.id} ${describeFault(fault)} skipped: ${why}`;
        history.append({
          process: "nemesis",
          type: "fail",
          f: "inject",
          value: {
            id: fault.id,
            kind: fault.kind,
            target: fault.target,
            nodes: [],
            params: fault.params,
            note: why,
          } satisfies FaultValue,
        });
        outcomes.push({
          id: fault.id,
          kind: fault.kind,
          target: fault.target,
          nodes: [],
          params: fault.params,
          injectedAtS: history.elapsed() / 1000,
          healedAtS: undefined,
          skipped: why,
          hitPrimary: false,
          epochs: [],
          timeToWritableMs: undefined,
          longestWriteGapMs: 0,
          lostByReplica: 0,
          lostAsyncOnly: 0,
          line: text,
        });
        line(text);
        return;
      }
      makeUps.injected(fault.kind);
      const resources = targets.flatMap((id) => resourcesOf(fault, id));
      for (const resource of resources) busy.add(resource);
      const value: FaultValue = {
        id: fault.id,
        kind: fault.kind,
        target: fault.target,
        nodes: targets,
        params: fault.params,
      };
      const injectedAt = history.append({ process: "nemesis", type: "info", f: "inject", value }).t;
      let entry: ActiveFault | undefined;
      try {
        const heal = await inject(fault, targets);
        entry = { fault, targets, heal, healed: false };
        activeFaults.add(entry);
        await sleep(Math.max(0, injectedAt + fault.durationMs - history.elapsed()), undefined, {
          signal: options.signal,
        }).catch(() => {});
        if (!entry.healed) {
          entry.healed = true;
          await heal();
          history.append({ process: "nemesis", type: "info", f: "heal", value });
        }
      } catch (error) {
        history.append({
          process: "nemesis",
          type: "info",
          f: "heal",
          value: { ...value, note: `error: ${errorMessage(error)}` },
        });
        line(`#${fault.id} ${fault.kind}: ${errorMessage(error)}`);
      } finally {
        if (entry) activeFaults.delete(entry);
        for (const resource of resources) busy.delete(resource);
      }
      const healedAt = history.elapsed();
      // Give the shard a moment to react before reading what the fault did.
      const settleBy = performance.now() + 2 * config.failureTimeoutMs + 4000;
      while (performance.now() < settleBy && !options.signal?.aborted) {
        const topology = observer.last;
        if (topology?.status === "online" && history.elapsed() - healedAt > config.failureTimeoutMs) {
          const lastAck = [...history.ops]
            .reverse()
            .find((op) => op.process === "writer" && op.type === "ok");
          if (lastAck && lastAck.t > healedAt && lastAck.node === topology.primary_node_id) break;
        }
        await sleep(200);
      }
      const outcome = await outcomeOf(fault, targets, injectedAt, healedAt);
      outcomes.push({
        id: fault.id,
        kind: fault.kind,
        target: fault.target,
        nodes: targets,
        params: fault.params,
        injectedAtS: injectedAt / 1000,
        healedAtS: healedAt / 1000,
        skipped: undefined,
        hitPrimary: primaryAtInject !== undefined && targets.includes(primaryAtInject),
        ...outcome,
      });
      line(outcome.line);
    };

    // The schedule, on time.
    const tasks: Promise<void>[] = [];
    for (const fault of schedule) {
      const wait = started + fault.atMs - performance.now();
      if (wait > 0) await sleep(wait, undefined, { signal: options.signal }).catch(() => {});
      if (options.signal?.aborted) break;
      const chosen = makeUps.take(fault);
      if (chosen !== fault) {
        line(
          `t=${seconds(history.elapsed())}s #${fault.id} ${fault.kind} (already injected ${makeUps.count(fault.kind)} times) gives its slot to a make-up of skipped #${String(chosen.params.makeUpOf)}: ${describeFault(chosen)}`,
        );
      }
      tasks.push(runFault(chosen).catch((error) => line(`#${chosen.id}: ${errorMessage(error)}`)));
    }
    const endAt = started + options.minutes * 60_000;
    if (!options.signal?.aborted && endAt > performance.now()) {
      await sleep(endAt - performance.now(), undefined, { signal: options.signal }).catch(() => {});
    }

    // Heal all: whatever is still active, then every process continued, every proxy passing, every
    // agent running, every node not killed for good restarted.
    line(`t=${seconds(history.elapsed())}s healing everything`);
    for (const entry of [...activeFaults]) if (!entry.healed) await healNow(entry);
    await Promise.all(tasks);
    for (const proxy of proxies) proxy.heal();
    effects.clear();
    if (active.netlab) await active.heal().catch((error) => line(`lab heal: ${errorMessage(error)}`));
    if (clockShim) for (const id of nodeIds) writeFileSync(clockFile(id), "0");
    for (const node of memberNodes()) if (!dead.has(node.id)) node.signal("SIGCONT");
    for (const proc of controllers) proc.child.kill("SIGCONT");
    for (const id of nodeIds) {
      active.signalAgent(id, "SIGCONT");
      if (!active.agentRunning(id)) active.startAgent(id);
    }
    history.append({
      process: "nemesis",
      type: "info",
      f: "heal",
      value: { id: 0, kind: "heal-all", target: "all", nodes: [...nodeIds] },
    });

    // Settle: one primary, every live node following it, the topology naming it, a write acknowledged.
    const settleStart = performance.now();
    const settleTimeoutMs = options.settleTimeoutMs ?? 60_000;
    let settled = false;
    let operatorRecovery: string | undefined;
    while (performance.now() - settleStart < settleTimeoutMs && !options.signal?.aborted) {
      const topology = await active.topology().catch(() => undefined);
      if (
        topology?.status === "offline" &&
        operatorRecovery === undefined &&
        performance.now() - settleStart > OPERATOR_PATIENCE_MS
      ) {
        // Offline after everything healed, with no node the controller may pick by itself: do what
        // an operator would (docs/controller.md rule 7), keep the most data, and say so. Recorded
        // before it runs too: the epoch change it causes may be observed before it returns.
        history.append({ process: "nemesis", type: "invoke", f: "recover" });
        operatorRecovery = await recoverAsOperator(active, config, givePriority).catch(
          (error) => `failed: ${errorMessage(error)}`,
        );
        line(`shard offline after heal-all: ${operatorRecovery}`);
        history.append({ process: "nemesis", type: "info", f: "recover", value: { note: operatorRecovery } });
      }
      if (topology?.status === "online" && topology.primary_node_id) {
        const final = await readFinalWithRereads(
          memberNodes().map((node) => ({ node, alive: !dead.has(node.id) })),
          () => undefined,
          `${keyPrefix}none`,
          topology,
          {
            deadlineMs: Math.min(FINAL_REREAD_MS, settleTimeoutMs - (performance.now() - settleStart)),
            log: line,
            signal: options.signal,
          },
        );
        const live = final.nodes.filter((node) => node.reachable);
        const masters = live.filter((node) => node.role === "master");
        const following = live.every(
          (node) =>
            node.node === topology.primary_node_id ||
            (node.following === topology.primary_node_id && node.linkUp),
        );
        const lastAck = [...history.ops].reverse().find((op) => op.process === "writer" && op.type === "ok");
        if (
          masters.length === 1 &&
          masters[0]?.node === topology.primary_node_id &&
          following &&
          lastAck &&
          lastAck.t > settleStart - started
        ) {
          settled = true;
          break;
        }
      }
      await sleep(250);
    }
    const settleMs = Math.round(performance.now() - settleStart);
    line(
      settled ? `settled in ${seconds(settleMs)} s` : `did NOT settle within ${seconds(settleTimeoutMs)} s`,
    );
    onCall.stop();
    await writer.stop();
    await stray.stop();
    await sampler.stop();
    await observer.stop();
    // Replication of the last writes.
    await sleep(500);
    const topology = await active.topology().catch(() => undefined);
    // A live node whose read fails (a stall on an overloaded host, a resync's -LOADING to KEYS) is
    // read again before the checker judges (nemesis seed 7336: the settled primary, unread, was "0 primaries").
    const final = await readFinalWithRereads(
      memberNodes().map((node) => ({ node, alive: !dead.has(node.id) })),
      (key) => writer.seqOf(key),
      `${keyPrefix}k*`,
      topology,
      { deadlineMs: FINAL_REREAD_MS, log: line },
    );
    history.append({
      process: "final",
      type: "ok",
      f: "read",
      value: {
        topology: topology?.primary_node_id,
        nodes: final.nodes.map((n) => ({
          node: n.node,
          reachable: n.reachable,
          role: n.role,
          following: n.following,
          keys: n.seqs?.length,
          error: n.error,
        })),
      },
    });
    const limitMs = options.availabilityLimitMs ?? availabilityLimitMs(config);
    const result = check(history.ops, final, {
      availabilityLimitMs: limitMs,
      fenceWindowMs: options.fenceWindowMs ?? FENCE_WINDOW_MS,
      causeWindowMs: options.causeWindowMs ?? 15_000,
      maxWriteGapMs: options.maxWriteGapMs ?? 10_000,
    });
    const failovers = result.stats.epochChanges;
    if (result.valid !== true) keepLogs = true;
    // Time to a writable primary, from faults that hit the primary's node (faults elsewhere that
    // overlapped a failover would count someone else's failover).
    const ttw = outcomes
      .filter((o) => o.hitPrimary)
      .map((o) => o.timeToWritableMs)
      .filter((ms): ms is number => ms !== undefined);
    const faultsByKind: Record<string, { injected: number; skipped: number }> = {};
    for (const kind of faultsEnabled) faultsByKind[kind] = { injected: 0, skipped: 0 };
    for (const outcome of outcomes) {
      const entry = faultsByKind[outcome.kind] ?? { injected: 0, skipped: 0 };
      if (outcome.skipped) entry.skipped++;
      else entry.injected++;
      faultsByKind[outcome.kind] = entry;
    }
    outcomes.sort((x, y) => x.id - y.id);
    return {
      seed: options.seed,
      minutes: options.minutes,
      nodes: nodeCount,
      faultsEnabled,
      config,
      command,
      shard: active.shard,
      historyPath,
      logDir: active.logDir,
      faultsByKind,
      failovers,
      timeToWritableMs: { median: percentile(ttw, 50), p99: percentile(ttw, 99), samples: ttw.length },
      writes: {
        attempted: result.stats.attempted,
        ackedByReplica: result.stats.ackedByReplica,
        ackedAsyncOnly: result.stats.ackedAsyncOnly,
        failed: result.stats.failed,
        indeterminate: result.stats.indeterminate,
        lost: result.lost.length,
        asyncOnlyLost: result.asyncOnly.length,
        recovered: result.recovered.length,
        unexpected: result.unexpected.length,
      },
      samples: result.stats.samples,
      twoWritableSamples: result.twoWritable.length,
      unavailable: result.unavailable,
      availability: result.availability,
      availabilityLimitMs: limitMs,
      priorities,
      strayWrites: stray.writes,
      twoWritableInWindow: result.stats.twoWritableInWindow,
      settled,
      operatorRecovery,
      operatorPages: onCall.pages,
      duplicatedCommands: duplicatesSent,
      settleMs,
      valid: result.valid,
      violations: result.violations,
      lostSeqs: result.lost.slice(0, 200),
      timeline: outcomes,
    };
  } finally {
    await cluster?.stop({ keepLogs });
    await Promise.all([...everStarted].map((node) => node.stop().catch(() => undefined)));
    if (!keepLogs && options.historyPath === undefined)
      rmSync(dirname(historyPath), { recursive: true, force: true });
    await Promise.all(proxies.map((proxy) => proxy.stop()));
    if (ownsStack) await stack.stop();
    if (clockDir) rmSync(clockDir, { recursive: true, force: true });
  }
}

export function formatReport(report: NemesisReport): string {
  const rows: string[][] = [["fault", "injected", "skipped"]];
  for (const [kind, counts] of Object.entries(report.faultsByKind))
    rows.push([kind, String(counts.injected), String(counts.skipped)]);
  const width = rows.reduce(
    (w, row) => row.map((cell, index) => Math.max(w[index] ?? 0, cell.length)),
    [] as number[],
  );
  const table = rows.map((row) =>
    row
      .map((cell, index) => (index === 0 ? cell.padEnd(width[index] ?? 0) : cell.padStart(width[index] ?? 0)))
      .join("  "),
  );
  const ms = (value: number | undefined) => (value === undefined ? "-" : `${seconds(value)} s`);
  const lines = [
    "",
    `nemesis seed ${report.seed}, ${report.minutes} min, ${report.nodes} nodes, shard ${report.shard}`,
    ...table,
    `failovers (epoch changes):          ${report.failovers}`,
    `time to writable primary:           median ${ms(report.timeToWritableMs.median)}, p99 ${ms(report.timeToWritableMs.p99)} (${report.timeToWritableMs.samples} failovers timed)`,
    `writes attempted:                   ${report.writes.attempted}`,
    `acked by a replica (WAIT >= 1):     ${report.writes.ackedByReplica}`,
    `acked by the primary alone:         ${report.writes.ackedAsyncOnly}`,
    `failed / indeterminate:             ${report.writes.failed} / ${report.writes.indeterminate}`,
    `LOST (replica-acked, missing):      ${report.writes.lost}`,
    `async-only acked and missing:       ${report.writes.asyncOnlyLost}`,
    `recovered (unacked but present):    ${report.writes.recovered}`,
    `two-writable samples:               ${report.twoWritableSamples} outside the fence window, ${report.twoWritableInWindow} inside (of ${report.samples})`,
    `unavailable > 10 s (no write acked): ${report.unavailable.length === 0 ? "never" : `${report.unavailable.length} times, longest ${seconds(Math.max(...report.unavailable.map((u) => u.ms)))} s`}`,
    ...report.unavailable.map(
      (u) =>
        `  t=${seconds(u.from)}-${seconds(u.to)}s (${seconds(u.ms)} s) during ${u.faults.length > 0 ? u.faults.join("; ") : "no fault"}`,
    ),
    `no writable primary, faults healed: ${report.availability.length === 0 ? "never" : `${report.availability.length} times`} (limit ${seconds(report.availabilityLimitMs)} s, guarantee 3)`,
    ...report.availability.map(
      (b) => `  t=${seconds(b.from)}-${seconds(b.to)}s (${seconds(b.ms)} s) after ${b.cause}`,
    ),
    ...(report.priorities ? [`priorities at the start:            ${report.priorities.join(", ")}`] : []),
    `stray writes (to a non-advertised master): ${report.strayWrites}`,
    `settled after heal-all:             ${report.settled ? `yes, in ${seconds(report.settleMs)} s` : "NO"}`,
    `commands sent again (dup-commands): ${report.duplicatedCommands}`,
    ...(report.operatorRecovery ? [`operator action:                    ${report.operatorRecovery}`] : []),
    ...(report.operatorPages > 0
      ? [
          `operator paged (priority-0 holder): ${report.operatorPages} (given a priority after ${OPERATOR_PAGE_MS / 1000} s)`,
        ]
      : []),
    `verdict:                            ${report.valid === true ? "valid" : report.valid === false ? "INVALID" : "UNKNOWN"}`,
    ...report.violations.map((violation) => `  violation: ${violation}`),
    `history: ${report.historyPath}`,
    `process logs: ${report.logDir}`,
  ];
  return lines.join("\n");
}

export function formatTimeline(report: NemesisReport): string {
  return [
    `fault timeline of seed ${report.seed} (replay: ${report.command}):`,
    ...report.timeline.map((o) => `  ${o.line}`),
  ].join("\n");
}

export function writeNemesisReport(report: NemesisReport, path: string): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify({ ...report, ...codeVersion() }, null, 2)}\n`);
}
