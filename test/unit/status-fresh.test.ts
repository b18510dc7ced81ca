import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ReportRequests } from "../../src/cli/commands/report-requests.ts";
import type { ControllerDeps } from "../../src/controller/deps.ts";
import type { Command } from "../../src/core/model.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { aConfig, aHealthyShard, NOW } from "../support/builders.ts";

/**
 * `status --fresh` (and the demo): REPORT to every node but the primary, then re-read until each
 * asked replica wrote again with an offset read no earlier than the primary's. Fake timers (the
 * Node builtins too), the clock at the builders' NOW.
 */
const CONFIG = aConfig({ failureTimeoutMs: 3000, heartbeatIntervalMs: 1000 });

beforeEach(() => {
  vi.useFakeTimers({ fakeNodeBuiltins: true, now: NOW });
});

afterEach(() => {
  vi.useRealTimers();
});

/** At the current fake time: the primary heard 0.9 s ago; r1 and r2 quiet (their last reports 19 s old). */
function quietShard(): ShardSnapshot {
  const at = (age: number) => ({ last_updated: (Date.now() - age) * 1000 });
  return aHealthyShard()
    .withNode({ node_id: "p1", ...at(900), last_txn_id: 51_842 })
    .withNode({ node_id: "r1", ...at(19_000), keepalive_ms: 20_000, last_txn_id: 1_190 })
    .withNode({ node_id: "r2", ...at(19_000), keepalive_ms: 20_000, last_txn_id: 1_358 })
    .build();
}

/** The same shard once the replicas answered: written `ageMs` before the current fake time. */
function answeredShard(ageMs: number): ShardSnapshot {
  const now = Date.now();
  const at = (age: number) => ({ last_updated: (now - age) * 1000 });
  return aHealthyShard()
    .withNode({ node_id: "p1", ...at(ageMs + 500), last_txn_id: 60_000 })
    .withNode({ node_id: "r1", ...at(ageMs), keepalive_ms: 1000, last_txn_id: 60_100 })
    .withNode({ node_id: "r2", ...at(ageMs), keepalive_ms: 1000, last_txn_id: 59_000 })
    .build();
}

function depsReading(reads: () => ShardSnapshot) {
  const sent: Array<{ node: string; command: Command }> = [];
  let snapshots = 0;
  const deps = {
    config: CONFIG,
    clock: { now: () => Date.now() },
    log: { debug() {}, info() {}, warn() {}, error() {} },
    store: {
      heartbeats: {
        snapshot: async () => {
          snapshots += 1;
          return reads();
        },
      },
    },
    bus: {
      send: async (_shard: string, node: string, command: Command) => {
        sent.push({ node, command });
      },
    },
  } as unknown as ControllerDeps;
  return { deps, sent, snapshots: () => snapshots };
}

describe("status --fresh: asking quiet replicas to report", () => {
  it("asks every replica, not the primary, and shows the first snapshot in which all answered", async () => {
    // Prepare: the replicas answer 600 ms after the ask.
    const { deps, sent, snapshots } = depsReading(() =>
      Date.now() - NOW >= 600 ? answeredShard(50) : quietShard(),
    );
    const reports = new ReportRequests(deps);

    // Act
    const reading = reports.fresh("s1", quietShard());
    await vi.advanceTimersByTimeAsync(1000);
    const snapshot = await reading;

    // Assess
    expect(sent.map(({ node, command }) => [node, command.type, command.epoch, command.timeout_ms])).toEqual([
      ["r1", "REPORT", 3, 4 * CONFIG.failureTimeoutMs],
      ["r2", "REPORT", 3, 4 * CONFIG.failureTimeoutMs],
    ]);
    expect(snapshot.nodes.find((node) => node.node_id === "r1")?.last_txn_id).toBe(60_100);
    expect(snapshots()).toBe(3);
    expect(reports.askedAt("s1")).toEqual({ r1: NOW, r2: NOW });
  });

  it("waits past a replica read before the primary's latest report", async () => {
    // Prepare: at first the replicas' answers predate the primary's report (lag unknown).
    const { deps } = depsReading(() => {
      if (Date.now() - NOW < 1000) {
        const snapshot = answeredShard(50);
        const primary = snapshot.nodes.find((node) => node.node_id === "p1");
        if (primary) Object.assign(primary, { last_updated: Date.now() * 1000 });
        return snapshot;
      }
      return answeredShard(50);
    });
    const reports = new ReportRequests(deps);

    // Act
    const reading = reports.fresh("s1", quietShard());
    await vi.advanceTimersByTimeAsync(2000);
    const snapshot = await reading;

    // Assess
    const primary = snapshot.nodes.find((node) => node.node_id === "p1");
    const r1 = snapshot.nodes.find((node) => node.node_id === "r1");
    expect(r1?.last_updated).toBeGreaterThanOrEqual(primary?.last_updated ?? Number.POSITIVE_INFINITY);
  });

  it("gives up after two failure timeouts when a replica never answers, showing what it has", async () => {
    // Prepare
    const { deps, snapshots } = depsReading(quietShard);
    const reports = new ReportRequests(deps);

    // Act
    const reading = reports.fresh("s1", quietShard());
    await vi.advanceTimersByTimeAsync(2 * CONFIG.failureTimeoutMs + 1000);
    const snapshot = await reading;

    // Assess
    expect(snapshot.nodes.find((node) => node.node_id === "r1")?.last_txn_id).toBe(1_190);
    expect(snapshots()).toBe((2 * CONFIG.failureTimeoutMs) / 250);
  });

  it("while watching, asks again only once half the report window has passed", async () => {
    // Prepare
    const { deps, sent } = depsReading(quietShard);
    const reports = new ReportRequests(deps);
    const window = 4 * CONFIG.failureTimeoutMs;

    // Act
    const first = await reports.ask(quietShard());
    await vi.advanceTimersByTimeAsync(window / 2);
    const early = await reports.ask(quietShard());
    await vi.advanceTimersByTimeAsync(1);
    const due = await reports.ask(quietShard());

    // Assess
    expect([first, early, due]).toEqual([true, false, true]);
    expect(sent).toHaveLength(4);
  });
});
