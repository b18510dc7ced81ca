import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  countKeys,
  linesWith,
  pauseShard,
  resumeShard,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30 (guarantee 1), simulator seed 7053 with real processes: a replica parked when its
 * primary's process died (it keeps its data until a primary known to hold it) has its own
 * database restarted from its RDB. The park is not in its `redis.conf`, so Redis comes back as a
 * master, fenced by the config. The topology still names the old primary, now restarted empty.
 * Before the fix the agent stepped the master down to that primary ("not the topology's
 * primary: becoming its replica") and the full sync from the empty process wiped it (in the seed
 * it held the last copy of 389 acknowledged writes). Now the step-down waits as the park did
 * (`staysParked`): the node stays a fenced primary holding its data until a primary known to
 * hold it or a new decision; on resume the controller replaces the empty primary.
 *
 * The shard is paused (an operator's maintenance), so the controller does not fail over while the
 * test sets the scene; the agents' own rules still run.
 */

const KEYS = 200;
/** How long node-2 must keep its data after its restart: many of the agents' 250 ms cycles. */
const HOLD_MS = 8000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a parked replica whose database restarts from its RDB as a master", () => {
  it("does not step down to a primary restarted empty, and keeps its data until the shard moves on", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary; every key on node-2 and on its disk.
    cluster = await startChaosCluster({ readyTimeoutMs: 90_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(active.node("node-1"), "kept", KEYS, 2);
    const keeper = active.node("node-2");
    await active.waitFor(
      "node-2 holding every key",
      async () => (await countKeys(keeper, "kept", KEYS)) === KEYS,
      WAIT_MS,
    );
    await withClient(keeper, (client) => client.save());
    await pauseShard(active);

    // Act: node-1's database dies (node-2 parks) and comes back empty; node-2's database dies and
    // comes back from its RDB, a master fenced by its config.
    const primary = active.node("node-1");
    primary.signal("SIGKILL");
    await primary.stop();
    await active.waitFor(
      "node-2 parked",
      async () => linesWith(active.logLines("agent-node-2.log"), /replica parked/).length > 0,
      WAIT_MS,
    );
    await primary.start({ extraArgs: FENCED_START_ARGS });
    keeper.signal("SIGKILL");
    await keeper.stop();
    await keeper.start({ extraArgs: FENCED_START_ARGS });
    const restartedAt = Date.now();

    // Assess: node-2 does not follow the empty node-1 (the code before: a replica of node-1 with
    // no key within a cycle or two) and keeps every key.
    while (Date.now() - restartedAt < HOLD_MS) {
      const role = await roleOf(keeper);
      expect(role.role, `node-2: ${JSON.stringify(role)}`).toBe("master");
      expect(await countKeys(keeper, "kept", KEYS)).toBe(KEYS);
      await new Promise((resolve) => setTimeout(resolve, 250));
    }

    // Act: the operator resumes the shard.
    await resumeShard(active);

    // Assess: the empty node-1 is replaced by a node holding every key; node-2 holds them too.
    const after = await waitForNewPrimary(active, 0);
    expect(after.primary_node_id).not.toBe("node-1");
    const promoted = active.node(after.primary_node_id ?? "");
    expect(await countKeys(promoted, "kept", KEYS)).toBe(KEYS);
    await active.waitFor(
      "node-2 holding every key, on the new primary's lineage",
      async () =>
        (await countKeys(keeper, "kept", KEYS)) === KEYS &&
        (after.primary_node_id === "node-2" || (await roleOf(keeper)).role === "slave"),
      WAIT_MS,
    );
  });
});
