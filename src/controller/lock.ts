import { errorMessage } from "../core/errors.ts";
import type { HistoryRecord, Topology } from "../core/model.ts";
import { type LockLease, LockLost, type WriteFence } from "../core/ports.ts";
import { type ControllerDeps, newOwnerOf, PlanStale } from "./deps.ts";

/**
 * The shard's lock, in one place: acquire, renew, release, and every write made under it.
 *
 * The lease alone does not make a controller safe: a controller paused (GC, throttled Lambda,
 * preempted host) longer than its lease still believes it holds the lock when it wakes up. So
 * every write made under the lock carries the lock check in the same request (the store's
 * `WriteFence`: a ConditionCheck on the LOCK item's owner token and fence inside one
 * TransactWriteItems). A write after the lock was taken over writes nothing and throws
 * LockLost, whatever happened between the last renewal and the write.
 */

/** Shortest lease ever asked for, even when the invocation is nearly out of time. */
const MIN_LEASE_MS = 1000;

export class ShardLock {
  readonly deps: ControllerDeps;
  readonly lease: LockLease;
  /** Time left to the invocation (Lambda); the lease is never longer than that. */
  readonly #remainingMs: () => number;
  #lastRenewal: number;

  private constructor(deps: ControllerDeps, lease: LockLease, remainingMs: () => number) {
    this.deps = deps;
    this.lease = lease;
    this.#remainingMs = remainingMs;
    this.#lastRenewal = deps.clock.now();
  }

  /**
   * Takes the shard's lock with a fresh owner token; undefined when another controller holds it.
   * The lease is the configured one, shortened to the invocation's remaining time: a controller
   * cut off by its timeout leaves a lock that expires when it would have stopped anyway.
   */
  static async acquire(
    deps: ControllerDeps,
    shard: string,
    options: { readonly forPrimary?: string; readonly remainingMs?: () => number } = {},
  ): Promise<ShardLock | undefined> {
    const remainingMs = options.remainingMs ?? (() => Number.POSITIVE_INFINITY);
    const lease = await deps.store.locks.acquire(
      shard,
      newOwnerOf(deps),
      leaseFor(deps, remainingMs),
      options.forPrimary,
    );
    return lease ? new ShardLock(deps, lease, remainingMs) : undefined;
  }

  get shard(): string {
    return this.lease.shard;
  }

  get owner(): string {
    return this.lease.owner;
  }

  /** Extends the lease when a third of it has passed (or always, `force`); LockLost when it is gone. */
  async hold(force = false): Promise<void> {
    const now = this.deps.clock.now();
    if (!force && now - this.#lastRenewal < this.deps.config.lockLeaseMs / 3) return;
    const leaseMs = leaseFor(this.deps, this.#remainingMs);
    if (!(await this.deps.store.locks.renew(this.shard, this.owner, leaseMs))) {
      throw new LockLost(`shard ${this.shard}: the lock is no longer held by ${this.owner}`);
    }
    this.#lastRenewal = now;
  }

  /**
   * Writes the topology if the lock is still ours (else LockLost) and the stored epoch is
   * `expectedEpoch`; with `replicaSet`, also only if the old primary's replica set is still at
   * the version the decision read. Either of those failing throws PlanStale.
   */
  async writeTopology(
    expectedEpoch: number,
    next: Topology,
    replicaSet?: WriteFence["replicaSet"],
  ): Promise<void> {
    const fence: WriteFence = replicaSet ? { lease: this.lease, replicaSet } : { lease: this.lease };
    if (!(await this.deps.store.topology.compareAndSet(this.shard, expectedEpoch, next, fence))) {
      throw new PlanStale(
        `shard ${this.shard}: the topology moved from epoch ${expectedEpoch}${replicaSet ? ` or the replica set of ${replicaSet.primary} changed from version ${replicaSet.version ?? "none"}` : ""} since the decision`,
      );
    }
  }

  /** One history record per epoch, only while the lock is ours. */
  appendHistory(record: HistoryRecord): Promise<void> {
    return this.deps.store.history.append(record, { lease: this.lease });
  }

  /** Deletes a node's heartbeat and replica set, only while the lock is ours. */
  deleteNode(nodeId: string): Promise<void> {
    return this.deps.store.heartbeats.deleteNode(this.shard, nodeId, { lease: this.lease });
  }

  /** Ends the lease; a failure only delays the next controller by the rest of the lease. */
  async release(): Promise<void> {
    try {
      await this.deps.store.locks.release(this.shard, this.owner);
    } catch (error) {
      this.deps.log.warn("could not release the lock; it expires with its lease", {
        shard: this.shard,
        error: errorMessage(error),
      });
    }
  }
}

/** The configured lease, never longer than the invocation has left (with a floor for the last calls). */
export function leaseFor(deps: ControllerDeps, remainingMs: () => number): number {
  return Math.min(deps.config.lockLeaseMs, Math.max(MIN_LEASE_MS, Math.floor(remainingMs())));
}
