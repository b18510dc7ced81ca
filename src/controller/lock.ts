import { leaseWithin, MIN_LEASE_MS } from "../core/budget.ts";
import { errorMessage } from "../core/errors.ts";
import type { FailoverPhase, HistoryRecord, Topology } from "../core/model.ts";
import { type LockLease, LockLost, type WriteFence } from "../core/ports.ts";
import {
  type ControllerDeps,
  newOwnerOf,
  type Outcome,
  OutOfTime,
  PlanStale,
  type RemainingMs,
  UNLIMITED,
} from "./deps.ts";

/**
 * The shard's lock, in one place: acquire, renew, release, and every write made under it.
 *
 * The lease alone does not make a controller safe: a controller paused (GC, throttled Lambda,
 * preempted host) longer than its lease still believes it holds the lock when it wakes up. So
 * every write made under the lock carries the lock check in the same request (the store's
 * `WriteFence`: a ConditionCheck on the LOCK item's owner token and fence inside one
 * TransactWriteItems). A write after the lock was taken over writes nothing and throws
 * LockLost, whatever happened between the last renewal and the write.
 *
 * The lease never outlives the invocation that can renew it: it is the configured lease cut to
 * the invocation's remaining time (core/budget.ts `leaseWithin`), at every acquisition and
 * renewal, and with less than MIN_LEASE_MS left no lock is taken or extended (OutOfTime). A
 * controller cut off by its timeout thus leaves a lock that expires when it stopped.
 */

/**
 * Per controller (its deps), per shard: the owner token of the last acquire whose outcome is
 * unknown (no write was made under it: the controller never knew it held the lock), or of a lock
 * it could not release. The store's acquire succeeds for the token that holds the lock already,
 * so using it again settles the doubt either way.
 */
const UNSETTLED = new WeakMap<ControllerDeps, Map<string, string>>();

function unsettledOf(deps: ControllerDeps): Map<string, string> {
  let tokens = UNSETTLED.get(deps);
  if (tokens === undefined) {
    tokens = new Map();
    UNSETTLED.set(deps, tokens);
  }
  return tokens;
}

/** Why no lock was taken: another controller holds it, or the invocation is too near its end. */
export type NotLocked = Outcome & { readonly outcome: "lost_race" | "deferred" };

export class ShardLock {
  readonly deps: ControllerDeps;
  readonly lease: LockLease;
  /** Time left to the invocation (Lambda); the lease is never longer than that. */
  readonly #remainingMs: RemainingMs;
  #lastRenewal: number;

  private constructor(deps: ControllerDeps, lease: LockLease, remainingMs: RemainingMs) {
    this.deps = deps;
    this.lease = lease;
    this.#remainingMs = remainingMs;
    this.#lastRenewal = deps.clock.now();
  }

  /** Takes the shard's lock with a fresh owner token and a lease within the invocation's time. */
  static async acquire(
    deps: ControllerDeps,
    shard: string,
    options: { readonly forPrimary?: string; readonly remainingMs?: RemainingMs } = {},
  ): Promise<ShardLock | NotLocked> {
    const remainingMs = options.remainingMs ?? UNLIMITED;
    const leaseMs = leaseWithin(deps.config.lockLeaseMs, remainingMs());
    if (leaseMs === undefined) {
      return { outcome: "deferred", reason: tooLate(shard, remainingMs, "take") };
    }
    // An acquire whose answer was lost (a timeout, a 5xx) may have committed: this controller would
    // hold the lock without knowing, and every controller, itself included, would wait out the
    // lease (simulator seed 52929: 60 s without a failover after a flaky store healed). Its token
    // is used again for the shard's next acquire, which the store grants to the same owner.
    const unsettled = unsettledOf(deps);
    const owner = unsettled.get(shard) ?? newOwnerOf(deps);
    let lease: LockLease | false;
    try {
      lease = await deps.store.locks.acquire(shard, owner, leaseMs, options.forPrimary);
    } catch (error) {
      unsettled.set(shard, owner);
      throw error;
    }
    unsettled.delete(shard);
    if (!lease) return { outcome: "lost_race", reason: "another controller holds the shard's lock" };
    return new ShardLock(deps, lease, remainingMs);
  }

  /**
   * The owner token this controller may hold \`shard\`'s lock under without knowing (an acquire
   * whose answer was lost, a release that failed): its decision does not wait for that lock, and
   * its next acquire takes it again.
   */
  static unsettledOwner(deps: ControllerDeps, shard: string): string | undefined {
    return UNSETTLED.get(deps)?.get(shard);
  }

  get shard(): string {
    return this.lease.shard;
  }

  get owner(): string {
    return this.lease.owner;
  }

  /**
   * Extends the lease when a third of the configured lease has passed since the last renewal
   * (a lease cut to the invocation's end cannot be extended past it anyway); LockLost when it is
   * gone; OutOfTime (before `phase`) when less than MIN_LEASE_MS is left to the invocation.
   */
  async hold(phase: FailoverPhase): Promise<void> {
    const now = this.deps.clock.now();
    if (now - this.#lastRenewal < this.deps.config.lockLeaseMs / 3) return;
    const leaseMs = leaseWithin(this.deps.config.lockLeaseMs, this.#remainingMs());
    if (leaseMs === undefined) throw new OutOfTime(phase, tooLate(this.shard, this.#remainingMs, "extend"));
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

  /**
   * Ends the lease. A release that failed (or whose answer was lost) leaves the lock with this
   * controller: its next acquire of the shard uses the same token and gets it at once; other
   * controllers wait for the rest of the lease.
   */
  async release(): Promise<void> {
    try {
      await this.deps.store.locks.release(this.shard, this.owner);
    } catch (error) {
      unsettledOf(this.deps).set(this.shard, this.owner);
      this.deps.log.warn(
        "could not release the lock; it expires with its lease, or this controller takes it again at its next pass",
        { shard: this.shard, error: errorMessage(error) },
      );
    }
  }
}

function tooLate(shard: string, remainingMs: RemainingMs, verb: "take" | "extend"): string {
  const left = Math.max(0, Math.floor(remainingMs()));
  return `shard ${shard}: ${left} ms left in this invocation, under the ${MIN_LEASE_MS} ms shortest lease; too late to ${verb} the lock`;
}
