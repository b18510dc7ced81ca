import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import {
  type AgentDeps,
  type AgentHandle,
  type StartAgentExtras,
  startAgent,
} from "../../src/agent/agent.ts";
import type { AgentOptionsInput } from "../../src/agent/options.ts";
import type { AgentState, StateDir } from "../../src/agent/state-dir.ts";
import type { Command, FailoverState, Heartbeat, HeartbeatInput, Topology } from "../../src/core/model.ts";
import type { Logger } from "../../src/core/observability.ts";
import type { HeartbeatStore, ShardSnapshot } from "../../src/core/ports.ts";
import type { WakeSender } from "../../src/core/wake.ts";
import { type RedisNode, startRedisNodes } from "../../src/dev/local-stack/redis-nodes.ts";
import { awsEnv, tableName, uniqueName } from "./aws.ts";
import { TcpProxy } from "./tcp-proxy.ts";
import { waitFor } from "./wait.ts";

/** Short timings so that agent tests run in seconds (the production defaults are 5x longer). */
/** A state dir's in-memory part, without its file: \`state\` and \`update\` (unit tests of agent code). */
export function memoryState(initial: Partial<AgentState> = {}): StateDir {
  const held = { state: initial as AgentState };
  return {
    get state() {
      return held.state;
    },
    update(changes: Partial<AgentState>) {
      held.state = { ...held.state, ...changes };
    },
  } as Partial<StateDir> as StateDir;
}

export const FAST_TIMINGS = {
  heartbeatIntervalMs: 200,
  fenceTimeoutMs: 600,
  failureTimeoutMs: 1000,
  commandWaitSeconds: 2,
} as const;

export interface LogLine {
  readonly level: "debug" | "info" | "warn" | "error";
  readonly message: string;
  readonly attributes: Record<string, unknown>;
}

/** Records an agent's log lines so that tests can assert what it said. */
export class RecordingLogger implements Logger {
  readonly lines: LogLine[] = [];
  debug(message: string, attributes: Record<string, unknown> = {}) {
    this.lines.push({ level: "debug", message, attributes });
  }
  info(message: string, attributes: Record<string, unknown> = {}) {
    this.lines.push({ level: "info", message, attributes });
  }
  warn(message: string, attributes: Record<string, unknown> = {}) {
    this.lines.push({ level: "warn", message, attributes });
  }
  error(message: string, attributes: Record<string, unknown> = {}) {
    this.lines.push({ level: "error", message, attributes });
  }
  find(message: string | RegExp): LogLine | undefined {
    return this.lines.find((line) =>
      typeof message === "string" ? line.message === message : message.test(line.message),
    );
  }
}

/** Every heartbeat an agent wrote, in order: lets a test prove what was never claimed. */
export class RecordingHeartbeatStore implements HeartbeatStore {
  readonly written: HeartbeatInput[] = [];
  private readonly inner: HeartbeatStore;
  constructor(inner: HeartbeatStore) {
    this.inner = inner;
  }
  async put(heartbeat: HeartbeatInput): Promise<void> {
    await this.inner.put(heartbeat);
    this.written.push(heartbeat);
  }
  snapshot(shard: string): Promise<ShardSnapshot> {
    return this.inner.snapshot(shard);
  }
  deleteNode(shard: string, nodeId: string): Promise<void> {
    return this.inner.deleteNode(shard, nodeId);
  }
}

export interface TestAgent {
  readonly handle: AgentHandle;
  readonly logger: RecordingLogger;
  readonly heartbeats: RecordingHeartbeatStore;
  readonly stateDir: string;
}

/**
 * One shard's worth of test fixtures: redis-server nodes, AWS adapters on the local stack, and
 * in-process agents, all stopped by `close()`.
 */
export class AgentFixture {
  readonly shard = uniqueName("s").slice(0, 24);
  readonly aws: AwsAdapters;
  readonly nodes: RedisNode[] = [];
  private readonly agents: TestAgent[] = [];
  private readonly dirs: string[] = [];
  private readonly extraAdapters: AwsAdapters[] = [];
  private commandCounter = 0;
  /** Where the agents started from now on send their controller wake-ups (none by default). */
  wake: WakeSender | undefined;

  constructor() {
    this.aws = this.adapters();
  }

