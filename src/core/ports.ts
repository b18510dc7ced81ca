import { ShardguardError } from "./errors.ts";
import type { Command, Heartbeat, HeartbeatInput, HistoryRecord, Lock, Topology } from "./model.ts";

/**
 * Ports: what the core needs from the outside world. Adapters (DynamoDB, SQS) implement them;
 * only entry points wire adapters to the core.
 *
 * Contract for every store method: a lost race returns `false`; an unreachable or failing store
 * throws `CoordinationUnavailable`. The two are never confused.
 */

/** Milliseconds since 1970 on a clock aligned with AWS (see adapters/clock.ts). */
export interface Clock {
  now(): number;
}

/** A heartbeat, replica set or record that failed its schema, reported instead of crashing the reader. */
export interface MalformedItem {
  readonly sk: string;
  readonly field: string;
  readonly reason: string;
}

/**
 * One shard's whole state: strongly consistent queries issued together (the shard's membership, the
 * controller's partition, each member node's own partition). Immutable for a cycle.
 */
export interface ShardSnapshot {
  readonly shard: string;
  readonly nodes: readonly Heartbeat[];
  /** primary node id -> node ids of its replicas that completed a full sync. */
  readonly replicaSets: Readonly<Record<string, readonly string[]>>;
  /**
   * primary node id -> version of its replica set, bumped by every change. A failover that chose
   * its target from the set conditions its epoch bump on this version (the set is the write
   * guard's membership, docs/agent.md#the-replica-set-guard).
   */
  readonly replicaSetVersions: Readonly<Record<string, number>>;
  readonly topology: Topology | undefined;
  readonly lock: Lock | undefined;
  readonly malformed: readonly MalformedItem[];
  /**
   * Part of the snapshot was read where an older installation kept it, where any node's credentials
   * can write: the topology in the shard partition (before `keys.controlPk`), or heartbeats and
   * replica sets there (before `keys.nodePk`). Agents follow it; the controller takes no automatic
   * action until `shardguard migrate-layout` moves them (docs/deploy.md#upgrading).
   */
  readonly legacyTopology?: boolean;
}

/**
 * What a controller holds while it holds a shard's lock: its owner token (unique per
 * acquisition) and the lock's `fence`, a number the store raises by one on every acquisition.
 */
export interface LockLease {
  readonly shard: string;
  readonly owner: string;
  readonly fence: number;
}

/**
 * The conditions a controller's write carries in the same request as the write itself (one
 * TransactWriteItems): the lock is still held with this lease, and optionally the replica set of
 * `replicaSet.primary` is still at the version the decision read (`undefined`: no version yet).
 */
export interface WriteFence {
  readonly lease: LockLease;
  readonly replicaSet?: { readonly primary: string; readonly version: number | undefined };
}

/**
 * A fenced write found the lock no longer held with its lease (taken over after the lease
 * expired, or released): the writer is stale and must stop. Nothing was written.
 */
export class LockLost extends ShardguardError {
  override name = "LockLost";
}

export interface HeartbeatStore {
  put(heartbeat: HeartbeatInput): Promise<void>;
  snapshot(shard: string): Promise<ShardSnapshot>;
  /** Deletes the node's heartbeat and its replica set; with `fence`, only while the lock is held (else LockLost). */
  deleteNode(shard: string, nodeId: string, fence?: WriteFence): Promise<void>;
}

export interface ReplicaSetStore {
  add(shard: string, primaryId: string, nodeIds: readonly string[]): Promise<void>;
  remove(shard: string, primaryId: string, nodeIds: readonly string[]): Promise<void>;
  /**
   * Removes members from the primary's replica set only while the topology still names it
   * primary at `epoch` and no failover is under way (`epoch` undefined: while there is no
   * topology yet), in one transaction; false otherwise. The primary lowers its write guard only
   * after this succeeded.
   */
  removeWhilePrimary(
    shard: string,
    primaryId: string,
    nodeIds: readonly string[],
    epoch: number | undefined,
  ): Promise<boolean>;
}

