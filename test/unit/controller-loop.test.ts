import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ControllerLoop, STILL_LOG_MS } from "../../src/controller/loop.ts";
import type { ControllerDeps } from "../../src/controller/orchestrator.ts";
import { CoordinationUnavailable } from "../../src/core/errors.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { aConfig, aHealthyShard, aShardWithStalePrimary, NOW } from "../support/builders.ts";
import { MemoryEventPublisher, MemoryMetrics } from "../support/controller-fakes.ts";

// An unreachable table is what no emulator shows on demand: the shard index here always throws.
function depsWithUnreachableIndex() {
  const errors: Array<Record<string, unknown>> = [];
  const log = {
    debug() {},
    info() {},
    warn() {},
    error: (_: string, attributes = {}) => errors.push(attributes),
  };
  const store = {
    shards: {
      list: async () => {
        throw new CoordinationUnavailable("Query (shard index) failed: connect ECONNREFUSED");
      },
    },
  };
  const deps = {
    store,
    config: aConfig({ tickIntervalMs: 100 }),
    log,
    metrics: new MemoryMetrics(),
    events: new MemoryEventPublisher(),
  } as unknown as ControllerDeps;
  return { deps, errors };
}

// The loop paces itself with node:timers/promises and Date.now(): on fake timers (the Node
// builtins too) its schedule is exact.
beforeEach(() => {
  vi.useFakeTimers({ fakeNodeBuiltins: true });
});

afterEach(() => {
  vi.useRealTimers();
});

describe("controller loop resilience", () => {
  it("keeps looping when listing the shards fails, logging each failure", async () => {
    // Prepare
    const { deps, errors } = depsWithUnreachableIndex();
    const start = Date.now();
    const end = start + 700;

    // Act: passes at 0, 100, ..., 400 ms; at 500 ms only stopBeforeMs (200) is left.
    const running = new ControllerLoop(deps)
      .run({ remainingMs: () => end - Date.now(), stopBeforeMs: 200 })
      .then((summary) => ({ summary, stoppedAfterMs: Date.now() - start }));
    await vi.advanceTimersByTimeAsync(700);
    const { summary, stoppedAfterMs } = await running;

    // Assess
    expect(summary.passes).toBe(5);
    expect(summary.errors).toBe(summary.passes);
    expect(errors).toHaveLength(5);
    expect(errors[0]).toEqual({ error: "Query (shard index) failed: connect ECONNREFUSED" });
    expect(stoppedAfterMs).toBe(500);
  });

  it("starts no pass when less than stopBeforeMs remains", async () => {
    // Prepare
    const { deps } = depsWithUnreachableIndex();

    // Act
    const summary = await new ControllerLoop(deps).run({ remainingMs: () => 1000, stopBeforeMs: 1500 });

    // Assess
    expect(summary).toEqual({ passes: 0, cycles: 0, actions: 0, errors: 0 });
  });
});

describe("a run that ends when quiet (Lambda)", () => {
  it("reads every shard at its first pass, then only the shards that were not quiet", async () => {
    // Prepare: s1 healthy; s2's primary stale with its replicas seeing it up (quorum not met).
    const reads: string[] = [];
    const snapshots: Record<string, ShardSnapshot> = {
      s1: aHealthyShard().build(),
      s2: aShardWithStalePrimary(10_000)
        .withNode({ node_id: "r1", primary_link: "up" })
        .withNode({ node_id: "r2", primary_link: "up" })
        .build(),
    };
    const deps = {
      store: {
        shards: { list: async () => ({ shards: ["s1", "s2"], nextPageToken: undefined }) },
        heartbeats: {
          snapshot: async (shard: string) => {
            reads.push(shard);
            return snapshots[shard];
          },
        },
      },
      clock: { now: () => NOW },
      config: aConfig({ tickIntervalMs: 100 }),
      log: { debug() {}, info() {}, warn() {}, error() {} },
      metrics: new MemoryMetrics(),
      events: new MemoryEventPublisher(),
    } as unknown as ControllerDeps;
    const end = Date.now() + 1000;

    // Act: passes every 100 ms until 200 ms before the end.
    const running = new ControllerLoop(deps).run({
      remainingMs: () => end - Date.now(),
      stopBeforeMs: 200,
      untilQuiet: { minMs: 0 },
    });
    await vi.advanceTimersByTimeAsync(1000);
    const summary = await running;

    // Assess
    expect(summary.passes).toBe(8);
    expect(reads.filter((shard) => shard === "s1")).toHaveLength(1);
    expect(reads.filter((shard) => shard === "s2")).toHaveLength(8);
  });
});

describe("what the loop logs of a shard that stays held", () => {
  it("logs a quiet shard once, and a held one again every STILL_LOG_MS with how long it has been so", async () => {
    // Prepare: s1 healthy (quiet); s2's primary stale with its replicas seeing it up (quorum not met).
    const infos: Array<{ shard: unknown; code: unknown; unchanged_for_ms: unknown }> = [];
    const snapshots: Record<string, ShardSnapshot> = {
      s1: aHealthyShard().build(),
      s2: aShardWithStalePrimary(10_000)
        .withNode({ node_id: "r1", primary_link: "up" })
        .withNode({ node_id: "r2", primary_link: "up" })
        .build(),
    };
    const deps = {
      store: {
        shards: { list: async () => ({ shards: ["s1", "s2"], nextPageToken: undefined }) },
        heartbeats: { snapshot: async (shard: string) => snapshots[shard] },
      },
      clock: { now: () => NOW },
      config: aConfig({ tickIntervalMs: 100 }),
      log: {
        debug() {},
        info: (_: string, attributes: Record<string, unknown> = {}) =>
          infos.push({
            shard: attributes.shard,
            code: attributes.code,
            unchanged_for_ms: attributes.unchanged_for_ms,
          }),
        warn() {},
        error() {},
      },
      metrics: new MemoryMetrics(),
      events: new MemoryEventPublisher(),
    } as unknown as ControllerDeps;
    const end = Date.now() + 2 * STILL_LOG_MS + 5_000;

    // Act
    const running = new ControllerLoop(deps).run({ remainingMs: () => end - Date.now(), stopBeforeMs: 200 });
    await vi.advanceTimersByTimeAsync(2 * STILL_LOG_MS + 5_000);
    await running;

    // Assess
    expect(infos.filter((line) => line.shard === "s1")).toHaveLength(1);
    const held = infos.filter((line) => line.shard === "s2");
    expect(held.map((line) => line.code)).toEqual(["quorum_not_met", "quorum_not_met", "quorum_not_met"]);
    expect(held.map((line) => line.unchanged_for_ms)).toEqual([undefined, STILL_LOG_MS, 2 * STILL_LOG_MS]);
  });
});
