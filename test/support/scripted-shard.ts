import { setTimeout as delay } from "node:timers/promises";
import { afterEach } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { type Screening, screenCommand } from "../../src/agent/command-screen.ts";
import type { ControllerDeps, PhaseTimeouts } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import { isFresh } from "../../src/core/decide.ts";
import type { Command, HeartbeatInput, Topology } from "../../src/core/model.ts";
import type { ReceivedCommand } from "../../src/core/ports.ts";
import { awsEnv, uniqueName } from "./aws.ts";
import { MemoryEventPublisher, MemoryMetrics } from "./controller-fakes.ts";
import { waitFor } from "./wait.ts";

/**
 * A shard of scripted nodes on the local stack (DynamoDB Local + fauxqs), for controller tests
 * without redis: each node writes its heartbeat on a timer while "alive" and reacts to PROMOTE,
 * REPLICAOF and PAUSE_WRITES from its queue the way an agent does: each message is screened by the
 * agent's own `screenCommand` (epoch, command id, shard, topology), and what it applies shows in
 * the next heartbeat (role and epoch). A replica whose primary paused its writes catches up to the
 * primary's offset unless it is `frozen`. The timers here pace the simulation (a heartbeat every
 * interval, a controller tick); they are not waits for a condition.
 */

export const CONFIG = parseFailoverConfig({
  heartbeatIntervalMs: 150,
  failureTimeoutMs: 600,
  fenceTimeoutMs: 400,
  tickIntervalMs: 150,
  lockLeaseMs: 2000,
  maxLagOnFailover: 1000,
  quorum: "majority",
  cooldownMs: 60_000,
});
export const TIMEOUTS: Partial<PhaseTimeouts> = {
  confirm: 3000,
  promote: 5000,
  repoint: 5000,
  cleanup: 5000,
};

export interface NodeScript {
  id: string;
  role: "primary" | "replica";
  alive: boolean;
  txn: number;
  repl_id: string;
  primary?: string;
  primary_link?: "up" | "down";
  epoch: number;
  priority: number;
  applied: Set<string>;
  received: Command[];
  /** When false the node ignores its queue (a node whose agent never applies commands). */
  responsive: boolean;
  /** Primary: writes paused by PAUSE_WRITES. */
  writesPaused: boolean;
  /** Replica: never catches up with its primary. */
  frozen: boolean;
}

export class ScriptedShard {
  readonly shard = uniqueName("s").slice(0, 24);
  readonly nodes = new Map<string, NodeScript>();
  /** Every command applied, in order, as "<node>:<type>". */
  readonly applied: string[] = [];
  readonly aws: AwsAdapters;
  readonly #abort = new AbortController();
  readonly #loops: Promise<void>[] = [];

  constructor() {
    this.aws = createAwsAdapters({
      env: { ...awsEnv() },
      queuePrefix: `t${Math.random().toString(36).slice(2, 8)}`,
      logger: silentLogger,
    });
  }

  node(id: string, fields: Partial<NodeScript> = {}): NodeScript {
    const node: NodeScript = {
      id,
      role: "replica",
      alive: true,
      txn: 1000,
      repl_id: "lineage-a",
      primary: "p1",
      primary_link: "up",
      epoch: 1,
      priority: 100,
      applied: new Set(),
      received: [],
      responsive: true,
      writesPaused: false,
      frozen: false,
      ...fields,
    };
    this.nodes.set(id, node);
    return node;
  }

  get(id: string): NodeScript {
    const node = this.nodes.get(id);
    if (!node) throw new Error(`no scripted node ${id}`);
    return node;
  }

  /** Creates queues, topology (epoch 1, primary p1) and the shard index entry; starts the nodes. */
  async start(primary = "p1"): Promise<void> {
    const { store, bus, clock } = this.aws;
    await Promise.all([...this.nodes.keys()].map((id) => bus.ensureQueue(this.shard, id)));
    const topology: Topology = {
      shard: this.shard,
      epoch: 1,
      primary_node_id: primary,
      primary_address: this.#address(primary),
      status: "online",
      updated_at: clock.now(),
    };
    await store.topology.compareAndSet(this.shard, undefined, topology);
    await store.shards.register(this.shard);
    await this.beat();
    this.#loops.push(this.#heartbeatLoop());
    for (const id of this.nodes.keys()) this.#loops.push(this.#commandLoop(id));
  }

  /** The primary's database dies: no more heartbeats; its replicas see the link down. */
  kill(id: string): void {
    this.get(id).alive = false;
    for (const node of this.nodes.values()) if (node.primary === id) node.primary_link = "down";
  }

