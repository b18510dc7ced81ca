import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../src/adapters/observability.ts";
import { runShardCycle } from "../../src/controller/cycle.ts";
import { type ControllerDeps, OutOfTime } from "../../src/controller/deps.ts";
import { ShardLock } from "../../src/controller/lock.ts";
import { leaseWithin, MIN_LEASE_MS, timeNeeded } from "../../src/core/budget.ts";
import { aConfig, aShardWithStalePrimary, NOW } from "../support/builders.ts";
import { MemoryShard } from "../support/memory-shard.ts";

/** The lease never outlives what the invocation can renew. */
describe("leaseWithin", () => {
  it("is the configured lease when the invocation has more time (or no limit)", () => {
    expect(leaseWithin(60_000, Number.POSITIVE_INFINITY)).toBe(60_000);
    expect(leaseWithin(60_000, 75_000)).toBe(60_000);
  });

  it("is cut to the invocation's remaining time, so a timed-out invocation's lock expires with it", () => {
    expect(leaseWithin(60_000, 12_345.6)).toBe(12_345);
    expect(leaseWithin(60_000, MIN_LEASE_MS)).toBe(MIN_LEASE_MS);
  });

  it("is no lease at all with less than the shortest lease left: never one past the invocation's end", () => {
    expect(leaseWithin(60_000, MIN_LEASE_MS - 1)).toBeUndefined();
    expect(leaseWithin(60_000, 10)).toBeUndefined();
    expect(leaseWithin(60_000, -5)).toBeUndefined();
  });
});

describe("timeNeeded", () => {
  it("is each step's bound plus the margin, summed over the steps run one after the other", () => {
    expect(timeNeeded([3000])).toBe(4000);
    expect(timeNeeded([7000, 5000])).toBe(14_000);
    expect(timeNeeded([])).toBe(0);
  });
});

describe("ShardLock within the invocation's time", () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: NOW });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("asks for the lease cut to the remaining time, at acquisition and at every renewal", async () => {
    // Prepare
    const shard = new MemoryShard();
    let left = 30_000.7;

    // Act: a renewal is due after a third of the configured lease (60 s).
    const lock = await ShardLock.acquire(shard.deps(), shard.shard, { remainingMs: () => left });
    shard.advance(20_000);
    left = 8000;
    if (!(lock instanceof ShardLock)) throw new Error(`not locked: ${lock.reason}`);
    await lock.hold("confirm");

    // Assess
    expect(shard.config.lockLeaseMs).toBe(60_000);
    expect(shard.leases).toEqual([
      { op: "acquire", leaseMs: 30_000 },
      { op: "renew", leaseMs: 8000 },
    ]);
    expect(shard.lock?.expires_at).toBe(shard.now() + 8000);
  });

  it("takes no lock with less than the shortest lease left, and says so", async () => {
    // Prepare
    const shard = new MemoryShard();

    // Act
    const lock = await ShardLock.acquire(shard.deps(), shard.shard, { remainingMs: () => 900 });

    // Assess
    expect(lock).toEqual({
      outcome: "deferred",
      reason: `shard s1: 900 ms left in this invocation, under the ${MIN_LEASE_MS} ms shortest lease; too late to take the lock`,
    });
    expect(shard.leases).toEqual([]);
    expect(shard.lock).toBeUndefined();
  });

  it("does not extend a lease past the invocation's end: OutOfTime before the phase, the lease untouched", async () => {
    // Prepare
    const shard = new MemoryShard();
    let left = 10_000;
    const lock = await ShardLock.acquire(shard.deps(), shard.shard, { remainingMs: () => left });
    if (!(lock instanceof ShardLock)) throw new Error(`not locked: ${lock.reason}`);
    const expiresAt = shard.lock?.expires_at;
    shard.advance(20_000);
    left = 999;

    // Act
    const held = lock.hold("repoint");

    // Assess
    await expect(held).rejects.toBeInstanceOf(OutOfTime);
    await expect(held).rejects.toMatchObject({ phase: "repoint" });
    expect(shard.leases).toEqual([{ op: "acquire", leaseMs: 10_000 }]);
    expect(shard.lock?.expires_at).toBe(expiresAt);
  });
});

