import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { MemoryEventPublisher, MemoryMetrics, silentLog } from "../../src/controller/observability.ts";
import {
  type ControllerDeps,
  type CycleResult,
  type PhaseTimeouts,
  runShardCycle,
} from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Command, HeartbeatInput, Topology } from "../../src/core/model.ts";
import { awsEnv, uniqueName } from "../support/aws.ts";

/**
 * The orchestrator on the local stack (DynamoDB Local + fauxqs) with scripted nodes instead of
 * redis: each node writes its heartbeat on a timer while "alive" and reacts to PROMOTE and
 * REPLICAOF from its queue the way an agent does (epoch and command-id screening, role and
 * epoch reflected in the next heartbeat).
 */

const CONFIG = parseFailoverConfig({
  heartbeatIntervalMs: 150,
  failureTimeoutMs: 600,
  fenceTimeoutMs: 400,
  tickIntervalMs: 150,
  lockLeaseMs: 2000,
  maxLagOnFailover: 1000,
  quorum: "majority",
  cooldownMs: 60_000,
});
const TIMEOUTS: Partial<PhaseTimeouts> = { confirm: 3000, promote: 5000, repoint: 5000, cleanup: 5000 };

interface NodeScript {
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
}

class ScriptedShard {
  readonly shard = uniqueName("s").slice(0, 24);
  readonly nodes = new Map<string, NodeScript>();
  readonly aws: AwsAdapters;
  readonly #abort = new AbortController();
  readonly #loops: Promise<void>[] = [];

  constructor() {
    this.aws = createAwsAdapters({
      env: { ...awsEnv() },
      queuePrefix: `t${Math.random().toString(36).slice(2, 8)}`,
      logger: { warn: () => {} },
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
      primary_address: `${primary}.local:6379`,
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
      node_address: `${node.id}.local:6379`,
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
        const command = message.command;
        if (command) this.#apply(node, command);
        await this.aws.bus.delete(this.shard, id, message).catch(() => {});
      }
    }
  }

  #apply(node: NodeScript, command: Command): void {
    node.received.push(command);
    if (command.epoch < node.epoch || node.applied.has(command.command_id)) return;
    node.applied.add(command.command_id);
    node.epoch = command.epoch;
    if (command.type === "PROMOTE") {
      node.role = "primary";
      // Redis starts a new replication id on promotion.
      node.repl_id = `lineage-${node.id}-${command.epoch}`;
      node.primary = undefined;
    } else if (command.type === "REPLICAOF" && command.primary) {
      node.role = "replica";
      node.primary = command.primary.node_id;
      node.primary_link = "up";
      node.repl_id = this.nodes.get(command.primary.node_id)?.repl_id ?? node.repl_id;
    }
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

function aScriptedShard(): ScriptedShard {
  const shard = new ScriptedShard();
  shards.push(shard);
  return shard;
}

function controller(shard: ScriptedShard, overrides: Partial<ControllerDeps> = {}) {
  const events = new MemoryEventPublisher();
  const metrics = new MemoryMetrics();
  const deps: ControllerDeps = {
    store: shard.aws.store,
    bus: shard.aws.bus,
    clock: shard.aws.clock,
    config: CONFIG,
    timeouts: TIMEOUTS,
    log: silentLog,
    events,
    metrics,
    ...overrides,
  };
  return { deps, events, metrics };
}

/** Runs cycles every tick until `until` accepts a result, or fails after `ms`. */
async function cycleUntil(
  deps: ControllerDeps,
  shard: string,
  until: (result: CycleResult) => boolean,
  ms = 15_000,
): Promise<CycleResult[]> {
  const results: CycleResult[] = [];
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const result = await runShardCycle(deps, shard);
    results.push(result);
    if (until(result)) return results;
    await delay(CONFIG.tickIntervalMs);
  }
  throw new Error(`no matching cycle within ${ms} ms; last: ${JSON.stringify(results.at(-1))}`);
}

