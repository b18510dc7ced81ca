import { copyFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  roleOf,
  shortenReplicationTimeout,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";

/**
 * Simulator hunt seed 7135 (guarantee 1: 871 acknowledged writes lost), with real processes. The
 * shard went offline on lineage B, which a failover had branched from A, the lineage of the
 * primary it deposed (n1), itself promoted from P. Two nodes could bring it back at the offline
 * last resort: n1, back up on A (its own lineage, holding it to where B branched) with P as its
 * earlier one, and n3, restarted from an RDB saved on A before the failover (a new replication id,
 * A as its earlier one). `heldOffset` ranked n1 by its earlier lineage P (held up to where A
 * began) and never looked at its own: n3 ranked higher, the shard came back on n3's older RDB and
 * n1 full-synced from it, losing the writes only n1 still held. Now a node is ranked on the larger
 * of what its earlier and its own lineage hold, and the shard comes back on n1 with every key.
 *
 * Here node-2 plays n1 (switchover node-1 → node-2: A continues P), node-3 plays n3. node-2's
 * database hangs (SIGSTOP) so the failover to B leaves it on A, unsynced; the databases on B die,
 * node-2's continues and node-3's comes back from its RDB. Real redis-server, agents, a controller,
 * DynamoDB Local and SQS.
 */

const EARLY = 100;
const MID = 100;
const LATE = 200;
/** The controller's last-resort grace at the chaos timings. */
const GRACE_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs;
/** The RDB node-3 comes back from (a copy of its SAVE: later syncs may rewrite dump.rdb). */
const EARLY_RDB = "early.rdb";

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  // node-2 may be left stopped by a failed assertion: stop() continues it before its SIGTERM.
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("the offline last resort ranks a node by its own lineage too (sim hunt 7135)", () => {
  it("brings the shard back on the node holding more on its own lineage than through its earlier one, with every key", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary on lineage P; early keys everywhere. A switchover to node-2: lineage
    // A continues P (node-2's earlier lineage). Mid keys on A, on every node; node-3 saves them to
    // an RDB kept aside (A @ c, above where A began).
    cluster = await startChaosCluster();
    const active = cluster;
    const [node1, node2, node3] = ["node-1", "node-2", "node-3"].map((id) => active.node(id));
    if (!node1 || !node2 || !node3) throw new Error("three nodes expected");
    // Replicas notice a hung primary within ~2 s (Redis's own repl-timeout is 60 s).
    await shortenReplicationTimeout(active);
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, "early", EARLY, 2);

    // A refusal changes nothing ("primary node-1 is not alive": a heartbeat late on a loaded
    // host, at a 1 s failure timeout): asked again until it runs.
    let switched: Awaited<ReturnType<typeof shardguard>> | undefined;
    await active.waitFor(
      "the switchover to node-2 run",
      async () => {
        switched = await shardguard(
          active,
          "switchover",
          "--shard",
          active.shard,
          "--json",
          "--to",
          "node-2",
        );
        if (switched.code !== 0 && !switched.stdout.includes('"outcome":"refused"')) return true;
        return switched.code === 0;
      },
      WAIT_MS,
    );
    expect(switched?.code, `switchover: ${switched?.stderr}${switched?.stdout}`).toBe(0);
    await waitForFollowers(active, "node-2", ["node-1", "node-3"]);
    await waitForMembers(active, "node-2", ["node-1", "node-3"]);
    const onA = (await active.topology()) as Topology;
    expect(onA.primary_node_id).toBe("node-2");
    const lineageA = onA.ancestry?.at(-1)?.by;
    expect(lineageA, "the switchover's lineage link").toBeDefined();
    await writeKeys(node2, "mid", MID, 2);
    await withClient(node3, (client) => client.save());
    copyFileSync(join(node3.dataDir, "dump.rdb"), join(node3.dataDir, EARLY_RDB));

    // Late keys on A, acknowledged by both replicas (WAIT 2), on no disk.
    await writeKeys(node2, "late", LATE, 2);

    // Act: node-2's database hangs; the controller fails over to node-1 or node-3 (lineage B
    // continues A). Then both databases on B die (the one not promoted first): the shard goes
    // offline on B, with node-2 still on A.
    node2.signal("SIGSTOP");
    let onB: Topology | undefined;
    await active.waitFor(
      "a failover off the hung node-2",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "online" && topology.epoch > onA.epoch) onB = topology;
        return onB !== undefined;
      },
      WAIT_MS,
    );
    const lineageB = onB?.ancestry?.at(-1)?.by;
    expect(lineageB, "the failover's lineage link").toBeDefined();
    expect(lineageB).not.toBe(lineageA);
    const promoted = onB?.primary_node_id ?? "";
    expect(["node-1", "node-3"]).toContain(promoted);
    const other = promoted === "node-1" ? "node-3" : "node-1";
    // B settled before the kills: both its nodes report it (the stored lineage when offline).
    await waitForFollowers(active, promoted, [other]);
    await active.waitFor(
      "the new primary and its replica reporting lineage B",
      async () => {
        const snapshot = await active.snapshot();
        return [promoted, other].every((id) => active.heartbeatOf(snapshot, id)?.repl_id === lineageB);
      },
      WAIT_MS,
    );
    for (const id of [other, promoted]) {
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
    // Seen once under a load of 10+ (a fresh-clone CI, 2026-11-28), not reproduced since: the
    // message carries the offline mark and the shard's history to tell which path wrote it.
    expect(
      offline?.lineage?.repl_id,
      `offline on the newest lineage of the history: ${JSON.stringify(offline)}; history ${JSON.stringify(
        (await active.aws.store.history.list(active.shard, 20)).map((r) => [r.epoch, r.kind, r.reason]),
      )}`,
    ).toBe(offline?.ancestry?.at(-1)?.by);
    expect(offline?.ancestry?.map((link) => link.by)).toContain(lineageB);

    // node-2's database continues (on A, its earlier lineage P); node-3's is back from its RDB of
    // A @ c under a new replication id, fenced. Both are heard before the grace is over.
    node2.signal("SIGCONT");
    copyFileSync(join(node3.dataDir, EARLY_RDB), join(node3.dataDir, "dump.rdb"));
    await node3.start({ extraArgs: FENCED_START_ARGS });
    await active.waitFor(
      "node-2 up on A (earlier P), node-3 up on its RDB's lineage (earlier A)",
      async () => {
        const snapshot = await active.snapshot();
        const holder = active.heartbeatOf(snapshot, "node-2");
        const restored = active.heartbeatOf(snapshot, "node-3");
        return (
          holder?.db_status === "up" &&
          holder.repl_id === lineageA &&
          holder.prior_lineage !== undefined &&
          restored?.db_status === "up" &&
          restored.prior_lineage?.repl_id === lineageA
        );
      },
      WAIT_MS,
    );
    expect(await countKeys(node2, "late", LATE)).toBe(LATE);
    expect(await countKeys(node3, "mid", MID)).toBe(MID);
    expect(await countKeys(node3, "late", LATE)).toBe(0);

    // Assess: past the grace, the shard online on node-2 with every acknowledged key (the code
    // before: on node-3, node-2 full-synced from it and the late keys gone everywhere).
    let online: Topology | undefined;
    await active.waitFor(
      "the shard online again on a primary",
      async () => {
        const topology = await active.topology();
        if (topology?.status !== "online" || topology.epoch <= (offline?.epoch ?? 0)) return false;
        if ((await roleOf(active.node(topology.primary_node_id ?? ""))).role !== "master") return false;
        online = topology;
        return true;
      },
      GRACE_MS + 2 * WAIT_MS,
    );
    const records = await active.aws.store.history.list(active.shard, 100);
    const reasons = records
      .filter((record) => record.epoch > (onB?.epoch ?? 0))
      .map((record) => `${record.epoch} ${record.kind}: ${record.reason}`)
      .join("\n");
    const primary = active.node(online?.primary_node_id ?? "");
    const held = {
      primary: online?.primary_node_id,
      early: await countKeys(primary, "early", EARLY),
      mid: await countKeys(primary, "mid", MID),
      late: await countKeys(primary, "late", LATE),
    };
    console.log(`since the failover to B:\n${reasons}`);
    expect(held, reasons).toEqual({ primary: "node-2", early: EARLY, mid: MID, late: LATE });
    // Brought back by the last resort, past its grace.
    expect((online?.updated_at ?? 0) - (offline?.updated_at ?? 0)).toBeGreaterThanOrEqual(GRACE_MS);
  });
});
