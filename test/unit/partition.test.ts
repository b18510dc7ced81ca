import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  fnv1a64,
  inPartition,
  jumpHash,
  parsePartitionText,
  partitionFromEvent,
  partitionOf,
  validatePartition,
} from "../../src/core/partition.ts";

describe("fnv1a64", () => {
  it.each([
    ["", 0xcbf29ce484222325n],
    ["a", 0xaf63dc4c8601ec8cn],
    ["foobar", 0x85944171f73967e8n],
  ])("hashes %j to the published FNV-1a 64 value", (text, expected) => {
    expect(fnv1a64(text)).toBe(expected);
  });
});

describe("partitionOf", () => {
  it.each([
    // Fixed on purpose: a change of hash would move shards between deployed controllers.
    ["orders", 1, 0],
    ["orders", 2, 0],
    ["orders", 5, 0],
    ["sessions", 3, 0],
    ["cart-7", 5, 2],
    ["shard-0042", 5, 3],
    ["shard-0042", 10, 5],
    ["", 4, 3],
  ])("%j over %i partitions is in partition %i", (shard, count, expected) => {
    expect(partitionOf(shard, count)).toBe(expected);
  });

  it("balances 10,000 shards over 5 partitions within 10% of the mean", () => {
    const sizes = new Array<number>(5).fill(0);
    for (let i = 0; i < 10_000; i++) {
      const index = partitionOf(`shard-${i}`, 5);
      sizes[index] = (sizes[index] ?? 0) + 1;
    }
    for (const size of sizes) expect(Math.abs(size - 2000)).toBeLessThan(200);
  });

  it("moves only about 1/(K+1) of the shards from K to K+1 partitions, all into the new one", () => {
    let moved = 0;
    for (let i = 0; i < 10_000; i++) {
      const before = partitionOf(`shard-${i}`, 4);
      const after = partitionOf(`shard-${i}`, 5);
      if (before !== after) {
        moved += 1;
        expect(after).toBe(4);
      }
    }
    expect(moved).toBeGreaterThan(1600);
    expect(moved).toBeLessThan(2400);
  });

  it("rejects a partition count that is not a positive integer", () => {
    expect(() => jumpHash(1n, 0)).toThrow(RangeError);
    expect(() => jumpHash(1n, 1.5)).toThrow(RangeError);
  });

  it("property: every shard is in exactly one partition, in range, and keeps it or moves to the new one when K grows", () => {
    fc.assert(
      fc.property(fc.string(), fc.integer({ min: 1, max: 64 }), (shard, count) => {
        const index = partitionOf(shard, count);
        expect(index).toBeGreaterThanOrEqual(0);
        expect(index).toBeLessThan(count);
        const owners = Array.from({ length: count }, (_, i) => i).filter((i) =>
          inPartition(shard, { index: i, count }),
        );
        expect(owners).toEqual([index]);
        const grown = partitionOf(shard, count + 1);
        expect(grown === index || grown === count).toBe(true);
      }),
    );
  });
});

describe("inPartition and validatePartition", () => {
  it("with no partition or one partition, every shard is watched", () => {
    expect(inPartition("x", undefined)).toBe(true);
    expect(inPartition("x", { index: 0, count: 1 })).toBe(true);
  });

  it.each([
    [{ index: 0, count: 1 }, undefined],
    [{ index: 4, count: 5 }, undefined],
    [{ index: 5, count: 5 }, "partition index must be an integer from 0 to 4, got 5"],
    [{ index: -1, count: 5 }, "partition index must be an integer from 0 to 4, got -1"],
    [{ index: 0, count: 0 }, "partition count must be a positive integer, got 0"],
    [{ index: 0, count: 2.5 }, "partition count must be a positive integer, got 2.5"],
  ])("%j: %s", (partition, problem) => {
    expect(validatePartition(partition)).toBe(problem);
  });
});

describe("partition inputs", () => {
  it("reads the schedule's partition, and none from a plain scheduled event", () => {
    expect(partitionFromEvent({ partition: { index: 2, count: 5 } })).toEqual({ index: 2, count: 5 });
    expect(partitionFromEvent({ "detail-type": "Scheduled Event" })).toBeUndefined();
    expect(partitionFromEvent(null)).toBeUndefined();
  });

  it.each([[{ partition: { index: 5, count: 5 } }], [{ partition: { count: 5 } }], [{ partition: null }]])(
    "refuses %j",
    (event) => {
      expect(() => partitionFromEvent(event)).toThrow(/scheduled event: partition/);
    },
  );

  it("parses --partition index/count", () => {
    expect(parsePartitionText("0/5")).toEqual({ index: 0, count: 5 });
    expect(() => parsePartitionText("5/5")).toThrow("partition index must be an integer from 0 to 4, got 5");
    expect(() => parsePartitionText("two")).toThrow("expected <index>/<count>, e.g. 0/5, got two");
  });
});
