import { afterEach, describe, expect, it } from "vitest";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";

/**
 * The ancestor case of nemesis seeds 3103, 3105 and 3113 (guarantee 3; docs/chaos.md's known
 * limits until now): the only copy left of the shard's data is a database restarted from an RDB
 * saved before the last promotion. Redis 7 loads it under a new replication id, the RDB's as its
 * earlier one: the lineage the promotion continued, not the shard's. Nothing in any report joins the
 * two; the shard's lineage history (`topology.ancestry`) does. The code before kept the shard
 * offline, naming the node's lineage foreign, until an operator ran `shardguard recover` (30
 * minutes in seed 3105, then onto an empty node). Now the offline last resort, after its grace for
 * a node with more to return, brings it back on that node (here holding every write the stored
 * lineage knows: no write after the RDB). Real redis-server, agents, controllers.
 */

const KEYS = 300;
/** The controller's last-resort grace at the chaos timings. */
const GRACE_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("the only copy left is an RDB saved before the last promotion", () => {
  it("brings the offline shard back on it past the last resort's grace, with every key", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary (lineage A); every key on node-3, and on node-3's disk.
    cluster = await startChaosCluster();
    const active = cluster;
    // No replication PINGs: offsets move with writes only, so the RDB holds everything the later
    // lineage knows and every key can be checked on it.
    for (const node of active.redis) {
      await withClient(node, (client) => client.config("SET", "repl-ping-replica-period", "3600"));
    }
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(active.node("node-1"), "acked", KEYS, 2);
    const keeper = active.node("node-3");
    await active.waitFor(
      "node-3 holding every key",
      async () => (await countKeys(keeper, "acked", KEYS)) === KEYS,
      WAIT_MS,
    );
    await withClient(keeper, (client) => client.save());

    // A switchover to node-2: lineage B continues A (the link the controller records).
    const switched = await shardguard(
      active,
      "switchover",
      "--shard",
      active.shard,
      "--json",
      "--to",
      "node-2",
    );
    expect(switched.code, `switchover: ${switched.stderr}${switched.stdout}`).toBe(0);
    await waitForFollowers(active, "node-2", ["node-1", "node-3"]);
    const linked = (await active.topology()) as Topology;
    expect(linked.ancestry?.length ?? 0, "the switchover's lineage link").toBeGreaterThanOrEqual(1);

    // Act: every database dies (node-3's first, so it is never a candidate on lineage B); the
    // shard goes offline on B; node-3's database comes back from its RDB of lineage A, fenced.
    for (const id of ["node-3", "node-1", "node-2"]) {
      const node = active.node(id);
      node.signal("SIGKILL");
      await node.stop();
    }
    let offline: Topology | undefined;
    await active.waitFor(
      "the shard offline",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "offline") offline = topology;
        return offline !== undefined;
      },
      WAIT_MS,
    );
    expect(offline?.lineage?.repl_id, "offline on the switchover's lineage").toBe(
      linked.ancestry?.at(-1)?.by,
    );
    await keeper.start({ extraArgs: FENCED_START_ARGS });

    // Assess: past the grace, online on node-3 with every key, and writable.
    let online: Topology | undefined;
    await active.waitFor(
      "the shard online again",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "online" && topology.epoch > (offline?.epoch ?? 0)) online = topology;
        return online !== undefined;
      },
      GRACE_MS + 2 * WAIT_MS,
    );
    expect(online?.primary_node_id).toBe("node-3");
    expect((online?.updated_at ?? 0) - (offline?.updated_at ?? 0)).toBeGreaterThanOrEqual(GRACE_MS);
    expect(await countKeys(keeper, "acked", KEYS)).toBe(KEYS);
    await active.waitFor(
      "node-3 accepting writes",
      async () => (await probeWrite(keeper, "after")).accepted,
      WAIT_MS,
    );
  });
});
