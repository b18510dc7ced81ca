import { silentLogger } from "../../src/adapters/observability.ts";
import type { ControllerDeps } from "../../src/controller/deps.ts";
import type { FailoverConfig } from "../../src/core/config.ts";
import {
  type Command,
  type HistoryRecord,
  heartbeatSchema,
  type Lock,
  type Topology,
} from "../../src/core/model.ts";
import {
  type CommandBus,
  type CoordinationStore,
  type LockLease,
  LockLost,
  type ShardSnapshot,
  type WriteFence,
} from "../../src/core/ports.ts";
import { aConfig, LINEAGE } from "./builders.ts";
import { MemoryEventPublisher, MemoryMetrics } from "./controller-fakes.ts";

/**
 * One shard in memory for controller unit tests: the coordination store (lock with owner and
 * fence, fenced compare-and-set of the topology, history, node deletion) and a command bus whose
 * nodes obey at once, as agents would: PAUSE_WRITES makes the old primary's offset final and the
 * replicas catch up, PROMOTE makes a primary, REPLICAOF a replica. Time is `Date.now()`, so a test
 * drives it with fake timers. Primary p1, replicas r1 and r2, at epoch 3, all fresh.
 */

interface NodeState {
  role: "primary" | "replica";
  primary: string | undefined;
  txn: number;
  epoch: number;
  /** Its replication id, when the shard tracks lineages (\`trackLineages\`). */
  replId?: string;
  /** The lineage it continues (Redis \`master_replid2\`), after a promotion. */
  prior?: { repl_id: string; last_txn_id: number };
}

export class MemoryShard {
  readonly shard = "s1";
  readonly config: FailoverConfig;
  readonly nodes = new Map<string, NodeState>([
    ["p1", { role: "primary", primary: undefined, txn: 1000, epoch: 3 }],
    ["r1", { role: "replica", primary: "p1", txn: 990, epoch: 3 }],
    ["r2", { role: "replica", primary: "p1", txn: 980, epoch: 3 }],
  ]);
  topology: Topology | undefined;
  lock: (Lock & { fence: number }) | undefined;
  /** Every lease asked for, in order. */
  readonly leases: Array<{ op: "acquire" | "renew"; leaseMs: number }> = [];
  readonly history: HistoryRecord[] = [];
  /** Every command sent, with the node it was sent to. */
  readonly sent: Array<{ node: string; command: Command }> = [];
  /** Version of p1's stored replica set (an agent's add or remove moves it). */
  replicaSetVersion = 1;
  /** Called before each topology write is checked: a test moves the world between read and write. */
  beforeTopologyWrite: (() => void) | undefined;
  /** Rewrites what a snapshot read returns (a heartbeat late for one read, say). */
  onSnapshot: ((snapshot: ShardSnapshot) => ShardSnapshot) | undefined;
  /**
   * A promotion gives the node a new replication id, the old one kept as its \`prior_lineage\`, as
   * Redis does (REPLICAOF NO ONE); off by default: every node stays on LINEAGE.
   */
  trackLineages = false;
  /** Offset ms added to `Date.now()` (tests without fake timers move time by hand). */
  #skew = 0;

  constructor(config: FailoverConfig = aConfig()) {
    this.config = config;
    this.topology = {
      shard: this.shard,
      epoch: 3,
      primary_node_id: "p1",
      primary_address: "p1.local:6379",
      status: "online",
      updated_at: this.now() - 60_000,
    };
  }

  now(): number {
    return Date.now() + this.#skew;
  }

  advance(ms: number): void {
    this.#skew += ms;
  }

  deps(overrides: Partial<ControllerDeps> = {}): ControllerDeps {
    return {
      store: this.store(),
      bus: this.bus(),
      events: new MemoryEventPublisher(),
      clock: { now: () => this.now() },
      config: this.config,
      log: silentLogger,
      metrics: new MemoryMetrics(),
      sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
      ...overrides,
    };
  }