  async beat(): Promise<void> {
    const now = this.aws.clock.now();
    for (const node of this.nodes.values()) {
      const primary = node.primary ? this.nodes.get(node.primary) : undefined;
      if (node.role === "replica" && !node.frozen && primary?.writesPaused && node.primary_link === "up") {
        node.txn = primary.txn;
      }
    }
    await Promise.all(
      [...this.nodes.values()]
        .filter((node) => node.alive)
        .map((node) => this.aws.store.heartbeats.put(this.#heartbeat(node, now))),
    );
  }

  #heartbeat(node: NodeScript, now: number): HeartbeatInput {
    return {
      shard: this.shard,
      node_id: node.id,
      node_address: this.#address(node.id),
      role: node.role,
      last_updated: now * 1000,
      last_txn_id: node.txn,
      repl_id: node.repl_id,
      primary_node_id: node.role === "replica" ? node.primary : undefined,
      primary_link: node.role === "replica" ? node.primary_link : undefined,
      epoch: node.epoch,
      priority: node.priority,
    };
  }

  async #heartbeatLoop(): Promise<void> {
    while (!this.#abort.signal.aborted) {
      await this.beat().catch(() => {});
      await delay(CONFIG.heartbeatIntervalMs).catch(() => {});
    }
  }

  /** What the agent does with a command, minus redis: screen, apply, reflect in the heartbeat. */
  async #commandLoop(id: string): Promise<void> {
    const node = this.get(id);
    while (!this.#abort.signal.aborted) {
      if (!node.alive || !node.responsive) {
        await delay(100);
        continue;
      }
      const messages = await this.aws.bus
        .receive(this.shard, id, { waitSeconds: 1, signal: this.#abort.signal })
        .catch(() => []);
      for (const message of messages) {
        // As the agent: a rejected message stays for the dead-letter queue, a failed read for redelivery.
        const screening = await this.#screen(node, message).catch(() => undefined);
        if (screening === undefined || screening.action === "reject") continue;
        if (screening.action === "apply") this.#apply(node, screening.command);
        await this.aws.bus.delete(this.shard, id, message).catch(() => {});
      }
    }
  }

  /** The agent's screening, with the topology read the way the agent reads it. */
  async #screen(node: NodeScript, message: ReceivedCommand): Promise<Screening> {
    const topology = message.command ? await this.aws.store.topology.read(this.shard) : undefined;
    if (message.command) node.received.push(message.command);
    return screenCommand(message, {
      shard: this.shard,
      nodeId: node.id,
      address: this.#address(node.id),
      highestEpoch: node.epoch,
      hasApplied: (commandId) => node.applied.has(commandId),
      topology,
      now: this.aws.clock.now(),
    });
  }

  #apply(node: NodeScript, command: Command): void {
    this.applied.push(`${node.id}:${command.type}`);
    node.applied.add(command.command_id);
    node.epoch = command.epoch;
    if (command.type === "PAUSE_WRITES") {
      node.writesPaused = true;
    } else if (command.type === "PROMOTE") {
      node.role = "primary";
      // Redis starts a new replication id on promotion.
      node.repl_id = `lineage-${node.id}-${command.epoch}`;
      node.primary = undefined;
    } else if (command.type === "REPLICAOF" && command.primary) {
      node.role = "replica";
      node.writesPaused = false;
      node.primary = command.primary.node_id;
      node.primary_link = "up";
      node.repl_id = this.nodes.get(command.primary.node_id)?.repl_id ?? node.repl_id;
    }
  }

  #address(id: string): string {
    return `${id}.local:6379`;
  }

  /** Waits until the controller would judge the node's stored heartbeat stale (the product's `isFresh`). */
  async waitUntilStale(id: string): Promise<void> {
    await waitFor(
      async () => {
        const heartbeat = (await this.aws.store.heartbeats.snapshot(this.shard)).nodes.find(
          (node) => node.node_id === id,
        );
        return heartbeat !== undefined && !isFresh(heartbeat, CONFIG, this.aws.clock.now());
      },
      `${id}'s heartbeat stale`,
      5 * CONFIG.failureTimeoutMs,
    );
  }

  async stop(): Promise<void> {
    this.#abort.abort();
    await Promise.allSettled(this.#loops);
    this.aws.destroy();
  }
}

const shards: ScriptedShard[] = [];
afterEach(async () => {
  await Promise.all(shards.splice(0).map((shard) => shard.stop()));
});

export function aScriptedShard(): ScriptedShard {
  const shard = new ScriptedShard();
  shards.push(shard);
  return shard;
}

export function controller(shard: ScriptedShard, overrides: Partial<ControllerDeps> = {}) {
  const events = new MemoryEventPublisher();
  const metrics = new MemoryMetrics();
  const deps: ControllerDeps = {
    store: shard.aws.store,
    bus: shard.aws.bus,
    clock: shard.aws.clock,
    config: CONFIG,
    timeouts: TIMEOUTS,
    log: silentLogger,
    events,
    metrics,
    ...overrides,
  };
  return { deps, events, metrics };
}
