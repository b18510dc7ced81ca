import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ControllerLoop } from "../../src/controller/loop.ts";
import type { ControllerDeps } from "../../src/controller/orchestrator.ts";
import {
  indexListingStale,
  screenWakes,
  type Wake,
  wakeLimits,
  wokenCycleDelay,
} from "../../src/core/wake.ts";
import { aConfig, aHealthyShard } from "../support/builders.ts";
import { MemoryEventPublisher, MemoryMetrics } from "../support/controller-fakes.ts";

function aWake(shard: string, node = "n1"): Wake {
  return { shard, node, reason: "crash", sent_at: Date.now() };
}

describe("screenWakes: which shards a batch of wake-ups may cycle", () => {
  const known = new Set(["orders", "payments", "carts"]);

  it.each<{
    name: string;
    wakes: string[];
    known: ReadonlySet<string> | undefined;
    maxShards: number;
    shards: string[];
    unknown: string[];
    overCap: string[];
  }>([
    {
      name: "cycles each listed shard once, however often it is named",
      wakes: ["orders", "orders", "payments", "orders"],
      known,
      maxShards: 32,
      shards: ["orders", "payments"],
      unknown: [],
      overCap: [],
    },
    {
      name: "drops shards the index does not list",
      wakes: ["fake-1", "orders", "fake-2", "fake-1"],
      known,
      maxShards: 32,
      shards: ["orders"],
      unknown: ["fake-1", "fake-2"],
      overCap: [],
    },
    {
      name: "caps the distinct listed shards per batch, in order of first mention",
      wakes: ["carts", "orders", "payments"],
      known,
      maxShards: 2,
      shards: ["carts", "orders"],
      unknown: [],
      overCap: ["payments"],
    },
    {
      name: "takes every shard as listed, still capped, when no listing has succeeded",
      wakes: ["a", "b", "c"],
      known: undefined,
      maxShards: 2,
      shards: ["a", "b"],
      unknown: [],
      overCap: ["c"],
    },
  ])("$name", ({ wakes, known: listed, maxShards, shards, unknown, overCap }) => {
    // Act
    const screened = screenWakes(
      wakes.map((shard) => aWake(shard)),
      listed,
      { maxShards },
    );

    // Assess
    expect(screened).toEqual({ shards, unknown, overCap });
  });

  it("drops 10,000 wake-ups naming 10,000 made-up shards and keeps the one real shard", () => {
    // Prepare
    const wakes = Array.from({ length: 10_000 }, (_, index) => aWake(`fake-${index}`));
    wakes.splice(5000, 0, aWake("orders"));

    // Act
    const screened = screenWakes(wakes, known, { maxShards: 32 });

    // Assess
    expect(screened.shards).toEqual(["orders"]);
    expect(screened.unknown).toHaveLength(10_000);
  });
});

describe("wake limits", () => {
  it.each([
    { last: undefined, now: 1000, min: 250, delay: 0 },
    { last: 1000, now: 1000, min: 250, delay: 250 },
    { last: 1000, now: 1100, min: 250, delay: 150 },
    { last: 1000, now: 1250, min: 250, delay: 0 },
    { last: 1000, now: 5000, min: 250, delay: 0 },
  ])("delays a woken cycle started at $last, woken at $now, by $delay ms", ({ last, now, min, delay }) => {
    expect(wokenCycleDelay(last, now, min)).toBe(delay);
  });

  it.each([
    { listedAt: undefined, now: 0, stale: true },
    { listedAt: 0, now: 29_999, stale: false },
    { listedAt: 0, now: 30_000, stale: true },
  ])(
    "lists the index again for an unknown shard when the listing at $listedAt is stale at $now: $stale",
    ({ listedAt, now, stale }) => {
      expect(indexListingStale(listedAt, now, 30_000)).toBe(stale);
    },
  );

  it("derives a tenth of a tick between a shard's woken cycles, the loop's concurrency as the cap", () => {
    expect(wakeLimits(1000, 32)).toEqual({ maxShards: 32, minIntervalMs: 100, indexMaxAgeMs: 30_000 });
  });
});

/** A loop over a fake store that counts snapshot reads and index listings. */
function countingLoop(listed: readonly string[]) {
  const reads = { snapshots: new Map<string, number>(), listings: 0 };
  const store = {
    shards: {
      list: async () => {
        reads.listings += 1;
        return { shards: [...listed] };
      },
    },
    heartbeats: {
      snapshot: async (shard: string) => {
        reads.snapshots.set(shard, (reads.snapshots.get(shard) ?? 0) + 1);
        return { ...aHealthyShard().build(), shard };
      },
    },
  };
  const noop = () => {};
  const deps = {
    store,
    clock: { now: () => Date.now() },
    config: aConfig({ tickIntervalMs: 1000 }),
    log: { debug: noop, info: noop, warn: noop, error: noop },
    metrics: new MemoryMetrics(),
    events: new MemoryEventPublisher(),
  } as unknown as ControllerDeps;
  return { loop: new ControllerLoop(deps), reads };
}

const total = (counts: Map<string, number>) => [...counts.values()].reduce((sum, count) => sum + count, 0);

describe("the controller loop under a flood of wake-ups", () => {
  beforeEach(() => {
    vi.useFakeTimers({ fakeNodeBuiltins: true });
  });

  afterEach(() => {
    vi.useRealTimers();
  });

  it("reads nothing for 1,000 batches of 10 made-up shards but one listing of the index", async () => {
    // Prepare
    const { loop, reads } = countingLoop(["orders"]);

    // Act: 10,000 wake-ups, as the SQS event source's batches of 10, over 10 s.
    const summaries = [];
    for (let batch = 0; batch < 1000; batch++) {
      const wakes = Array.from({ length: 10 }, (_, index) => aWake(`fake-${batch}-${index}`));
      summaries.push(await loop.wake(wakes));
      await vi.advanceTimersByTimeAsync(10);
    }

    // Assess: no cycle at all; the index listed once (its listing is fresh for 30 s).
    expect(total(reads.snapshots)).toBe(0);
    expect(reads.listings).toBe(1);
    expect(summaries.every((summary) => summary.cycles === 0 && summary.shards.length === 0)).toBe(true);
  });

  it("cycles one real shard named 1,000 times a second once per tenth of a tick, not 1,000 times", async () => {
    // Prepare
    const { loop, reads } = countingLoop(["orders"]);

    // Act: a wake-up every millisecond for 1 s, not waited for (the local controller's consumer).
    const running: Promise<unknown>[] = [];
    for (let ms = 0; ms < 1000; ms++) {
      running.push(loop.wake([aWake("orders")]));
      await vi.advanceTimersByTimeAsync(1);
    }
    await vi.advanceTimersByTimeAsync(1000);
    await Promise.all(running);

    // Assess: cycles 100 ms apart, at 0, 100, ..., 1000 and, for the wake-ups after 900, 1100.
    expect(reads.snapshots.get("orders")).toBe(12);
  });

  it("still cycles a real shard at once among made-up ones", async () => {
    // Prepare
    const { loop, reads } = countingLoop(["orders", "payments"]);

    // Act
    const summary = await loop.wake([aWake("fake-1"), aWake("payments"), aWake("fake-2")]);

    // Assess
    expect(summary.shards).toEqual(["payments"]);
    expect(Object.fromEntries(reads.snapshots)).toEqual({ payments: 1 });
  });
});