  snapshot(): ShardSnapshot {
    const nodes = [...this.nodes].map(([id, node]) =>
      heartbeatSchema.parse({
        shard: this.shard,
        node_id: id,
        node_address: `${id}.local:6379`,
        role: node.role,
        last_updated: this.now() * 1000,
        last_txn_id: node.txn,
        repl_id: node.replId ?? LINEAGE,
        ...(node.prior === undefined ? {} : { prior_lineage: node.prior }),
        primary_node_id: node.primary,
        primary_link: node.primary ? "up" : undefined,
        epoch: node.epoch,
      }),
    );
    const replicas = [...this.nodes].filter(([, node]) => node.primary === "p1").map(([id]) => id);
    return {
      shard: this.shard,
      nodes,
      replicaSets: { p1: replicas },
      replicaSetVersions: { p1: this.replicaSetVersion },
      topology: this.topology,
      lock: this.lock,
      malformed: [],
    };
  }

  #requireLease(fence: WriteFence | undefined): void {
    const lock = this.lock;
    if (
      fence &&
      !(lock && lock.owner === fence.lease.owner && lock.fence === fence.lease.fence && lock.expires_at > 0)
    ) {
      throw new LockLost(
        `the lock of shard ${this.shard} is no longer held by ${fence.lease.owner}; nothing written`,
      );
    }
  }

  store(): CoordinationStore {
    const unused = () => Promise.reject(new Error("not used by the controller"));
    return {
      heartbeats: {
        put: unused,
        snapshot: async () => (this.onSnapshot ?? ((read: ShardSnapshot) => read))(this.snapshot()),
        deleteNode: async (_shard, nodeId, fence) => {
          this.#requireLease(fence);
          this.nodes.delete(nodeId);
        },
      },
      replicaSets: { add: unused, remove: unused, removeWhilePrimary: unused },
      locks: {
        acquire: async (shard, owner, leaseMs, forPrimary): Promise<LockLease | false> => {
          this.leases.push({ op: "acquire", leaseMs });
          const held = this.lock;
          if (held && held.expires_at >= this.now() && held.owner !== owner) return false;
          const fence = (held?.fence ?? 0) + 1;
          this.lock = { owner, expires_at: this.now() + leaseMs, for_primary: forPrimary, fence };
          return { shard, owner, fence };
        },
        renew: async (_shard, owner, leaseMs) => {
          this.leases.push({ op: "renew", leaseMs });
          const held = this.lock;
          if (!held || held.owner !== owner || held.expires_at < this.now()) return false;
          this.lock = { ...held, expires_at: this.now() + leaseMs };
          return true;
        },
        release: async (_shard, owner) => {
          if (this.lock?.owner !== owner) return false;
          this.lock = { ...this.lock, expires_at: 0 };
          return true;
        },
      },
      topology: {
        read: async () => this.topology,
        compareAndSet: async (_shard, expectedEpoch, next, fence) => {
          this.beforeTopologyWrite?.();
          this.#requireLease(fence);
          if (this.topology?.epoch !== expectedEpoch) return false;
          if (fence?.replicaSet && fence.replicaSet.primary === "p1") {
            if (fence.replicaSet.version !== this.replicaSetVersion) return false;
          }
          this.topology = next;
          return true;
        },
        // The memory shard has one layout only: nothing is ever left to move.
        migrateLegacy: async () => "current",
      },
      history: {
        append: async (record, fence) => {
          this.#requireLease(fence);
          if (!this.history.some((existing) => existing.epoch === record.epoch)) this.history.push(record);
        },
        list: async () => [...this.history].reverse(),
      },
      shards: { register: unused, list: async () => ({ shards: [this.shard] }) },
    };
  }

  bus(): CommandBus {
    const unused = () => Promise.reject(new Error("not used by the controller"));
    return {
      ensureQueue: unused,
      send: async (_shard, node, command) => {
        this.sent.push({ node, command });
        this.#obey(node, command);
      },
      receive: unused,
      delete: unused,
      redeliverAfter: unused,
    };
  }

  #obey(id: string, command: Command): void {
    const node = this.nodes.get(id);
    if (!node) return;
    node.epoch = Math.max(node.epoch, command.epoch);
    if (command.type === "PAUSE_WRITES") {
      for (const other of this.nodes.values()) if (other.primary === id) other.txn = node.txn;
    } else if (command.type === "PROMOTE") {
      if (this.trackLineages && node.role !== "primary") {
        node.prior = { repl_id: node.replId ?? LINEAGE, last_txn_id: node.txn };
        node.replId = `${LINEAGE}-e${command.epoch}`;
      }
      node.role = "primary";
      node.primary = undefined;
    } else {
      node.role = "replica";
      node.primary = command.primary?.node_id;
    }
  }
}
