import { afterEach, describe, expect, it } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import { NetLab } from "../../src/dev/netlab/netlab.ts";
import {
  countKeys,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";

/**
 * Simulator seed 52256 (guarantee 3, a replica parked for good), with real processes: a replica's
 * database restarts from an RDB saved two changes of primary ago. Redis loads it under a new
 * replication id with the RDB's as its earlier one, and the shard's primary shows only the lineage
 * just before its own (`master_replid2`): neither shows that the primary's data continues the
 * RDB's. The shard's recorded lineage history (`topology.ancestry`, one link per change of primary)
 * does, and the replica follows the primary again. In the seed, a cut between the restarted node
 * and the primary parked it before its first sync (its agent had never seen the primary answer, so
 * "the same process" could not unpark it); the code before (no history) kept it parked for good.
 */

const KEYS = 200;

const unavailable = NetLab.unavailableReason();
if (unavailable) console.warn(`ancestor-lineage test skipped: ${unavailable}`);

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

async function switchoverTo(active: LocalCluster, to: string, others: readonly string[]): Promise<void> {
  const result = await shardguard(active, "switchover", "--shard", active.shard, "--json", "--to", to);
  expect(result.code, `switchover to ${to}: ${result.stderr}${result.stdout}`).toBe(0);
  expect(JSON.parse(result.stdout)).toMatchObject({ ok: true, outcome: "completed", primary: to });
  await waitForFollowers(active, to, others);
  await waitForMembers(active, to, others);
}

describe.runIf(unavailable === undefined)(
  "a replica restarted from an RDB saved two changes of primary ago",
  () => {
    it("follows the primary again through the shard's lineage history, and holds every key", {
      timeout: 180_000,
    }, async () => {
      // Prepare: node-1 primary (lineage A); node-3 saves an RDB of lineage A.
      cluster = await startChaosCluster({ network: "netns", readyTimeoutMs: 90_000 });
      const active = cluster;
      await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
      await waitForMembers(active, "node-1", ["node-2", "node-3"]);
      await writeKeys(active.node("node-1"), "first", KEYS, 2);
      const replica = active.node("node-3");
      await active.waitFor(
        "node-3 holding every first key",
        async () => (await countKeys(replica, "first", KEYS)) === KEYS,
        WAIT_MS,
      );
      await withClient(replica, (client) => client.call("SAVE"));

      // Two changes of primary: node-2 (lineage B, A before it), then node-1 (lineage C, B before it).
      await switchoverTo(active, "node-2", ["node-1", "node-3"]);
      await writeKeys(active.node("node-2"), "second", KEYS, 2);
      await switchoverTo(active, "node-1", ["node-2", "node-3"]);
      await writeKeys(active.node("node-1"), "third", KEYS, 2);
      const topology = await active.topology();
      expect(topology?.ancestry?.length ?? 0, "links recorded by the two switchovers").toBeGreaterThanOrEqual(
        2,
      );

      // Act: node-3's database dies and comes back from its old RDB (lineage A, as a fenced start)
      // while cut off from node-1: its agent points it at node-1, the probes go unanswered, and it
      // parks before any sync.
      await active.partition({ cuts: [{ from: "node-3", to: "node-1" }] });
      replica.signal("SIGKILL");
      await replica.stop();
      await replica.start({ extraArgs: FENCED_START_ARGS });
      await active.waitFor(
        "node-3 parked",
        async () => (await roleOf(replica)).primaryPort === PARKED_PORT,
        WAIT_MS,
      );
      expect(await countKeys(replica, "second", KEYS), "node-3 restarted with lineage A's data only").toBe(0);

      // Act: the cut heals.
      await active.heal();

      // Assess: node-3 follows node-1 again and holds every key of the three lineages.
      await waitForFollowers(active, "node-1", ["node-3"]);
      await active.waitFor(
        "node-3 holding every key after it rejoined",
        async () =>
          (await countKeys(replica, "first", KEYS)) === KEYS &&
          (await countKeys(replica, "second", KEYS)) === KEYS &&
          (await countKeys(replica, "third", KEYS)) === KEYS,
        WAIT_MS,
      );
    });
  },
);