  /** Adapters on the local stack; `env` overrides (e.g. a proxied DynamoDB endpoint). */
  adapters(env: Record<string, string> = {}): AwsAdapters {
    const built = createAwsAdapters({
      env: { ...awsEnv(), ...env },
      tableName: tableName(),
      logger: silentLogger,
      // A cut-off store should fail fast in tests, as it would with a dead network.
      maxAttempts: 1,
    });
    this.extraAdapters.push(built);
    return built;
  }

  /**
   * Adapters whose DynamoDB traffic goes through a proxy the test can cut (a real outage of the
   * table), and that proxy; the test closes it.
   */
  async adaptersBehindProxy(): Promise<{ aws: AwsAdapters; proxy: TcpProxy }> {
    const endpoint = new URL(awsEnv().AWS_ENDPOINT_URL_DYNAMODB ?? "");
    const proxy = new TcpProxy(endpoint.hostname, Number(endpoint.port));
    await proxy.start();
    return { aws: this.adapters({ AWS_ENDPOINT_URL_DYNAMODB: proxy.url }), proxy };
  }

  async startRedis(count: number): Promise<RedisNode[]> {
    const started = await startRedisNodes(count);
    this.nodes.push(...started);
    return started;
  }

  newStateDir(): string {
    const dir = mkdtempSync(join(tmpdir(), "shardguard-agent-test-"));
    this.dirs.push(dir);
    return dir;
  }

  depsFrom(aws: AwsAdapters, heartbeats: HeartbeatStore, logger: Logger): AgentDeps {
    return {
      heartbeats,
      replicaSets: aws.store.replicaSets,
      topology: aws.store.topology,
      shards: aws.store.shards,
      commands: aws.bus,
      clock: aws.clock,
      logger,
      ...(this.wake ? { wake: this.wake } : {}),
    };
  }

  async startAgent(
    node: RedisNode,
    options: Partial<AgentOptionsInput> = {},
    aws: AwsAdapters = this.aws,
    extras: StartAgentExtras = {},
  ): Promise<TestAgent> {
    const logger = new RecordingLogger();
    const heartbeats = new RecordingHeartbeatStore(aws.store.heartbeats);
    const stateDir = options.stateDir ?? this.newStateDir();
    const handle = await startAgent(
      { shard: this.shard, redis: node.address, stateDir, ...FAST_TIMINGS, ...options },
      this.depsFrom(aws, heartbeats, logger),
      extras,
    );
    const agent = { handle, logger, heartbeats, stateDir };
    this.agents.push(agent);
    return agent;
  }

  snapshot(): Promise<ShardSnapshot> {
    return this.aws.store.heartbeats.snapshot(this.shard);
  }

  async heartbeatOf(nodeId: string): Promise<Heartbeat | undefined> {
    return (await this.snapshot()).nodes.find((node) => node.node_id === nodeId);
  }

  /** Waits until the node's stored heartbeat satisfies `accept`. */
  waitForHeartbeat(
    nodeId: string,
    accept: (heartbeat: Heartbeat) => boolean,
    what: string,
    timeoutMs = 10_000,
  ) {
    return waitFor(
      async () => {
        const heartbeat = await this.heartbeatOf(nodeId);
        return heartbeat && accept(heartbeat) ? heartbeat : undefined;
      },
      `${nodeId}: ${what}`,
      timeoutMs,
    );
  }

  command(type: Command["type"], epoch: number, extra: Partial<Command> = {}): Command {
    this.commandCounter++;
    return {
      type,
      shard: this.shard,
      epoch,
      command_id: `cmd-${this.commandCounter}-${Math.random().toString(36).slice(2, 8)}`,
      issued_at: Date.now(),
      ...extra,
    } as Command;
  }

  send(nodeId: string, command: Command): Promise<void> {
    return this.aws.bus.send(this.shard, nodeId, command);
  }

  /** Writes a topology as the controller would (compare-and-set on the stored epoch). */
  async setTopology(expectedEpoch: number | undefined, topology: Omit<Topology, "shard" | "updated_at">) {
    const written = await this.aws.store.topology.compareAndSet(this.shard, expectedEpoch, {
      shard: this.shard,
      updated_at: Date.now(),
      ...topology,
    });
    if (!written) throw new Error(`topology of ${this.shard} is not at epoch ${expectedEpoch}`);
  }

