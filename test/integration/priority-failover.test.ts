import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForNewPrimary,
  withClient,
} from "../support/chaos-cluster.ts";
import { continuousWriter, missingKeys } from "../support/data-safety.ts";

/**
 * Issue 30, finding 2 (guarantee 1): the candidates were ranked by priority before offset, so a
 * preferred replica behind by up to `maxLagOnFailover` was promoted and the writes only the replica
 * ahead acknowledged were lost. Here node-2 (priority 10, preferred) is cut off from the primary
 * (its handshake refused: a wrong `masterauth`) while node-3 (priority 200) keeps acknowledging
 * writes (`WAIT 1`); then the primary is killed. Only node-3 holds every acknowledged write, so
 * it must be the one promoted. Real redis-server, agents, controller, DynamoDB Local and SQS.
 */

/** The production failure timeout: node-2's agent stays fresh throughout, a candidate by every other rule. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };

let cluster: LocalCluster | undefined;
const stops: Array<() => Promise<unknown>> = [];

afterEach(async () => {
  for (const stop of stops.splice(0)) await stop();
  await cluster?.stop();
  cluster = undefined;
});

describe("priority among failover candidates", () => {
  it("promotes the low-priority replica that holds every acknowledged write, not the preferred one behind it", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-2 preferred (10), node-3 least preferred (200); replica-acknowledged writes.
    cluster = await startChaosCluster({ config: CONFIG, priorities: [100, 10, 200], readyTimeoutMs: 90_000 });
    const active = cluster;
    const writer = continuousWriter(active, "node-1", { prefix: "priority", follow: true, waitReplicas: 1 });
    stops.push(writer.stop);
    await active.waitFor("acknowledged writes", () => writer.report().acked.length > 20, WAIT_MS);
    // node-2 cannot resync: the primary refuses its AUTH (no password is set there).
    await withClient(active.node("node-2"), async (client) => {
      await client.config("SET", "masterauth", "not-the-primary-password");
      await client.call("CLIENT", "KILL", "TYPE", "master");
    });
    const atCut = writer.report().acked.length;
    await active.waitFor(
      "writes acknowledged by node-3 alone, node-1's write guard counting node-3 only",
      async () => {
        const snapshot = await active.snapshot();
        const members = snapshot.replicaSets["node-1"] ?? [];
        return !members.includes("node-2") && writer.report().acked.length > atCut + 30;
      },
      WAIT_MS,
    );
    const behind = await roleOf(active.node("node-2"));
    const ahead = await roleOf(active.node("node-3"));
    expect(behind.offset ?? 0).toBeLessThan(ahead.offset ?? 0);

    // Act
    active.node("node-1").signal("SIGKILL");
    const topology = await waitForNewPrimary(active, 0);
    const primaryId = topology.primary_node_id ?? "";
    // node-2 may follow the new primary now, and acknowledge its writes.
    await withClient(active.node("node-2"), (client) => client.config("SET", "masterauth", ""));
    await active.waitFor(
      `writes acknowledged by ${primaryId}`,
      () => [...writer.report().ackedBy.values()].includes(primaryId),
      WAIT_MS,
    );
    const report = await writer.stop();

    // Assess
    expect(primaryId).toBe("node-3");
    expect(report.acked.length).toBeGreaterThan(atCut + 30);
    expect(await missingKeys(active.node(primaryId), report.acked)).toEqual([]);
  });
});
