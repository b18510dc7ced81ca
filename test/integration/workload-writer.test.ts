import type { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RedisNode, startRedisNodes } from "../../src/dev/local-stack/redis-nodes.ts";
import { waitForReplicasInSync } from "../../src/dev/workload/replication.ts";
import { WriteWorkload } from "../../src/dev/workload/writer.ts";
import { waitFor } from "../support/wait.ts";

let primary: RedisNode;
let replica: RedisNode;
let primaryClient: Redis;
let replicaClient: Redis;

beforeAll(async () => {
  [primary, replica] = (await startRedisNodes(2)) as [RedisNode, RedisNode];
  primaryClient = primary.client();
  replicaClient = replica.client();
});

afterAll(async () => {
  primaryClient?.disconnect();
  replicaClient?.disconnect();
  await Promise.all([primary?.destroy(), replica?.destroy()]);
});

/** Runs the writer until `until` holds; fails after `maxMs`. */
async function writeUntil(workload: WriteWorkload, until: () => boolean, maxMs = 5000): Promise<void> {
  workload.start();
  try {
    await waitFor(until, "the writer's condition", maxMs, 10);
  } finally {
    await workload.stop();
  }
}

describe("the failover writer against a real primary and replica", () => {
  it("counts writes the primary answered OK as acknowledged and finds them all on the primary", async () => {
    // Prepare
    const workload = new WriteWorkload({ resolvePrimary: async () => primary.address });

    // Act
    await writeUntil(workload, () => workload.stats().acked >= 50);
    const result = await workload.verify(primaryClient);

    // Assess
    const stats = workload.stats();
    expect(stats.acked).toBeGreaterThanOrEqual(50);
    expect(stats.failedWrites).toBe(0);
    expect(workload.acks().every((ack) => ack.address === primary.address)).toBe(true);
    expect(result).toEqual({ checked: stats.acked, lost: [], lostByAddress: {} });
  });

  it("does not count a write to a replica as acknowledged and follows the primary once it is advertised", async () => {
    // Prepare: the system advertises the replica, which the writer refuses at connect (ROLE is slave).
    let advertised = replica.address;
    const workload = new WriteWorkload({ resolvePrimary: async () => advertised });
    workload.start();
    await waitFor(
      () => workload.stats().failures["not-primary"] >= 3,
      "three writes refused on the replica",
      5000,
      10,
    );
    const refusedBeforeSwitch = workload.stats();
    const switchedAt = performance.now();

    // Act
    advertised = primary.address;
    const firstOnPrimary = await workload.waitForAckAfter(switchedAt, replica.address, 2000);
    await workload.stop();

    // Assess
    expect(refusedBeforeSwitch.acked).toBe(0);
    expect(refusedBeforeSwitch.failures["not-primary"]).toBeGreaterThan(0);
    expect(firstOnPrimary?.address).toBe(primary.address);
    expect(workload.acks().some((ack) => ack.address === replica.address)).toBe(false);
  });

  it("counts a READONLY reply as a failed write when a primary is demoted under the writer", async () => {
    // Prepare: a third node that starts as a primary, then becomes a replica while the writer holds a connection.
    const demoted = (await startRedisNodes(1))[0] as RedisNode;
    const demotedClient = demoted.client();
    const workload = new WriteWorkload({ resolvePrimary: async () => demoted.address });
    try {
      // The writer's clock when the demoted server first refused a write: replies on its connection
      // come in order, so no write may be acknowledged after it. (The instant after REPLICAOF
      // returned was no bound: a reply the server sent before it could be handled after it.)
      let firstRefusalAt: number | undefined;
      workload.on("failure", (failure) => {
        if (failure.kind === "readonly" && firstRefusalAt === undefined) firstRefusalAt = failure.at;
      });
      workload.start();
      await waitFor(() => workload.stats().acked >= 10, "ten acknowledged writes", 5000, 5);

      // Act
      await demotedClient.replicaof("127.0.0.1", String(primary.port));
      await waitFor(() => workload.stats().failures.readonly > 0, "a READONLY reply", 5000, 5);
      await workload.stop();

      // Assess
      const stats = workload.stats();
      expect(stats.failures.readonly).toBeGreaterThan(0);
      expect(firstRefusalAt).toBeDefined();
      expect(workload.firstAckAfter(firstRefusalAt as number)).toBeUndefined();
      expect(stats.acked + stats.failedWrites).toBe(stats.attempts);
    } finally {
      await workload.stop();
      demotedClient.disconnect();
      await demoted.destroy();
    }
  });

  it("reports a deliberately deleted acknowledged key as a lost write on the replica too", async () => {
    // Prepare
    const workload = new WriteWorkload({ resolvePrimary: async () => primary.address });
    await writeUntil(workload, () => workload.stats().acked >= 30);
    const victim = workload.acks()[10];
    if (!victim) throw new Error("expected at least 11 acknowledged writes");
    await primaryClient.del(workload.keyOf(victim.seq));
    await waitForReplicasInSync(primaryClient, primary.address, [replicaClient], { timeoutMs: 5000 });

    // Act
    const onPrimary = await workload.verify(primaryClient);
    const onReplica = await workload.verify(replicaClient);

    // Assess
    expect(onPrimary.lost).toEqual([victim.seq]);
    expect(onPrimary.lostByAddress).toEqual({ [primary.address]: 1 });
    expect(onReplica.lost).toEqual([victim.seq]);
  });
});
