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
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * The nemesis's seed 3104 (docs/chaos.md): every node's database died; the primary's came back
 * from its own RDB, which Redis 7 loads under a new replication id (the old one as
 * `master_replid2`). Its agent rightly keeps it fenced (it does not continue the lineage the
 * replicas may hold more of), but it is the only copy left: after a grace for a node with more of
 * the lineage to return (LAST_COPY_GRACE failure timeouts), the controller must bring the shard
 * back on it, not wait for an operator for ever. Real redis-server, agents and controllers.
 */

const KEYS = 300;
/** The controller's last-resort grace at the chaos timings. */
const GRACE_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs;

let cluster: LocalCluster | undefined;

afterEach(async () => {
  await cluster?.stop();
  cluster = undefined;
});

describe("a primary restarted from its RDB when no other copy is left", () => {
  it("brings the offline shard back on it with the RDB's data, then resyncs a node restarted empty from it", {
    timeout: 150_000,
  }, async () => {
    // Prepare: keys on every node, and on the primary's disk.
    cluster = await startChaosCluster();
    const active = cluster;
    const primary = active.node("node-1");
    await writeKeys(primary, "acked", KEYS, 2);
    await withClient(primary, (client) => client.save());

    // Act: every database dies; the shard goes offline; node-1's is back from its RDB, fenced.
    for (const node of active.redis) node.signal("SIGKILL");
    await Promise.all(active.redis.map((node) => node.stop()));
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
    await primary.start({ extraArgs: FENCED_START_ARGS });

    // Assess: the last resort waits its grace, then online on node-1, every key there, writable.
    let online: Topology | undefined;
    await active.waitFor(
      "the shard online again",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "online" && topology.epoch > (offline?.epoch ?? 0)) online = topology;
        return online !== undefined;
      },
      GRACE_MS + WAIT_MS,
    );
    expect(online?.primary_node_id).toBe("node-1");
    // Both stamps are the controller's (AWS-aligned) clock: the grace was kept.
    expect((online?.updated_at ?? 0) - (offline?.updated_at ?? 0)).toBeGreaterThanOrEqual(GRACE_MS);
    expect(await countKeys(primary, "acked", KEYS)).toBe(KEYS);
    await active.waitFor(
      "node-1 accepting writes",
      async () => (await probeWrite(primary, "after")).accepted,
      WAIT_MS,
    );

    // Act: node-2's database is back empty; its agent repoints it at node-1.
    const empty = active.node("node-2");
    empty.wipeData();
    await empty.start({ extraArgs: FENCED_START_ARGS });

    // Assess
    await waitForFollowers(active, "node-1", ["node-2"]);
    await active.waitFor(
      "node-2 holding every key after its full sync",
      async () => (await countKeys(empty, "acked", KEYS)) === KEYS,
      WAIT_MS,
    );
  });
});

describe("a primary restarted from its RDB while every node answers", () => {
  it("brings the offline shard back at once, not after the last resort's grace (simulator seed 45033)", {
    timeout: 150_000,
  }, async () => {
    // Prepare: keys on every node; a cool-down holds the controller, as after the failover of seed
    // 45033 (the primary died inside it).
    cluster = await startChaosCluster();
    const active = cluster;
    const primary = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(primary, "acked", KEYS, 2);
    const online = (await active.topology()) as Topology;
    expect(
      await active.aws.store.topology.compareAndSet(active.shard, online.epoch, {
        ...online,
        cooldown_until: Date.now() + 10 * GRACE_MS,
      }),
    ).toBe(true);
    const before = active.heartbeatOf(await active.snapshot(), "node-1");
    const lineage = {
      node_id: "node-1",
      repl_id: before?.repl_id ?? "",
      last_txn_id: before?.last_txn_id ?? 0,
    };

    // Act: node-1's database dies and comes back from its RDB (a new replication id, the old one as
    // replid2); its replicas unpark and resync onto the new run. Then the shard is marked offline,
    // as the controller did in seed 45033 when its read caught node-1's heartbeat before its agent
    // reported the restart.
    await withClient(primary, (client) => client.save());
    primary.signal("SIGKILL");
    await primary.stop();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    await active.waitFor(
      "node-2 and node-3 following node-1's new run, every agent heard",
      async () => {
        const snapshot = await active.snapshot();
        const restarted = active.heartbeatOf(snapshot, "node-1");
        if (restarted?.repl_id === undefined || restarted.repl_id === lineage.repl_id) return false;
        return ["node-2", "node-3"].every((id) => {
          const node = active.heartbeatOf(snapshot, id);
          return node?.primary_link === "up" && node.repl_id === restarted.repl_id;
        });
      },
      WAIT_MS,
    );
    const current = (await active.topology()) as Topology;
    const offlineAt = Date.now();
    expect(
      await active.aws.store.topology.compareAndSet(active.shard, current.epoch, {
        shard: active.shard,
        epoch: current.epoch + 1,
        status: "offline",
        updated_at: offlineAt,
        lineage,
      }),
    ).toBe(true);

    // Assess: every node alive and heard, none can return with more: online well inside the grace
    // (the code before waited all of it), with every key.
    let back: Topology | undefined;
    await active.waitFor(
      "the shard online again",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "online" && topology.epoch > current.epoch + 1) back = topology;
        return back !== undefined;
      },
      GRACE_MS + WAIT_MS,
    );
    const tookMs = (back?.updated_at ?? 0) - offlineAt;
    console.log(`offline -> online on ${back?.primary_node_id} in ${tookMs} ms (grace ${GRACE_MS} ms)`);
    expect(tookMs).toBeLessThan(GRACE_MS / 3);
    expect(await countKeys(active.node(back?.primary_node_id ?? "node-1"), "acked", KEYS)).toBe(KEYS);
  });
});