  /**
   * What a controller writes before it sends a change's commands (an agent obeys a command only
   * when it fits the topology): the shard `kind` from `from` to `to` at `epoch`, with no topology before.
   */
  async planChange(
    kind: "failover" | "switchover",
    epoch: number,
    from: { readonly id: string; readonly address: string },
    to: { readonly id: string; readonly address: string },
  ): Promise<void> {
    await this.setTopology(undefined, {
      epoch,
      primary_node_id: from.id,
      primary_address: from.address,
      status: "failing_over",
      phase: kind === "switchover" ? "catch_up" : "promote",
      failover: {
        kind,
        old_primary_node_id: from.id,
        new_primary_node_id: to.id,
        new_primary_address: to.address,
        reason: "test",
        started_at: Date.now(),
        candidates: [],
        phase_started: {},
      },
    });
  }

  /** One redis-server node, primary `nodeId` of the shard's topology: online at epoch 0. */
  async onlinePrimary(nodeId = "n1"): Promise<RedisNode> {
    const [node] = await this.startRedis(1);
    if (!node) throw new Error("redis node missing");
    await this.setTopology(undefined, {
      epoch: 0,
      primary_node_id: nodeId,
      primary_address: node.address,
      status: "online",
    });
    return node;
  }

  /**
   * n1 primary of the shard's topology (online at epoch 0) and n2 its replica, each with its agent,
   * once n2 reports its link up and n1 takes writes.
   */
  async linkedPair(): Promise<{ n1: RedisNode; n2: RedisNode; n1Agent: TestAgent; n2Agent: TestAgent }> {
    const [n1, n2] = await this.startRedis(2);
    if (!n1 || !n2) throw new Error("redis nodes missing");
    await this.setTopology(undefined, {
      epoch: 0,
      primary_node_id: "n1",
      primary_address: n1.address,
      status: "online",
    });
    const n1Agent = await this.startAgent(n1, { nodeId: "n1" });
    const n2Agent = await this.startAgent(n2, { nodeId: "n2" });
    await this.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "n2 linked");
    await waitFor(async () => (await tryWrite(n1, "linked-pair")) === "OK", "n1 writable");
    return { n1, n2, n1Agent, n2Agent };
  }

  /**
   * n1 dies (its agent first, then its database, SIGKILL) and the controller plans the failover to
   * n2 at epoch 1 (phase promote, \`candidates\` as ranked), sending nothing yet.
   */
  async primaryDiesForN2(
    pair: { n1: RedisNode; n2: RedisNode; n1Agent: TestAgent },
    candidates: FailoverState["candidates"] = [],
  ): Promise<void> {
    await this.stopAgent(pair.n1Agent);
    pair.n1.signal("SIGKILL");
    await this.setTopology(0, {
      epoch: 1,
      primary_node_id: "n1",
      primary_address: pair.n1.address,
      status: "failing_over",
      phase: "promote",
      failover: {
        kind: "failover",
        old_primary_node_id: "n1",
        new_primary_node_id: "n2",
        new_primary_address: pair.n2.address,
        reason: "test: n1 down",
        started_at: Date.now(),
        candidates,
        phase_started: {},
      },
    });
  }

  async stopAgent(agent: TestAgent): Promise<void> {
    await agent.handle.stop();
    this.agents.splice(this.agents.indexOf(agent), 1);
  }

  async close(): Promise<void> {
    await Promise.allSettled(this.agents.map((agent) => agent.handle.stop()));
    await Promise.allSettled(this.nodes.map((node) => node.destroy()));
    for (const built of this.extraAdapters) built.destroy();
    for (const dir of this.dirs) rmSync(dir, { recursive: true, force: true });
  }
}

/** INFO replication role of a node as redis itself reports it ("master" / "slave"). */
export async function redisRole(node: RedisNode): Promise<string> {
  const client = node.client({ maxRetriesPerRequest: 0, lazyConnect: true });
  try {
    await client.connect();
    const info = await client.info("replication");
    return /role:(\w+)/.exec(info)?.[1] ?? "unknown";
  } finally {
    client.disconnect();
  }
}

/** "OK" or the error reply (e.g. NOREPLICAS, READONLY) of one write. */
export async function tryWrite(node: RedisNode, key = "probe"): Promise<string> {
  const client = node.client({ maxRetriesPerRequest: 0 });
  try {
    return await client.set(key, String(Date.now()));
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  } finally {
    client.disconnect();
  }
}
