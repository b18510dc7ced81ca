import { afterEach, describe, expect, it } from "vitest";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  linesWith,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";

/**
 * Issue 30 (guarantee 1), simulator seed 7039 with real processes: a replica on a lineage of its
 * own (its database took writes while detached, then restarted from that RDB following the
 * primary) is parked by its agent before its first sync, and its probe reports the primary
 * `restarted`: the primary does not hold the replica's data. With the other replica's agent
 * silent, that replica is the only fresh voter. Before the fix `restartedPrimary` took "1 of 1"
 * as proof that the live primary had restarted without its data and replaced it (in the seed the
 * shard went offline on the voter's lineage and came back on it: 814 acknowledged writes lost).
 * Now a primary that answers on the lineage the shard's history recorded at its promotion (a
 * switchover here) is the promoted process, data intact, whatever such a vote says.
 */

/** The production failure timeout: node-2's heartbeat stays fresh on a loaded host (at 1 s, a late one makes it stale). */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
const KEYS = 100;
const ORPHANS = 20;
/**
 * How long the shard must stay on node-2: past node-1's report turning too old to vote (its
 * keepalive plus the failure timeout) and many controller passes (200 ms) after that.
 */
const HOLD_MS = 15_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  cluster?.signalAgent("node-1", "SIGCONT");
  cluster?.signalAgent("node-3", "SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a replica on a lineage of its own voting the primary restarted", () => {
  it("does not depose a primary on the lineage recorded at its promotion", { timeout: 180_000 }, async () => {
    // Prepare: a switchover to node-2 records its lineage in the shard's history.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(active.node("node-1"), "acked", KEYS, 2);
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
    const before = (await active.topology()) as Topology;
    expect(before.primary_node_id).toBe("node-2");
    expect(before.ancestry?.at(-1)?.by, "the switchover's lineage link").toBeDefined();
    // node-2's full syncs wait Redis's default 5 s: the window node-3's agent parks it in.
    await withClient(active.node("node-2"), (client) =>
      client.config("SET", "repl-diskless-sync-delay", "5"),
    );

    // node-3, its agent stopped, leaves the shard's lineage: detached, it takes writes of its own
    // and saves them.
    const orphan = active.node("node-3");
    expect(active.signalAgent("node-3", "SIGSTOP")).toBe(true);
    await withClient(orphan, async (client) => {
      await client.call("REPLICAOF", "NO", "ONE");
      await client.config("SET", "min-replicas-to-write", "0");
    });
    await writeKeys(orphan, "orphan", ORPHANS, 0);
    await withClient(orphan, (client) => client.save());

    // Act: node-1's agent falls silent (node-3 will be the only fresh voter); node-3's database
    // restarts from that RDB following node-2, and its agent resumes.
    expect(active.signalAgent("node-1", "SIGSTOP")).toBe(true);
    orphan.signal("SIGKILL");
    await orphan.stop();
    await orphan.start({ replicaOf: active.node("node-2").address, extraArgs: FENCED_START_ARGS });
    expect(active.signalAgent("node-3", "SIGCONT")).toBe(true);
    await active.waitFor(
      "node-3 parked before its first sync",
      async () =>
        linesWith(
          active.logLines("agent-node-3.log"),
          /replica restarted following a process without its data/,
        ).length > 0,
      WAIT_MS,
    );
    const votedAt = Date.now();

    // Assess: node-2 stays the primary, at its epoch, while node-3 votes it restarted (the code
    // before: replaced within a few passes); node-3 keeps its own writes, parked.
    while (Date.now() - votedAt < HOLD_MS) {
      const topology = await active.topology();
      expect(
        topology?.primary_node_id === "node-2" &&
          topology.epoch === before.epoch &&
          topology.status === "online",
        `topology ${JSON.stringify(topology)}`,
      ).toBe(true);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    const heartbeat = active.heartbeatOf(await active.snapshot(), "node-3");
    expect(heartbeat?.primary_probe).toBe("restarted");
    expect(await countKeys(orphan, "orphan", ORPHANS)).toBe(ORPHANS);
    expect(await countKeys(active.node("node-2"), "acked", KEYS)).toBe(KEYS);
  });
});
