import { execFile } from "node:child_process";
import { createWriteStream, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { type AwsAdapters, createAwsAdapters } from "../adapters/aws-adapters.ts";
import { ENV } from "../adapters/env.ts";
import { endpointOf } from "../client/primary-resolver.ts";
import { type FailoverConfigInput, parseFailoverConfig } from "../core/config.ts";
import type { Heartbeat, Topology } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import { type ManagedProcess, startProcess } from "./local-stack/processes.ts";
import { type RedisNode, type RedisSecurity, startRedisNodes } from "./local-stack/redis-nodes.ts";
import { type LocalStack, startLocalStack } from "./local-stack/stack.ts";
import { type Cut, NetLab, type PartitionSpec } from "./netlab/netlab.ts";

/** The CLI beside this module: the TypeScript source in a checkout, the compiled file in a package. */
const CLI = fileURLToPath(
  new URL(`../cli/main.${import.meta.url.endsWith(".ts") ? "ts" : "js"}`, import.meta.url),
);

export interface LocalClusterOptions {
  /** redis-server nodes: node-1 starts as primary, the rest as its replicas. @default 3 */
  readonly nodes?: number;
  /** @default a unique id */
  readonly shard?: string;
  /** Controller and agent timings; agents get heartbeat and fence timeouts from it. */
  readonly config?: FailoverConfigInput;
  /** Controller processes to start. @default 1 */
  readonly controllers?: number;
  /** An already running stack (tests share one); otherwise one is started and stopped with the cluster. */
  readonly stack?: LocalStack;
  /**
   * TLS and ACL users of the redis-server nodes; the agents' side goes in `agentEnv` (e.g.
   * SHARDGUARD_AGENT_CONFIG naming a config file). @default plain TCP, the default user
   */
  readonly redisSecurity?: RedisSecurity;
  /** Per-node promotion priority (index = node number - 1). @default 100 each */
  readonly priorities?: readonly number[];
  /** Progress lines. */
  readonly onProgress?: (line: string) => void;
  /** How long start() waits for the shard to be online. @default 30000 */
  readonly readyTimeoutMs?: number;
  /**
   * Extra environment of the agent beside node `id` (e.g. its own AWS endpoints through a proxy);
   * applied to every start of that agent, under the `env` given to `startAgent`.
   */
  readonly agentEnv?: (id: string) => NodeJS.ProcessEnv | undefined;
  /** Extra environment of controller number `serial` (1, 2, ...), applied to every controller started. */
  readonly controllerEnv?: (serial: number) => NodeJS.ProcessEnv | undefined;
  /**
   * `netns`: each node's redis-server and agent run in the node's own network namespace of a
   * `NetLab` (docs/chaos.md#the-network-lab), bound to its lab address, the agents reaching
   * DynamoDB and SQS through the host's lab address; `partition` and `heal` cut real links.
   * Needs root (`NetLab.available()`); callers without it keep `loopback`. Endpoints that
   * `agentEnv` gives on 127.0.0.1 are not rewritten: use `netlab.hostUrl` there.
   * @default "loopback" (every process on 127.0.0.1 of the host)
   */
  readonly network?: "loopback" | "netns";
  /**
   * Extra environment of node `id`'s redis-server, kept for its every restart (the nemesis runs
   * redis under a clock shim with it). @default none
   */
  readonly redisEnv?: (id: string) => NodeJS.ProcessEnv | undefined;
  /**
   * `network: "netns"`: called with the lab once it exists, before any process starts (the nemesis
   * opens its proxies on the lab's AWS address there).
   */
  readonly onNetlab?: (lab: NetLab) => Promise<void> | void;
}

/** How one agent process is started (all optional; the defaults are the plain start). */
export interface StartAgentOptions {
  /** Environment added to the cluster's (and to the `agentEnv` hook's) for this process only. */
  readonly env?: NodeJS.ProcessEnv;
  /** Starts with a new, empty state dir, as on a host that lost its disk. */
  readonly wipeStateDir?: boolean;
  /** `--priority` of this start and every later one (an operator changing it). @default the cluster's */
  readonly priority?: number;
}

/**
 * One shard the way production runs it, on this machine: redis-server nodes, one `shardguard
 * agent` process beside each, and `shardguard controller` processes, all talking to DynamoDB and
 * SQS through the standard SDK variables. Used by the demo, the chaos tests and the benchmark;
 * every process is a real child process that can be SIGKILLed, SIGSTOPped or restarted.
 */
export class LocalCluster {
  readonly shard: string;
  readonly redis: RedisNode[];
  readonly stack: LocalStack;
  readonly aws: AwsAdapters;
  /** Agent and controller output, one file per process. */
  readonly logDir: string;
  readonly env: NodeJS.ProcessEnv;
  /** The network lab of `network: "netns"`; undefined in the loopback mode. */
  readonly netlab: NetLab | undefined;
  readonly #ownsStack: boolean;
  readonly #agents = new Map<string, ManagedProcess>();
  /** performance.now() when each node's agent was last started. */
  readonly #agentStartedAt = new Map<string, number>();
  readonly #controllers: ManagedProcess[] = [];
  readonly #stateDirs = new Map<string, string>();
  readonly #priorities: readonly number[];
  /** Priorities changed since the start (`startAgent` with `priority`), by node id. */
  readonly #priorityChanges = new Map<string, number>();
  readonly #agentEnv: ((id: string) => NodeJS.ProcessEnv | undefined) | undefined;
  readonly #controllerEnv: ((serial: number) => NodeJS.ProcessEnv | undefined) | undefined;
  #controllerSerial = 0;

  private constructor(
    init: Pick<LocalCluster, "shard" | "redis" | "stack" | "aws" | "logDir" | "env" | "netlab"> & {
      ownsStack: boolean;
      priorities: readonly number[];
      agentEnv?: (id: string) => NodeJS.ProcessEnv | undefined;
      controllerEnv?: (serial: number) => NodeJS.ProcessEnv | undefined;
    },
  ) {
    this.shard = init.shard;
    this.redis = init.redis;
    this.stack = init.stack;
    this.aws = init.aws;
    this.logDir = init.logDir;
    this.env = init.env;
    this.netlab = init.netlab;
    this.#ownsStack = init.ownsStack;
    this.#priorities = init.priorities;
    this.#agentEnv = init.agentEnv;
    this.#controllerEnv = init.controllerEnv;
  }

  static async start(options: LocalClusterOptions = {}): Promise<LocalCluster> {
    const progress = options.onProgress ?? (() => {});
    const config = parseFailoverConfig(options.config ?? {});
    const shard = options.shard ?? `demo-${Math.random().toString(36).slice(2, 8)}`;
    const stack = options.stack ?? (await startLocalStack({ onProgress: progress }));
    const ownsStack = options.stack === undefined;
    let redis: RedisNode[] = [];
    let started: LocalCluster | undefined;
    let netlab: NetLab | undefined;
    try {
      if (options.network === "netns") {
        const ids = Array.from({ length: options.nodes ?? 3 }, (_, index) => `node-${index + 1}`);
        netlab = await NetLab.create({ nodes: ids });
        progress(`network lab ${netlab.id}: namespaces for ${ids.join(", ")}, AWS at ${netlab.awsAddress}`);
        await options.onNetlab?.(netlab);
      }
      const lab = netlab;
      progress(`starting ${options.nodes ?? 3} redis-server nodes`);
      redis = await startRedisNodes(
        options.nodes ?? 3,
        options.redisSecurity,
        options.redisEnv,
        lab && ((id) => ({ namespace: lab.node(id).namespace, host: lab.node(id).address })),
      );
      const env: NodeJS.ProcessEnv = {
        ...process.env,
        ...stack.env,
        [ENV.heartbeatIntervalMs]: String(config.heartbeatIntervalMs),
        [ENV.failureTimeoutMs]: String(config.failureTimeoutMs),
        [ENV.fenceTimeoutMs]: String(config.fenceTimeoutMs),
        [ENV.tickIntervalMs]: String(config.tickIntervalMs),
        [ENV.lockLeaseMs]: String(config.lockLeaseMs),
        [ENV.maxLagOnFailover]: String(config.maxLagOnFailover),
        [ENV.quorum]: config.quorum,
        [ENV.cooldownMs]: String(config.cooldownMs),
        [ENV.shard]: shard,
      };
      const cluster = new LocalCluster({
        shard,
        redis,
        stack,
        aws: createAwsAdapters({ env, maxAttempts: 2 }),
        logDir: mkdtempSync(join(tmpdir(), `shardguard-cluster-${shard}-`)),
        env,
        netlab,
        ownsStack,
        priorities: options.priorities ?? [],
        agentEnv: options.agentEnv,
        controllerEnv: options.controllerEnv,
      });
      started = cluster;
      progress("starting one agent per node and the controller");
      for (const node of redis) cluster.startAgent(node.id);
      for (let index = 0; index < (options.controllers ?? 1); index++) cluster.startController();
      const primary = redis[0];
      await cluster.waitFor(
        "the shard online with every node heartbeating and every replica in the primary's stored replica set",
        async () => {
          const snapshot = await cluster.snapshot();
          // The steady state tests start from: a primary failing before its agent stored its set
          // leaves no member to wait for (gate member_unheard), which is not what a test means by
          // "the primary dies" (a fresh-clone CI run under load: node-3 promoted while node-2's
          // agent was stalled, node-1 having stored no set yet).
          const stored = primary === undefined ? undefined : snapshot.replicaSets[primary.id];
          const versioned = primary !== undefined && snapshot.replicaSetVersions[primary.id] !== undefined;
          const others = redis.filter((node) => node.id !== primary?.id).map((node) => node.id);
          return (
            snapshot.topology?.status === "online" &&
            snapshot.topology.primary_node_id === primary?.id &&
            snapshot.nodes.length === redis.length &&
            snapshot.nodes.every((node) => node.db_status === "up") &&
            (others.length === 0 || (versioned && others.every((id) => stored?.includes(id) === true)))
          );
        },
        options.readyTimeoutMs ?? 30_000,
      );
      return cluster;
    } catch (error) {
      // The agents and controllers already started go too (their logs stay for the error message).
      if (started !== undefined) {
        await started.stop({ keepLogs: true }).catch(() => {});
        throw error;
      }
      await Promise.all(redis.map((node) => node.destroy()));
      netlab?.closeSync();
      if (ownsStack) await stack.stop();
      throw error;
    }
  }

  node(id: string): RedisNode {
    const node = this.redis.find((candidate) => candidate.id === id);
    if (!node) throw new Error(`no node ${id} in this cluster`);
    return node;
  }

  /**
   * Starts (or restarts) the agent beside node `id`; its state dir survives restarts unless
   * `wipeStateDir`. `env` is added to this process's environment only.
   */
  /**
   * Adds a database started beside the cluster (e.g. a replica attached with no agent yet) as node
   * \`node.id\`: \`startAgent\` can then start its agent, and \`stop\` destroys it with the others.
   */
  attach(node: RedisNode): void {
    if (this.redis.some((known) => known.id === node.id))
      throw new Error(`node ${node.id} is already in this cluster`);
    this.redis.push(node);
  }

  startAgent(id: string, options: StartAgentOptions = {}): void {
    const node = this.node(id);
    this.#agents.get(id)?.child.kill("SIGKILL");
    let stateDir = this.#stateDirs.get(id);
    if (stateDir && options.wipeStateDir) {
      rmSync(stateDir, { recursive: true, force: true });
      stateDir = undefined;
    }
    if (!stateDir) {
      stateDir = mkdtempSync(join(tmpdir(), `shardguard-agent-${id}-`));
      this.#stateDirs.set(id, stateDir);
    }
    const index = this.redis.indexOf(node);
    if (options.priority !== undefined) this.#priorityChanges.set(id, options.priority);
    const args = [
      CLI,
      "agent",
      "--shard",
      this.shard,
      "--node-id",
      id,
      "--redis",
      node.address,
      "--state-dir",
      stateDir,
      "--priority",
      String(this.#priorityChanges.get(id) ?? this.#priorities[index] ?? 100),
    ];
    const env = { ...this.#labEndpoints(), ...this.#agentEnv?.(id), ...options.env };
    this.#agents.set(id, this.#spawn(`agent ${id}`, `agent-${id}.log`, args, env, this.#labNodeOf(node)));
    this.#agentStartedAt.set(id, performance.now());
  }

  /**
   * The lab node (namespace) node `node` runs in: its own, or the one its `network` names (a node
   * replacing another at its address, under a new id, runs in the old one's); none in the loopback mode.
   */
  #labNodeOf(node: RedisNode): string | undefined {
    const lab = this.netlab;
    if (!lab) return undefined;
    return lab.nodes.find((candidate) => candidate.namespace === node.network?.namespace)?.name ?? node.id;
  }

  /** True while an agent process beside node `id` runs (also when SIGSTOPped). */
  agentRunning(id: string): boolean {
    const agent = this.#agents.get(id);
    return agent !== undefined && agent.child.exitCode === null && agent.child.signalCode === null;
  }

  /** Ms since the agent beside node \`id\` was last started; undefined while none runs. */
  agentUpForMs(id: string): number | undefined {
    const startedAt = this.#agentStartedAt.get(id);
    return this.agentRunning(id) && startedAt !== undefined ? performance.now() - startedAt : undefined;
  }

  /** Stops an agent: SIGTERM for a clean stop, SIGKILL for a crash. */
  async stopAgent(id: string, signal: "SIGTERM" | "SIGKILL" = "SIGKILL"): Promise<void> {
    const agent = this.#agents.get(id);
    if (!agent) return;
    if (signal === "SIGKILL") agent.child.kill("SIGKILL");
    await agent.stop(5000);
    this.#agents.delete(id);
  }

  /**
   * Sends a signal to the agent process beside node `id` (SIGSTOP/SIGCONT to freeze it: its
   * heartbeats stop while its database lives). False when no agent runs there.
   */
  signalAgent(id: string, signal: NodeJS.Signals): boolean {
    const agent = this.#agents.get(id);
    if (!agent || agent.child.exitCode !== null || agent.child.signalCode !== null) return false;
    return agent.child.kill(signal);
  }

  /**
   * The JSON lines of one process's log (`agent-<id>.log`, `controller-<n>.log`) written so far;
   * lines that are not JSON objects (a crash trace) are skipped.
   */
  logLines(file: string): Array<Record<string, unknown>> {
    const path = join(this.logDir, file);
    if (!existsSync(path)) return [];
    const lines: Array<Record<string, unknown>> = [];
    for (const line of readFileSync(path, "utf8").split("\n")) {
      if (!line.startsWith("{")) continue;
      try {
        const parsed: unknown = JSON.parse(line);
        if (parsed !== null && typeof parsed === "object") lines.push(parsed as Record<string, unknown>);
      } catch {
        // A line cut by a kill mid-write: not a record.
      }
    }
    return lines;
  }

  /** Every controller's log lines, each tagged with its file name under `log_file`. */
  controllerLogLines(): Array<Record<string, unknown>> {
    const lines: Array<Record<string, unknown>> = [];
    for (let serial = 1; serial <= this.#controllerSerial; serial++) {
      const file = `controller-${serial}.log`;
      for (const line of this.logLines(file)) lines.push({ ...line, log_file: file });
    }
    return lines;
  }

  /** Starts one more controller process; `env` is added to its environment only. */
  startController(options: { env?: NodeJS.ProcessEnv } = {}): ManagedProcess {
    const serial = ++this.#controllerSerial;
    const env = { ...this.#controllerEnv?.(serial), ...options.env };
    const controller = this.#spawn(
      `controller ${serial}`,
      `controller-${serial}.log`,
      [CLI, "controller", "--shard", this.shard],
      env,
    );
    this.#controllers.push(controller);
    return controller;
  }

  get controllers(): readonly ManagedProcess[] {
    return this.#controllers.filter((proc) => proc.child.exitCode === null && proc.child.signalCode === null);
  }

  /** `labNode`: run inside that node's namespace of the network lab. */
  #spawn(
    name: string,
    logFile: string,
    args: string[],
    extraEnv: NodeJS.ProcessEnv = {},
    labNode?: string,
  ): ManagedProcess {
    const { command, args: argv } =
      this.netlab && labNode
        ? this.netlab.inNamespace(labNode, process.execPath, args)
        : { command: process.execPath, args };
    const proc = startProcess(name, command, argv, { env: { ...this.env, ...extraEnv } });
    const log = createWriteStream(join(this.logDir, logFile), { flags: "a" });
    proc.child.stdout?.pipe(log);
    proc.child.stderr?.pipe(log);
    return proc;
  }

  /** The stack's endpoints as a node in the network lab reaches them (none in the loopback mode). */
  #labEndpoints(): NodeJS.ProcessEnv {
    const lab = this.netlab;
    if (!lab) return {};
    const endpoints: NodeJS.ProcessEnv = {};
    for (const key of ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS"]) {
      const url = this.env[key];
      if (url) endpoints[key] = lab.hostUrl(url);
    }
    return endpoints;
  }

  /**
   * Cuts network links between nodes and AWS (`network: "netns"` only), on top of any cuts in
   * place; packets are dropped silently, established connections included. Endpoints are node ids
   * and `"aws"` (DynamoDB, SQS and the controllers, one side). Examples:
   * - a group split, both ways between groups, `{n1} | {n2, n3, AWS}`:
   *   `partition({ groups: [["node-1"], ["node-2", "node-3", "aws"]] })`;
   * - an AZ split, primary with one replica: `{ groups: [["node-1", "node-2"], ["node-3", "aws"]] }`;
   * - a two-way cut of one link: `{ cuts: [{ from: "node-1", to: "node-2" }] }`;
   * - a one-way cut: `{ cuts: [{ from: "node-2", to: "aws", oneWay: true }] }` drops only what
   *   node-2 sends to AWS; `{ from: "aws", to: "node-2", oneWay: true }` only what it receives.
   * Endpoints in no group keep every link. Returns the directed cuts the spec stands for.
   */
  partition(spec: PartitionSpec): Promise<Cut[]> {
    return this.#lab().partition(spec);
  }

  /** Removes every cut (`network: "netns"` only): all nodes and AWS reach each other again. */
  heal(): Promise<void> {
    return this.#lab().heal();
  }

  #lab(): NetLab {
    if (!this.netlab) throw new Error('partitions need LocalCluster.start({ network: "netns" })');
    return this.netlab;
  }

  snapshot(): Promise<ShardSnapshot> {
    return this.aws.store.heartbeats.snapshot(this.shard);
  }

  /** Runs `shardguard <args>` as an operator would (in-process controller path), on this stack. */
  runCli(
    args: readonly string[],
    timeoutMs = 60_000,
  ): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((resolve) => {
      execFile(
        process.execPath,
        [CLI, ...args],
        { env: this.env, timeout: timeoutMs },
        (error, stdout, stderr) => {
          const code = error ? (typeof error.code === "number" ? error.code : 1) : 0;
          resolve({ code, stdout: String(stdout), stderr: String(stderr) });
        },
      );
    });
  }

  async topology(): Promise<Topology | undefined> {
    return this.aws.store.topology.read(this.shard);
  }

  /**
   * The primary's host:port as the topology advertises it to clients, the way the client library
   * reads it (`endpointOf`): undefined while failing over until the new primary is confirmed.
   */
  async primaryAddress(): Promise<string | undefined> {
    const topology = await this.topology();
    return topology === undefined ? undefined : endpointOf(topology)?.address;
  }

  heartbeatOf(snapshot: ShardSnapshot, id: string): Heartbeat | undefined {
    return snapshot.nodes.find((node) => node.node_id === id);
  }

  /** Polls `check` every 50 ms until it holds; throws naming `what` and the last topology on timeout. */
  async waitFor(what: string, check: () => Promise<boolean> | boolean, timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    let lastError: unknown;
    while (performance.now() < deadline) {
      try {
        if (await check()) return;
      } catch (error) {
        lastError = error;
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const topology = await this.topology().catch(() => undefined);
    const detail = lastError instanceof Error ? `; last error: ${lastError.message}` : "";
    const nodes = await this.snapshot()
      .then((snapshot) => `; heartbeats: ${describeHeartbeats(snapshot.nodes, Date.now())}`)
      .catch(() => "");
    throw new Error(
      `timed out after ${timeoutMs} ms waiting for ${what}; topology: ${JSON.stringify(topology)}${nodes}${detail}; logs in ${this.logDir}`,
    );
  }

  /** Stops every process this cluster started (and the stack if it started it). */
  async stop(options: { keepLogs?: boolean } = {}): Promise<void> {
    // A SIGSTOPped process acts on SIGTERM only once continued; without this, stop waits its grace.
    for (const proc of [...this.#agents.values(), ...this.#controllers]) {
      if (proc.child.exitCode === null && proc.child.signalCode === null) proc.child.kill("SIGCONT");
    }
    await Promise.all([
      ...[...this.#agents.values()].map((agent) => agent.stop(3000)),
      ...this.#controllers.map((controller) => controller.stop(3000)),
    ]);
    await Promise.all(this.redis.map((node) => node.destroy()));
    this.aws.destroy();
    if (this.#ownsStack) await this.stack.stop();
    for (const dir of this.#stateDirs.values()) rmSync(dir, { recursive: true, force: true });
    if (!options.keepLogs) rmSync(this.logDir, { recursive: true, force: true });
    // Last: its namespaces vanish once no process is left inside, and a leftover it reports throws.
    await this.netlab?.close();
  }
}

/** One line per stored heartbeat, for a timeout's message: what each agent last reported, and when. */
function describeHeartbeats(nodes: readonly Heartbeat[], nowMs: number): string {
  return nodes
    .map((node) => {
      const ageS = ((nowMs - (node.agent_updated ?? node.last_updated) / 1000) / 1000).toFixed(1);
      const follows =
        node.role === "replica" ? ` of ${node.primary_node_id ?? "?"} link ${node.primary_link ?? "?"}` : "";
      return `${node.node_id} ${node.role}${follows} db ${node.db_status} epoch ${node.epoch ?? "?"} offset ${node.last_txn_id} written ${ageS} s ago`;
    })
    .join("; ");
}
