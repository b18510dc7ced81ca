import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
} from "../support/chaos-cluster.ts";
import { continuousWriter, missingKeys } from "../support/data-safety.ts";

/**
 * Issue 30's "Also" (guarantee 2's write guard, guarantee 3): a replica's redis-server dies and its
 * supervisor restarts it from a `redis.conf` that says `replicaof <another replica>` (the node that
 * was primary when the file was written). The topology is unchanged, at the replica's own epoch.
 * Before 456ef85 its agent repointed a replica only on a newer epoch, so it stayed chained behind
 * the other replica for good, outside the primary's replica set, and the primary's write guard
 * counted one replica fewer (simulator seeds 2006 and 3622; docs/agent.md "Fencing at every
 * cycle"). Now the agent repoints it to the topology's primary. Real redis-server, agents,
 * controller, DynamoDB Local and SQS.
 */

let cluster: LocalCluster | undefined;
const stops: Array<() => Promise<unknown>> = [];

afterEach(async () => {
  for (const stop of stops.splice(0)) await stop();
  await cluster?.stop();
  cluster = undefined;
});

describe("a replica whose database comes back following another replica", () => {
  it("is repointed to the topology's primary at the same epoch, and no write is lost", {
    timeout: 180_000,
  }, async () => {
    // Prepare: a healthy shard, writes acknowledged by a replica (WAIT 1).
    cluster = await startChaosCluster({ config: CHAOS_CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const before = await active.topology();
    const primaryId = before?.primary_node_id ?? "";
    const [chainedId, otherId] = active.redis.map((node) => node.id).filter((id) => id !== primaryId);
    expect(chainedId, "two replicas").toBeDefined();
    expect(otherId, "two replicas").toBeDefined();
    const writer = continuousWriter(active, primaryId, { prefix: "chained", follow: true, waitReplicas: 1 });
    stops.push(writer.stop);
    await active.waitFor("acknowledged writes", () => writer.report().acked.length > 20, WAIT_MS);

    // Act: the replica's redis dies; its supervisor restarts it following the other replica.
    const chained = active.node(chainedId ?? "");
    const other = active.node(otherId ?? "");
    chained.signal("SIGKILL");
    await chained.stop();
    await chained.start({ replicaOf: other.address, extraArgs: FENCED_START_ARGS });
    console.log(`${chainedId} restarted following ${otherId}: ROLE ${JSON.stringify(await roleOf(chained))}`);

    // Assess: it follows the primary again (heartbeat and ROLE), at the same epoch, and holds every write.
    await waitForFollowers(active, primaryId, [chainedId ?? "", otherId ?? ""]);
    const after = await active.topology();
    expect(after?.epoch).toBe(before?.epoch);
    expect(after?.primary_node_id).toBe(primaryId);
    const mark = writer.report().acked.length;
    await active.waitFor(
      "acknowledged writes after the repoint",
      () => writer.report().acked.length > mark + 20,
      WAIT_MS,
    );
    const report = await writer.stop();
    await active.waitFor(
      `${chainedId} holding every acknowledged write`,
      async () => (await missingKeys(chained, report.acked)).length === 0,
      WAIT_MS,
    );
    expect(await missingKeys(active.node(primaryId), report.acked)).toEqual([]);
  });
});
