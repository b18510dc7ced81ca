import { describe, expect, it } from "vitest";
import { silentLogger } from "../../src/adapters/observability.ts";
import { ControllerLoop } from "../../src/controller/loop.ts";
import type { ControllerDeps } from "../../src/controller/orchestrator.ts";
import { partitionOf } from "../../src/core/partition.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { aConfig } from "../support/builders.ts";
import { MemoryEventPublisher, MemoryMetrics } from "../support/controller-fakes.ts";

// A shard index of `count` shards in pages, and snapshots with no topology and no node (decide:
// nothing to do), recording which shards were read and how many reads overlapped.
function fleet(count: number) {
  const shards = Array.from({ length: count }, (_, i) => `shard-${i}`);
  const read: string[] = [];
  let inFlight = 0;
  let maxInFlight = 0;
  const store = {
    shards: {
      list: async (token: string | undefined, pageSize: number) => {
        const start = Number(token ?? 0);
        const end = start + pageSize;
        return { shards: shards.slice(start, end), nextPageToken: end < count ? String(end) : undefined };
      },
    },
    heartbeats: {
      snapshot: async (shard: string): Promise<ShardSnapshot> => {
        inFlight += 1;
        maxInFlight = Math.max(maxInFlight, inFlight);
        await new Promise((resolve) => setImmediate(resolve));
        inFlight -= 1;
        read.push(shard);
        return {
          shard,
          nodes: [],
          replicaSets: {},
          replicaSetVersions: {},
          topology: undefined,
          lock: undefined,
          malformed: [],
        };
      },
    },
  };
  const deps = {
    store,
    config: aConfig(),
    log: silentLogger,
    metrics: new MemoryMetrics(),
    events: new MemoryEventPublisher(),
    clock: { now: () => Date.now() },
  } as unknown as ControllerDeps;
  return { deps, shards, read, maxInFlight: () => maxInFlight };
}

describe("controller loop partitions and concurrency", () => {
  it("one pass over K partitions reads every shard of the index exactly once, each in its own partition", async () => {
    // Prepare
    const { deps, shards, read } = fleet(250);

    // Act
    for (let index = 0; index < 3; index++) {
      const before = read.length;
      await new ControllerLoop(deps).run({ once: true, partition: { index, count: 3 }, pageSize: 40 });
      for (const shard of read.slice(before)) expect(partitionOf(shard, 3)).toBe(index);
    }

    // Assess
    expect([...read].sort()).toEqual([...shards].sort());
  });

  it("without a partition a pass reads every shard, at most `concurrency` at once", async () => {
    // Prepare
    const { deps, shards, read, maxInFlight } = fleet(100);

    // Act
    const summary = await new ControllerLoop(deps).run({ once: true, concurrency: 5 });

    // Assess
    expect(summary.cycles).toBe(100);
    expect([...read].sort()).toEqual([...shards].sort());
    expect(maxInFlight()).toBe(5);
  });

  it("filters an explicit shard list by the partition too", async () => {
    // Prepare
    const { deps, read } = fleet(0);
    const shards = ["a", "b", "c", "d", "e", "f"];

    // Act
    await new ControllerLoop(deps).run({ once: true, shards, partition: { index: 1, count: 2 } });

    // Assess
    expect(read.length).toBeGreaterThan(0);
    expect(read.length).toBeLessThan(shards.length);
    expect(read.sort()).toEqual(shards.filter((shard) => partitionOf(shard, 2) === 1));
  });
});
