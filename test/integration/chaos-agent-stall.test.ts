import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/demo/local-cluster.ts";
import {
  CHAOS_CONFIG,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  type WriteProbe,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
} from "../support/chaos-cluster.ts";

/**
 * Every agent stalls at once (their path to the table fails, their host pauses) while every
 * database keeps serving. With no fresh heartbeat at all the controller marks the shard offline
 * and later brings it online with the first eligible node, which need not be the primary that
 * kept serving. Found by the soak (`npm run soak -- --stall-all-every 20000 --freeze-max 4500
 * --seed 2`: 23 acknowledged writes lost): the old primary's agent lifted its write fence as soon
 * as it saw the offline topology, took writes, and lost them when another node was brought online.
 */

let cluster: LocalCluster | undefined;
let stopWriter: (() => Promise<void>) | undefined;

afterEach(async () => {
  await stopWriter?.();
  await cluster?.stop();
  stopWriter = undefined;
  cluster = undefined;
});

/**
 * A client that keeps writing to the address it first knew, as an application with a cached
 * primary address does; it remembers every key the server acknowledged.
 */
function stubbornWriter(active: LocalCluster, id: string): { acked: string[]; stop: () => Promise<void> } {
  const acked: string[] = [];
  const client = active
    .node(id)
    .client({ maxRetriesPerRequest: 0, commandTimeout: 500, enableOfflineQueue: false });
  client.on("error", () => {});
  let running = true;
  const loop = (async () => {
    for (let seq = 0; running; seq++) {
      const key = `stubborn:${seq}`;
      try {
        await client.set(key, "v");
        acked.push(key);
      } catch {
        // Refused (NOREPLICAS, READONLY) or timed out: not acknowledged.
      }
      await delay(5);
    }
  })();
  return {
    acked,
    stop: async () => {
      running = false;
      await loop;
      client.disconnect();
    },
  };
}

describe("chaos: every agent stalls at once", () => {
  it("keeps the old primary's writes fenced while the shard is offline, and loses no acknowledged write", {
    timeout: 120_000,
  }, async () => {
    // Prepare: node-1 has priority 0 (never promoted), which holds the shard offline while only
    // its own agent is back, long enough to watch what it does with its write fence.
    cluster = await startChaosCluster({ priorities: [0, 10, 100] });
    const active = cluster;
    const writer = stubbornWriter(active, "node-1");
    stopWriter = writer.stop;
    await active.waitFor("acknowledged writes", () => writer.acked.length > 20, WAIT_MS);

    // Act
    for (const node of active.redis) active.signalAgent(node.id, "SIGSTOP");
    let offlineEpoch = 0;
    await active.waitFor(
      "the controller to mark the shard offline",
      async () => {
        const topology = await active.topology();
        offlineEpoch = topology?.epoch ?? 0;
        return topology?.status === "offline";
      },
      WAIT_MS,
    );
    active.signalAgent("node-1", "SIGCONT");
    const resumedAt = active.aws.clock.now();
    // Its agent fenced the writes (no heartbeat for longer than the fence timeout), then wrote a
    // heartbeat after reading the offline topology.
    await active.waitFor(
      "node-1's agent to write a heartbeat after its stall",
      async () =>
        (active.heartbeatOf(await active.snapshot(), "node-1")?.agent_updated ?? 0) / 1000 > resumedAt,
      WAIT_MS,
    );
    const probes: WriteProbe[] = [];
    for (let round = 0; round < 8; round++) {
      probes.push(await probeWrite(active.node("node-1"), `offline-probe:${round}`));
      await delay(CHAOS_CONFIG.heartbeatIntervalMs / 2);
    }
    const stillOffline = await active.topology();
    active.signalAgent("node-2", "SIGCONT");
    active.signalAgent("node-3", "SIGCONT");
    const after = await waitForNewPrimary(active, offlineEpoch);
    await waitForFollowers(active, "node-2", ["node-1", "node-3"]);
    await writer.stop();

    // Assess
    expect(stillOffline?.status).toBe("offline");
    for (const probe of probes) {
      expect(probe).toMatchObject({ role: "master", accepted: false });
      expect(probe.refusal).toMatch(/NOREPLICAS/);
    }
    expect(after).toMatchObject({ primary_node_id: "node-2", epoch: offlineEpoch + 1 });
    const present = await withClient(active.node("node-2"), (client) => client.mget(...writer.acked));
    const lost = writer.acked.filter((_, index) => present[index] === null);
    expect(lost, `${lost.length} of ${writer.acked.length} acknowledged writes lost`).toEqual([]);
  });
});
