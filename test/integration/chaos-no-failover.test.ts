import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  linesWith,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  withClient,
} from "../support/chaos-cluster.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Failures that must NOT cause a failover, with real processes: the primary's agent dies while
 * its database serves, or a replica dies. A failover here would be a false one: an outage of
 * the writes for nothing, and data loss for whatever the old primary had not replicated.
 */

/** How long the shard is watched for an unwanted failover once the fault is visible. */
const OBSERVE_MS = 3 * CHAOS_CONFIG.failureTimeoutMs;

/**
 * Negative check: for OBSERVE_MS (three failure timeouts, fifteen controller ticks) the topology
 * keeps its epoch with node-1 primary; fails at the first tick it does not.
 */
async function noFailoverFor(active: LocalCluster, epoch: number | undefined): Promise<void> {
  await holdsFor(
    async () => {
      const topology = await active.topology();
      return (
        topology?.epoch === epoch && topology?.status === "online" && topology.primary_node_id === "node-1"
      );
    },
    "no failover",
    OBSERVE_MS,
    CHAOS_CONFIG.tickIntervalMs,
  );
}

let cluster: LocalCluster | undefined;

afterEach(async () => {
  await cluster?.stop();
  cluster = undefined;
});

describe("chaos: faults that must not fail over", () => {
  it("keeps the primary when only its agent is SIGKILLed (majority quorum not met) and logs why", {
    timeout: 120_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const before = await active.topology();

    // Act
    await active.stopAgent("node-1", "SIGKILL");
    let why: Record<string, unknown> | undefined;
    await active.waitFor(
      "the controller to log why it does not fail over",
      () => {
        why = active.controllerLogLines().find((line) => line.code === "quorum_not_met");
        return why !== undefined;
      },
      WAIT_MS,
    );
    await noFailoverFor(active, before?.epoch);

    // Assess
    expect(why).toMatchObject({ level: "INFO", shard: active.shard, decision: "none", outcome: "no_action" });
    expect(String(why?.message)).toMatch(
      // How many replicas count as fresh at that first line depends on where their quiet reports
      // fall on a loaded machine; what matters is that none reports the primary down.
      // (with none fresh at that instant, the line says it waits for their next heartbeat).
      /^primary node-1 is stale .*(, but only 0 of \d fresh replicas report the primary down \(quorum majority needs \d\); not failing over|; no fresh replica to ask, but the agents of .* were just heard with their databases up .*; waiting for their next heartbeat)$/,
    );
    expect(await active.topology()).toMatchObject({
      epoch: before?.epoch,
      status: "online",
      primary_node_id: "node-1",
    });
    expect(linesWith(active.controllerLogLines(), "failover started")).toEqual([]);
    expect(await probeWrite(active.node("node-1"), "still-primary")).toMatchObject({
      role: "master",
      accepted: true,
    });

    // The agent restarts beside its live database: fenced start finds itself the primary, no change.
    active.startAgent("node-1");
    await active.waitFor(
      "the controller to see node-1 healthy again",
      () => {
        const lines = active.controllerLogLines();
        const stale = lines.findIndex((line) => line.code === "quorum_not_met");
        return lines.slice(stale + 1).some((line) => line.code === "healthy");
      },
      WAIT_MS,
    );
    expect((await active.topology())?.epoch).toBe(before?.epoch);
  });

  it("keeps the primary when a replica is SIGKILLed, and drops the replica from its replica set", {
    timeout: 120_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const before = await active.topology();
    await active.waitFor(
      "node-1's replica set to hold both replicas",
      async () => (await active.snapshot()).replicaSets["node-1"]?.length === 2,
      WAIT_MS,
    );

    // Act
    active.node("node-3").signal("SIGKILL");
    await active.waitFor(
      "node-3's heartbeat to go stale and leave node-1's replica set",
      async () => {
        const snapshot = await active.snapshot();
        const heartbeat = active.heartbeatOf(snapshot, "node-3");
        const ageMs = active.aws.clock.now() - (heartbeat?.last_updated ?? 0) / 1000;
        return (
          heartbeat?.db_status === "down" &&
          ageMs > CHAOS_CONFIG.failureTimeoutMs &&
          !(snapshot.replicaSets["node-1"] ?? []).includes("node-3")
        );
      },
      WAIT_MS,
    );
    await noFailoverFor(active, before?.epoch);

    // Assess
    expect(await active.topology()).toMatchObject({
      epoch: before?.epoch,
      status: "online",
      primary_node_id: "node-1",
    });
    expect(linesWith(active.controllerLogLines(), "failover started")).toEqual([]);
    const decisions = active.controllerLogLines().filter((line) => line.decision !== undefined);
    expect(decisions.at(-1)).toMatchObject({ decision: "none", code: "healthy" });
    const replicated = await withClient(active.node("node-1"), async (client) => {
      await client.set("after-replica-death", "v");
      return Number(await client.call("WAIT", "1", "5000"));
    });
    expect(replicated).toBe(1);
  });
});