describe("orchestrator on the local stack", () => {
  it("fails a dead primary over to the most advanced replica and repoints the others", async () => {
    // Prepare
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980 });
    await shard.start();
    const { deps, events, metrics } = controller(shard);
    expect((await runShardCycle(deps, shard.shard)).outcome).toBe("no_action");

    // Act
    shard.kill("p1");
    const started = Date.now();
    const results = await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");
    const elapsed = Date.now() - started;

    // Assess
    const topology = await shard.aws.store.topology.read(shard.shard);
    expect(topology).toMatchObject({ epoch: 2, primary_node_id: "r1", status: "online" });
    expect(topology?.phase).toBeUndefined();
    expect(topology?.cooldown_until).toBeGreaterThan(shard.aws.clock.now());
    const history = await shard.aws.store.history.list(shard.shard);
    expect(history).toHaveLength(1);
    expect(history[0]).toMatchObject({
      epoch: 2,
      kind: "failover",
      old_primary_node_id: "p1",
      new_primary_node_id: "r1",
    });
    expect(Object.keys(history[0]?.phase_timings ?? {})).toEqual(
      expect.arrayContaining(["locked", "epoch_bumped", "promote", "confirm", "repoint", "cleanup"]),
    );
    await delay(600);
    expect(shard.get("r2")).toMatchObject({ role: "replica", primary: "r1", epoch: 2 });
    const snapshot = await shard.aws.store.heartbeats.snapshot(shard.shard);
    expect(snapshot.nodes.map((node) => node.node_id).sort()).toEqual(["r1", "r2"]);
    expect(events.events.map((event) => event.detailType)).toEqual(["FailoverStarted", "FailoverCompleted"]);
    expect(metrics.get("failoverStarted")).toBe(1);
    expect(metrics.get("failoverCompleted")).toBe(1);
    expect(results.at(-1)?.reason).toMatch(/failover to r1 completed at epoch 2/);
    console.log(`failover: detected and completed ${elapsed} ms after the primary died`);
  });

  it("lets exactly one of five simultaneous controllers fail over, bumping the epoch once", async () => {
    // Prepare
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980 });
    await shard.start();
    shard.kill("p1");
    await delay(CONFIG.failureTimeoutMs + 300);
    const controllers = Array.from({ length: 5 }, () => controller(shard));

    // Act
    const results = await Promise.all(controllers.map(({ deps }) => runShardCycle(deps, shard.shard)));

    // Assess
    expect(results.filter((result) => result.outcome === "completed")).toHaveLength(1);
    expect(results.filter((result) => result.outcome !== "completed").map((r) => r.outcome)).not.toContain(
      "aborted",
    );
    const topology = await shard.aws.store.topology.read(shard.shard);
    expect(topology).toMatchObject({ epoch: 2, primary_node_id: "r1", status: "online" });
    expect(await shard.aws.store.history.list(shard.shard)).toHaveLength(1);
    const started = controllers.flatMap(({ events }) => events.ofType("FailoverStarted"));
    expect(started).toHaveLength(1);
    expect(shard.get("r1").received.filter((command) => command.type === "PROMOTE")).toHaveLength(1);
  });

  it("completes a failover whose controller was killed right after sending PROMOTE, after the lease", async () => {
    // Prepare
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980 });
    await shard.start();
    let killed = false;
    const doomed = controller(shard, {
      onPhase: async (_shard, phase) => {
        if (phase !== "promote") return;
        killed = true;
        // The process is gone: nothing after PROMOTE runs, nothing is released.
        await new Promise(() => {});
      },
    });
    const survivor = controller(shard);
    shard.kill("p1");
    await delay(CONFIG.failureTimeoutMs + 300);

    // Act
    void runShardCycle(doomed.deps, shard.shard);
    while (!killed) await delay(20);
    const stuck = await shard.aws.store.topology.read(shard.shard);
    const killedAt = Date.now();
    const results = await cycleUntil(survivor.deps, shard.shard, (result) => result.outcome === "completed");

    // Assess
    expect(stuck).toMatchObject({ status: "failing_over", phase: "promote", epoch: 2 });
    expect(results[0]?.decision).toMatchObject({ kind: "none", code: "locked" });
    expect(Date.now() - killedAt).toBeGreaterThanOrEqual(CONFIG.lockLeaseMs - 500);
    const topology = await shard.aws.store.topology.read(shard.shard);
    expect(topology).toMatchObject({ epoch: 2, primary_node_id: "r1", status: "online" });
    expect(await shard.aws.store.history.list(shard.shard)).toHaveLength(1);
    // The survivor re-sent nothing new: PROMOTE carries the same id, applied once.
    const promotes = shard.get("r1").received.filter((command) => command.type === "PROMOTE");
    expect(new Set(promotes.map((command) => command.command_id)).size).toBe(1);
    await delay(600);
    expect(shard.get("r2")).toMatchObject({ primary: "r1", epoch: 2 });
  });

  it("takes a shard with no eligible node offline and brings it online when a node returns", async () => {
    // Prepare: r1 may never be promoted, r2 is down.
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 1000, priority: 0 });
    shard.node("r2", { txn: 990, alive: false });
    await shard.start();
    const { deps, events, metrics } = controller(shard);
    shard.kill("p1");

    // Act 1: the primary dies with nobody eligible.
    const offline = await cycleUntil(deps, shard.shard, (result) => result.outcome === "offline");

    // Assess 1
    expect(offline.at(-1)?.reason).toMatch(/no node is eligible/);
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      status: "offline",
      epoch: 2,
      lineage: { repl_id: "lineage-a" },
    });
    const whileOffline = await runShardCycle(deps, shard.shard);
    expect(whileOffline.decision).toMatchObject({ kind: "none", code: "offline_no_candidate" });

    // Act 2: r2 returns with its data.
    shard.get("r2").alive = true;
    const online = await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");

    // Assess 2
    expect(online.at(-1)?.decision).toMatchObject({ kind: "bring_online", target: { node_id: "r2" } });
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      status: "online",
      epoch: 3,
      primary_node_id: "r2",
    });
    const history = await shard.aws.store.history.list(shard.shard);
    expect(history.map((record) => [record.epoch, record.kind])).toEqual([
      [3, "bring_online"],
      [2, "offline"],
    ]);
    expect(events.events.map((event) => event.detailType)).toEqual([
      "ShardOffline",
      "FailoverStarted",
      "FailoverCompleted",
      "ShardOnline",
    ]);
    expect(metrics.get("failoverCompleted")).toBe(1);
  });
});