describe("ShardLock after an acquire whose answer was lost", () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: NOW });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  /** A store whose next acquire commits and then fails as a timeout would (the outcome unknown to the caller). */
  function ambiguousOnce(shard: MemoryShard) {
    const deps = shard.deps();
    const acquire = deps.store.locks.acquire;
    let lose = true;
    deps.store.locks.acquire = async (...args) => {
      const lease = await acquire(...args);
      if (lose) {
        lose = false;
        throw new Error("TimeoutError: request timed out after 3000 ms");
      }
      return lease;
    };
    return deps;
  }

  it("takes the lock at the next attempt with the same token instead of waiting out its own lease (simulator seed 52929)", async () => {
    // Prepare: the first acquire committed, its answer lost.
    const shard = new MemoryShard();
    const deps = ambiguousOnce(shard);
    await expect(ShardLock.acquire(deps, shard.shard)).rejects.toThrow("timed out");
    const committed = shard.lock?.owner;
    expect(committed).toBeDefined();

    // Act: the next pass, a second later (the lease is 60 s).
    shard.advance(1000);
    const lock = await ShardLock.acquire(deps, shard.shard);

    // Assess: locked under the token that held it, with a new fence.
    if (!(lock instanceof ShardLock)) throw new Error(`not locked: ${lock.reason}`);
    expect(lock.owner).toBe(committed);
    expect(lock.lease.fence).toBe(2);
  });

  it("uses a fresh token once the doubt is settled, and never another controller's", async () => {
    // Prepare
    const shard = new MemoryShard();
    const deps = ambiguousOnce(shard);
    await expect(ShardLock.acquire(deps, shard.shard)).rejects.toThrow("timed out");
    const first = shard.lock?.owner;
    shard.advance(1000);
    const settled = await ShardLock.acquire(deps, shard.shard);
    if (!(settled instanceof ShardLock)) throw new Error(`not locked: ${settled.reason}`);
    await settled.release();

    // Act: another controller takes the lock; then this one tries again.
    const other = await ShardLock.acquire(shard.deps(), shard.shard);
    const again = await ShardLock.acquire(deps, shard.shard);

    // Assess
    if (!(other instanceof ShardLock)) throw new Error(`not locked: ${other.reason}`);
    expect(other.owner).not.toBe(first);
    expect(again).toEqual({ outcome: "lost_race", reason: "another controller holds the shard's lock" });
    expect(shard.lock?.owner).toBe(other.owner);
  });
});

describe("ShardLock after a release that failed", () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: NOW });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("takes its own unreleased lock again at the next pass (simulator seed 52929: a flaky store refused the release)", async () => {
    // Prepare: locked, then the release fails (throttled).
    const shard = new MemoryShard();
    const deps = shard.deps();
    deps.store.locks.release = async () => {
      throw new Error("ThrottlingException: Rate of requests exceeds the allowed throughput");
    };
    const lock = await ShardLock.acquire(deps, shard.shard);
    if (!(lock instanceof ShardLock)) throw new Error(`not locked: ${lock.reason}`);
    await lock.release();
    expect(shard.lock?.expires_at).toBeGreaterThan(shard.now());

    // Act: the next pass, a second later (the lease is 60 s); another controller meanwhile.
    shard.advance(1000);
    const other = await ShardLock.acquire(shard.deps(), shard.shard);
    const again = await ShardLock.acquire(deps, shard.shard);

    // Assess
    expect(other).toEqual({ outcome: "lost_race", reason: "another controller holds the shard's lock" });
    if (!(again instanceof ShardLock)) throw new Error(`not locked: ${again.reason}`);
    expect(again.owner).toBe(lock.owner);
    expect(again.lease.fence).toBe(2);
  });
});

describe("the controller cycle with its own unreleased lock in the snapshot", () => {
  it("decides as if unlocked: its own lease does not hold up a failover (simulator seed 52929: 60 s without one)", async () => {
    // Prepare: a lock taken by this controller whose release failed; the primary is stale.
    const snapshot = aShardWithStalePrimary().lockedBy("controller-a").build();
    const deps = {
      store: {
        heartbeats: { snapshot: async () => snapshot },
        locks: {
          acquire: async (shard: string, owner: string) => ({ shard, owner, fence: 1 }),
          release: async () => {
            throw new Error("ThrottlingException: Rate of requests exceeds the allowed throughput");
          },
        },
      },
      config: aConfig(),
      clock: { now: () => NOW },
      log: silentLogger,
      newOwner: () => "controller-a",
    } as unknown as ControllerDeps;
    const lock = await ShardLock.acquire(deps, "s1");
    if (!(lock instanceof ShardLock)) throw new Error(`not locked: ${lock.reason}`);
    await lock.release();

    // Act: the next pass, deciding only.
    const result = await runShardCycle(deps, "s1", { act: false });

    // Assess: the failover is decided (the acquire that follows reuses the token); another
    // controller's lock still holds it.
    expect(result.decision?.kind).toBe("failover");
    const other = { ...deps, newOwner: () => "controller-b" } as ControllerDeps;
    expect((await runShardCycle(other, "s1", { act: false })).decision).toMatchObject({
      kind: "none",
      code: "locked",
    });
  });
});
