import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { FENCED_START_ARGS, RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  countKeys,
  linesWith,
  pauseShard,
  resumeShard,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30 (guarantee 1), simulator seed 7032 with real processes: a replica's redis-server dies
 * and its supervisor restarts it from its RDB with a `redis.conf` whose `replicaof` names an
 * address where another database answers now (a node rebuilt, an address reused), on a lineage
 * that holds none of the replica's data. Redis connects at once; the master's full sync starts
 * after `repl-diskless-sync-delay` (Redis's default, 5 s), and then the replica flushes its
 * dataset. In the seed that replica held the shard's last writes (796 acknowledged writes lost).
 *
 * The shard is paused (an operator's maintenance), so no topology read repoints the replica: only
 * the agent's probe stands between it and the full sync. Before the fix the probe parked a replica
 * only when the process it had linked to changed, and the replica took the other dataset 5 s
 * after its start. Now a replica process its agent never pointed, following a database that does
 * not hold its data and took over from it by no recorded promotion (`syncWouldDestroy`), is parked
 * before its first sync; on resume it follows the shard's primary again, every key kept.
 */

const KEYS = 200;
/** The other database's full-sync delay: Redis's default, the window the agent parks in. */
const SYNC_DELAY_S = 5;

let cluster: LocalCluster | undefined;
let other: RedisNode | undefined;

afterEach(async (context) => {
  await other?.stop();
  other = undefined;
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a replica restarted with its config's replicaof of a database on another lineage", () => {
  it("is parked before its first sync and keeps its data, then follows the primary on resume", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary; every key on node-3 and on its disk; another database, on a
    // lineage of its own, with keys of its own.
    cluster = await startChaosCluster({ readyTimeoutMs: 90_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(active.node("node-1"), "kept", KEYS, 2);
    const replica = active.node("node-3");
    await active.waitFor(
      "node-3 holding every key",
      async () => (await countKeys(replica, "kept", KEYS)) === KEYS,
      WAIT_MS,
    );
    await withClient(replica, (client) => client.save());
    const foreign = new RedisNode(await freePort(), "other");
    other = foreign;
    await foreign.start({ extraArgs: ["--repl-diskless-sync-delay", String(SYNC_DELAY_S)] });
    await writeKeys(foreign, "other", 10, 0);
    await pauseShard(active);

    // Act: node-3's database dies and comes back from its RDB following the other database.
    replica.signal("SIGKILL");
    await replica.stop();
    await replica.start({ replicaOf: foreign.address, extraArgs: FENCED_START_ARGS });
    const startedAt = Date.now();

    // Assess: through and past the other database's sync delay node-3 holds every key and none
    // of the other's (the code before: the full sync replaced them at 5 s); its agent parked it.
    while (Date.now() - startedAt < (SYNC_DELAY_S + 3) * 1000) {
      expect(await countKeys(replica, "kept", KEYS)).toBe(KEYS);
      expect(await countKeys(replica, "other", 10)).toBe(0);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    expect(
      linesWith(
        active.logLines("agent-node-3.log"),
        /replica restarted following a process without its data/,
      ),
    ).not.toEqual([]);

    // Act: the operator resumes the shard.
    await resumeShard(active);

    // Assess: node-3 follows the primary again, with every key (not parked for good).
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    expect(await countKeys(replica, "kept", KEYS)).toBe(KEYS);
    expect(await countKeys(replica, "other", 10)).toBe(0);
  });
});
