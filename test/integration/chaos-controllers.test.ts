import { afterEach, describe, expect, it } from "vitest";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  historyAt,
  linesWith,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
} from "../support/chaos-cluster.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Chaos on the controllers, with real processes: one SIGKILLed in the middle of a failover,
 * five running at once. Every action takes the shard's lock and moves the epoch by
 * compare-and-set, so a failover is finished exactly once whatever happens to its controller.
 */

let cluster: LocalCluster | undefined;

afterEach(async () => {
  await cluster?.stop();
  cluster = undefined;
});

describe("chaos: controllers", () => {
  it("finishes a failover with another controller when the one running it is SIGKILLed mid-way", {
    timeout: 120_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const before = await active.topology();
    const [controller] = active.controllers;
    if (!controller) throw new Error("no controller process");

    // Act
    active.node("node-1").signal("SIGKILL");
    // Polled as fast as the table answers: the kill lands within one read of the epoch bump.
    let caught: Topology | undefined;
    const deadline = performance.now() + WAIT_MS;
    while (caught === undefined && performance.now() < deadline) {
      const topology = await active.topology();
      if (topology?.status === "failing_over") {
        controller.child.kill("SIGKILL");
        caught = topology;
      }
    }
    const left = await active.topology();
    active.startController();
    const after = await waitForNewPrimary(active, before?.epoch ?? 0);

    // Assess
    expect(caught, "the failover was seen in progress").toBeDefined();
    // The dead controller left the failover unfinished: nobody else could move it meanwhile.
    expect(left).toMatchObject({ status: "failing_over", epoch: (before?.epoch ?? 0) + 1 });
    console.log(`controller SIGKILLed in phase ${caught?.phase}; left in phase ${left?.phase}`);
    expect(after.epoch).toBe((before?.epoch ?? 0) + 1);
    const target = left?.failover?.new_primary_node_id;
    expect(["node-2", "node-3"]).toContain(after.primary_node_id);
    if (left?.phase === "promote" || left?.phase === "confirm") expect(after.primary_node_id).toBe(target);
    const record = await historyAt(active, after.epoch);
    expect(record).toMatchObject({ kind: "failover", old_primary_node_id: "node-1" });
    expect(await active.aws.store.history.list(active.shard, 100)).toHaveLength(1);
    const second = active.logLines("controller-2.log");
    expect(linesWith(second, "continuing failover")).toHaveLength(1);
    expect(linesWith(second, "failover completed")).toHaveLength(1);
    const winner = after.primary_node_id as string;
    await waitForFollowers(active, winner, [winner === "node-2" ? "node-3" : "node-2"]);
  });

  it("fails over exactly once, epoch +1, with five controllers running at once", {
    timeout: 120_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster({ controllers: 5 });
    const active = cluster;
    const before = await active.topology();
    expect(active.controllers).toHaveLength(5);

    // Act
    active.node("node-1").signal("SIGKILL");
    const after = await waitForNewPrimary(active, before?.epoch ?? 0);
    // Negative check, several ticks more: a second failover by a slower controller would show now.
    await holdsFor(
      async () => (await active.topology())?.epoch === after.epoch,
      "the epoch of the first failover",
      5 * CHAOS_CONFIG.tickIntervalMs + CHAOS_CONFIG.failureTimeoutMs,
      CHAOS_CONFIG.tickIntervalMs,
    );

    // Assess
    expect(after.epoch).toBe((before?.epoch ?? 0) + 1);
    expect((await active.topology())?.epoch).toBe(after.epoch);
    // One record for the failover under test: the records of earlier epochs (a change while five
    // controllers started on a loaded host: a fresh-clone CI run found 3) are not this test's.
    const history = await active.aws.store.history.list(active.shard, 100);
    expect(history.filter((record) => record.epoch > (before?.epoch ?? 0))).toHaveLength(1);
    const lines = active.controllerLogLines();
    const ours = (line: Record<string, unknown>) => Number(line.epoch) > (before?.epoch ?? 0);
    const started = linesWith(lines, "failover started").filter(ours);
    const completed = linesWith(lines, "failover completed").filter(ours);
    expect(started).toHaveLength(1);
    expect(completed).toHaveLength(1);
    // One plan, at one epoch: the controller that started it finishes it, or (its lease lapsed on a
    // loaded host: a fresh-clone CI run at load 19) another continues that same plan.
    expect(started[0]?.epoch).toBe(after.epoch);
    expect(completed[0]?.epoch).toBe(after.epoch);
    if (completed[0]?.log_file !== started[0]?.log_file) {
      const continuer = lines.filter((line) => line.log_file === completed[0]?.log_file);
      expect(linesWith(continuer, "continuing failover").length).toBeGreaterThanOrEqual(1);
    }
    const winner = after.primary_node_id as string;
    await waitForFollowers(active, winner, [winner === "node-2" ? "node-3" : "node-2"]);
  });
});