export interface LockStore {
  /**
   * Conditional on the lock being absent, expired or already `owner`'s; raises the lock's
   * `fence` by one and returns the lease, or false when another owner holds it.
   */
  acquire(shard: string, owner: string, leaseMs: number, forPrimary?: string): Promise<LockLease | false>;
  /** Extends the lease; false when `owner` no longer holds it. */
  renew(shard: string, owner: string, leaseMs: number): Promise<boolean>;
  /** Deletes the lock; false (and the lock untouched) when `owner` does not hold it. */
  release(shard: string, owner: string): Promise<boolean>;
}

export interface TopologyStore {
  read(shard: string): Promise<Topology | undefined>;
  /**
   * Writes `next` only if the stored epoch equals `expectedEpoch` (`undefined`: no topology
   * yet). Used both to bump the epoch and to record phases within an epoch. With `fence`, the
   * write also requires the lock held with that lease (else LockLost, nothing written) and the
   * replica set at the given version (else false), in the same request.
   */
  compareAndSet(
    shard: string,
    expectedEpoch: number | undefined,
    next: Topology,
    fence?: WriteFence,
  ): Promise<boolean>;
  /**
   * Moves what an older installation kept in the shard partition (ShardSnapshot.legacyTopology) to
   * the current layout: the topology to the controller's partition, heartbeats and replica sets to
   * their nodes' own partitions, then marks the shard migrated: `moved`, `current` (nothing to move),
   * or `conflict` (something changed while being moved; run again).
   */
  migrateLegacy(shard: string): Promise<"moved" | "current" | "conflict">;
}

export interface HistoryStore {
  /**
   * One record per epoch; a second append for the same epoch is a no-op (idempotent resume).
   * With `fence`, only while the lock is held with that lease (else LockLost, nothing written).
   */
  append(record: HistoryRecord, fence?: WriteFence): Promise<void>;
  /** Newest first. */
  list(shard: string, limit?: number): Promise<HistoryRecord[]>;
}

export interface ShardIndex {
  /** Registers the caller's own shard (IAM lets an agent register no other, docs/security.md). */
  register(shard: string): Promise<void>;
  /** One page of shard ids, with the token for the next page. An id may appear on two pages. */
  list(pageToken?: string, pageSize?: number): Promise<{ shards: string[]; nextPageToken?: string }>;
}

/** Every store port over the one coordination table, as the adapters' factory returns them. */
export interface CoordinationStore {
  readonly heartbeats: HeartbeatStore;
  readonly replicaSets: ReplicaSetStore;
  readonly locks: LockStore;
  readonly topology: TopologyStore;
  readonly history: HistoryStore;
  readonly shards: ShardIndex;
}

export interface ReceivedCommand {
  /** The parsed command, or undefined with `error` when the body failed validation. */
  readonly command: Command | undefined;
  readonly error: string | undefined;
  readonly receiptHandle: string;
  readonly receiveCount: number;
  readonly body: string;
}

/** Who may use a node's command queue, beyond the account's IAM (the queue's policy). */
export interface QueueAccess {
  /**
   * ARNs of the principals (roles) allowed to send commands: the controller's, the operators'.
   * Empty or absent: any principal whose IAM grants sqs:SendMessage may (every request still needs TLS).
   */
  readonly senders?: readonly string[];
}

export interface CommandBus {
  /**
   * Creates the node's queue and its dead-letter queue if missing, each with its policy (TLS only;
   * `access.senders` alone may send to the node's queue), or brings an existing one's policy up to
   * date; returns the queue URL.
   */
  ensureQueue(shard: string, nodeId: string, access?: QueueAccess): Promise<string>;
  send(shard: string, nodeId: string, command: Command): Promise<void>;
  /** Long poll (WaitTimeSeconds 20 by default); resolves with [] promptly when `signal` aborts. */
  receive(
    shard: string,
    nodeId: string,
    options?: { signal?: AbortSignal; waitSeconds?: number; maxMessages?: number },
  ): Promise<ReceivedCommand[]>;
  delete(shard: string, nodeId: string, message: ReceivedCommand): Promise<void>;
  /**
   * Sets when a received command becomes visible (receivable) again: `seconds` from now, counted
   * afresh, not added to what is left of its visibility timeout; 0 = now (releases it at once).
   * Used to hold back a command retried after a delay, and to hand back one not started.
   */
  redeliverAfter(shard: string, nodeId: string, message: ReceivedCommand, seconds: number): Promise<void>;
}
