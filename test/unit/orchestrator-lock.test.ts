import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { OutOfTime } from "../../src/controller/deps.ts";
import { ShardLock } from "../../src/controller/lock.ts";
import { leaseWithin, MIN_LEASE_MS, timeNeeded } from "../../src/core/budget.ts";
import { NOW } from "../support/builders.ts";
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
