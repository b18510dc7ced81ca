import { ENV } from "../../src/adapters/env.ts";
import { discardMetrics, silentLogger } from "../../src/adapters/observability.ts";
import type { CycleResult } from "../../src/controller/deps.ts";
import { requestSwitchover } from "../../src/controller/requests.ts";
import { type ControllerRuntime, createControllerRuntime } from "../../src/controller/runtime.ts";
import { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { HaproxyBackend } from "../../src/dev/local-stack/haproxy.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { waitForReplicasInSync } from "../../src/dev/workload/replication.ts";
import type { SentinelClientTarget } from "../lib/sentinel-client-workload.ts";
import type { FailoverSystem, Fault, KillResult, SystemConfig } from "./types.ts";

/** Shardguard's timings besides the shared failure timeout. */
export interface ShardguardTimings {
  readonly heartbeatIntervalMs: number;
  readonly tickIntervalMs: number;
  readonly fenceTimeoutMs: number;
}

/**
 * The timings the benchmark runs Shardguard with at a given failure timeout: the shipped 1 s : 3 s
 * heartbeat-to-timeout ratio, a controller tick of half a heartbeat (at most 1 s) and the shipped
 * fence timeout: half a heartbeat below the failure timeout (so the agents' default keepalives:
 * the primary every 2 heartbeats, a quiet replica every 20).
 */
export function shardguardTimings(failureTimeoutMs: number): ShardguardTimings {
  const heartbeatIntervalMs = Math.round(failureTimeoutMs / 3);
  return {
    heartbeatIntervalMs,
    tickIntervalMs: Math.min(1000, Math.round(heartbeatIntervalMs / 2)),
    // The shipped defaults at 3 s: 2.5 s, half a heartbeat above the primary's 2 s keepalive.
    fenceTimeoutMs: Math.round(failureTimeoutMs - heartbeatIntervalMs / 2),
  };
}

/**
 * Shardguard as it runs in production, on this machine: one `shardguard agent` process beside each
 * redis-server, a `shardguard controller` process (the Lambda's loop), DynamoDB Local and fauxqs.
 * Clients find the primary in the topology item, as the primary resolver does. Cool-down is off so
 * back-to-back trials can fail over; everything else is the shipped behaviour (quorum majority).
 */
export class ShardguardSystem implements FailoverSystem {
  readonly name = "shardguard";
  readonly #timings: ShardguardTimings;
  #cluster: LocalCluster | undefined;
  #killed: { node: RedisNode; wallMs: number; epoch: number; fault: Fault } | undefined;
  /** The last kill, kept after resetTrial: the driver asks for phase timings after the reset. */
  #lastKill: { wallMs: number; epoch: number } | undefined;
  #log: (line: string) => void = () => {};
  /** The in-process controller a `switchover` trial asks, and the request under way. */
  #runtime: ControllerRuntime | undefined;
  #switchover: Promise<CycleResult> | undefined;
  /** node id -> the port its agent serves the Sentinel protocol on (setup with sentinelEndpoints). */
  #sentinelPorts = new Map<string, number>();
  /** node id -> the port of its agent's HTTP role checks (setup with httpEndpoints). */
  #httpPorts = new Map<string, number>();

  constructor(timings: ShardguardTimings) {
    this.#timings = timings;
  }

  async setup(config: SystemConfig): Promise<void> {
    this.#log = config.log;
    const timings = { ...this.#timings, failureTimeoutMs: config.failureTimeoutMs };
    this.#log(
      `shardguard: starting a ${config.nodeCount}-node shard, agents and a controller (${JSON.stringify(timings)})`,
    );
    this.#sentinelPorts.clear();
    if (config.sentinelEndpoints) {
      // LocalCluster names its nodes node-1..node-N; each agent keeps its port across restarts.
      for (let index = 1; index <= config.nodeCount; index++) {
        this.#sentinelPorts.set(`node-${index}`, await freePort());
      }
      this.#log(
        `shardguard: agents serve the Sentinel protocol on ${[...this.#sentinelPorts.values()].join(", ")}`,
      );
    }
    this.#httpPorts.clear();
    if (config.httpEndpoints) {
      for (let index = 1; index <= config.nodeCount; index++) {
        this.#httpPorts.set(`node-${index}`, await freePort());
      }
    }
    const sentinelPorts = this.#sentinelPorts;
    const httpPorts = this.#httpPorts;
    this.#cluster = await LocalCluster.start({
      nodes: config.nodeCount,
      config: { ...timings, cooldownMs: 0 },
      agentEnv: (id) => {
        const sentinel = sentinelPorts.get(id);
        const http = httpPorts.get(id);
        return {
          ...(sentinel === undefined ? {} : { [ENV.sentinelPort]: String(sentinel) }),
          ...(http === undefined ? {} : { [ENV.httpPort]: String(http) }),
        };
      },
      onProgress: (line) => this.#log(`shardguard: ${line}`),
    });
  }

  #require(): LocalCluster {
    if (!this.#cluster) throw new Error("shardguard system is not set up");
    return this.#cluster;
  }

  primaryAddress(): Promise<string | undefined> {
    return this.#require().primaryAddress();
  }

  nodes(): readonly RedisNode[] {
    return this.#cluster?.redis ?? [];
  }

  sentinelClient(): SentinelClientTarget {
    if (this.#sentinelPorts.size === 0) throw new Error("shardguard was set up without Sentinel endpoints");
    return {
      sentinels: [...this.#sentinelPorts.values()].map((port) => ({ host: "127.0.0.1", port })),
      name: this.#require().shard,
    };
  }

  haproxyBackends(): HaproxyBackend[] {
    if (this.#httpPorts.size === 0) throw new Error("shardguard was set up without HTTP endpoints");
    return this.#require().redis.map((node) => ({
      id: node.id,
      redis: node.address,
      http: `127.0.0.1:${this.#httpPorts.get(node.id)}`,
    }));
  }

  async killPrimary(fault: Fault): Promise<KillResult> {
    const cluster = this.#require();
    const topology = await cluster.topology();
    const node = cluster.redis.find((candidate) => candidate.id === topology?.primary_node_id);
    if (!node?.running || topology?.status !== "online") {
      throw new Error(`shard not ready to kill: ${JSON.stringify(topology)}`);
    }
    const wallMs = Date.now();
    const killedAt = performance.now();
    if (fault === "switchover") {
      // The operator's request as the CLI runs it in-process (the same orchestrator as the Lambda).
      this.#runtime ??= createControllerRuntime(cluster.env, { log: silentLogger, metrics: discardMetrics });
      this.#switchover = requestSwitchover(this.#runtime.deps, cluster.shard, { reason: "bench" });
      this.#killed = { node, wallMs, epoch: topology.epoch, fault };
      this.#lastKill = { wallMs, epoch: topology.epoch };
      return { killedAt, oldPrimary: node.address };
    }
    node.signal(fault === "hang" ? "SIGSTOP" : "SIGKILL");
    if (fault === "host") cluster.signalAgent(node.id, "SIGKILL");
    this.#killed = { node, wallMs, epoch: topology.epoch, fault };
    this.#lastKill = { wallMs, epoch: topology.epoch };
    return { killedAt, oldPrimary: node.address };
  }

  /**
   * detection: kill -> the controller took the lock (the failover's start); then the orchestrator's
   * own phase durations from the history record: lock (locked + epoch CAS), promote, confirm,
   * repoint (REPLICAOF to the others + cleanup of the old primary's records).
   */
  async phaseTimings(_kill: KillResult): Promise<Record<string, number> | undefined> {
    const killed = this.#lastKill;
    if (!killed) return undefined;
    const cluster = this.#require();
    const record = (await cluster.aws.store.history.list(cluster.shard, 1))[0];
    if (!record || record.epoch <= killed.epoch) return undefined;
    const phases = record.phase_timings;
    const total = Object.values(phases).reduce((sum, ms) => sum + ms, 0);
    const startedAt = record.at - total;
    return {
      detection: Math.max(0, startedAt - killed.wallMs),
      lock: (phases.locked ?? 0) + (phases.epoch_bumped ?? 0),
      promote: phases.promote ?? 0,
      confirm: phases.confirm ?? 0,
      repoint: (phases.repoint ?? 0) + (phases.cleanup ?? 0),
    };
  }

  async resetTrial(): Promise<void> {
    const killed = this.#killed;
    if (!killed) return;
    const cluster = this.#require();
    await cluster.waitFor(
      "a new primary",
      async () => {
        const topology = await cluster.topology();
        return topology?.status === "online" && topology.epoch > killed.epoch;
      },
      60_000,
    );
    const topology = await cluster.topology();
    if (killed.fault === "switchover") {
      const result = await this.#switchover;
      this.#switchover = undefined;
      if (result?.outcome !== "completed")
        throw new Error(`switchover ${result?.outcome}: ${result?.reason}`);
    } else {
      this.#log(
        `shardguard: restarting ${killed.node.id}; its agent makes it a replica of ${topology?.primary_node_id}`,
      );
      // A hung node is killed first (stop() sends SIGCONT only to a process still alive).
      killed.node.signal("SIGKILL");
      await killed.node.stop();
      await killed.node.start();
    }
    if (killed.fault === "host") {
      await cluster.stopAgent(killed.node.id);
      cluster.startAgent(killed.node.id);
    }
    this.#killed = undefined;
    await cluster.waitFor(
      "every node following the new primary",
      async () => {
        const snapshot = await cluster.snapshot();
        const primary = snapshot.topology?.primary_node_id;
        return (
          snapshot.nodes.length === cluster.redis.length &&
          snapshot.nodes.every(
            (node) =>
              node.db_status === "up" &&
              (node.node_id === primary ||
                (node.role === "replica" && node.primary_node_id === primary && node.primary_link === "up")),
          )
        );
      },
      60_000,
    );
    const primaryNode = cluster.redis.find((node) => node.id === topology?.primary_node_id);
    if (!primaryNode) return;
    const primaryClient = primaryNode.client({ maxRetriesPerRequest: 1 });
    const replicaClients = cluster.redis
      .filter((node) => node !== primaryNode)
      .map((node) => node.client({ maxRetriesPerRequest: 1 }));
    try {
      await waitForReplicasInSync(primaryClient, primaryNode.address, replicaClients, { timeoutMs: 15_000 });
    } finally {
      primaryClient.disconnect();
      for (const client of replicaClients) client.disconnect();
    }
  }

  async teardown(): Promise<void> {
    this.#runtime?.destroy();
    this.#runtime = undefined;
    await this.#cluster?.stop();
    this.#cluster = undefined;
  }
}
