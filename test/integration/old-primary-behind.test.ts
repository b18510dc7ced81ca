import { afterEach, describe, expect, it } from "vitest";
import { DOWN_AHEAD_GRACE } from "../../src/core/decide/replacing.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { FENCED_START_ARGS, RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  probeWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Nemesis seed 7214 (guarantee 1, 11 replica-acknowledged writes lost), with real processes: the
 * primary's one live replica sits outside its replica set and acknowledges writes (`WAIT 1`) the
 * primary's RDB lacks; the primary's database is killed and comes back from that RDB as a replica
 * (same replication id, behind what it last answered), and nothing reports the replica's copy (in
 * 7214 a priority-0 node whose agent a slow store kept stale; here node-4, a redis-server with no
 * agent yet). The shard goes offline (no eligible node).
 *
 * Before the fix the controller brought the shard back on the old primary itself within seconds:
 * `replica_down_ahead_offline` skipped the old primary even as the target, and no other gate sees a
 * copy nobody reports. node-4 then resynced from it and the writes were gone. Now the old primary
 * as the target counts, as any candidate back behind its own last answer does: the bring-online
 * waits up to DOWN_AHEAD_GRACE failure timeouts after that answer; an agent started on node-4 within
 * it reports the copy, which ranks, and the shard comes back holding every write.
 */

const PREFIX = "oldbehind";
const BEFORE = 50;
const ACKED = 40;
/** The hold the fix promises, from node-1's last answer (just before its kill). */
const GRACE_MS = DOWN_AHEAD_GRACE * CHAOS_CONFIG.failureTimeoutMs;
/** How long the controller must not bring the shard back on node-1: the code before did within seconds. */
const HOLD_MS = 12_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("the primary back from its RDB behind what it acknowledged, its replica's copy unreported", () => {
  it("does not bring the offline shard back on it, and keeps every write once the replica reports", {
    timeout: 180_000,
  }, async () => {
    expect(HOLD_MS).toBeLessThan(GRACE_MS / 2);

    // Prepare: node-1 primary; node-4 follows it with no agent (outside the replica set); node-2
    // and node-3 die for good, so node-1's guard counts node-4 alone.
    cluster = await startChaosCluster({ readyTimeoutMs: 90_000 });
    const active = cluster;
    const node1 = active.node("node-1");
    const node4 = new RedisNode(await freePort(), "node-4");
    active.attach(node4);
    await node4.start({ replicaOf: node1.address });
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:before`, BEFORE, 3);
    for (const id of ["node-2", "node-3"]) {
      await active.stopAgent(id, "SIGKILL");
      active.node(id).signal("SIGKILL");
      await active.node(id).stop();
    }
    await waitFor(
      async () => {
        const members = (await active.snapshot()).replicaSets["node-1"] ?? [];
        return members.length === 0 && (await probeWrite(node1, `${PREFIX}:probe`)).accepted;
      },
      "node-1's replica set empty and node-1 taking writes node-4 acknowledges",
      WAIT_MS,
    );

    // node-1's RDB, saved now, lacks what node-4 acknowledges next (the servers run with `save ""`).
    await withClient(node1, (client) => client.call("SAVE"));
    const savedAt = (await roleOf(node1)).offset ?? 0;
    await writeKeys(node1, `${PREFIX}:acked`, ACKED, 1);
    const primaryOffset = (await roleOf(node1)).offset ?? 0;
    expect(primaryOffset, "the acknowledged writes past node-1's RDB").toBeGreaterThan(savedAt);
    expect(await countKeys(node4, `${PREFIX}:acked`, ACKED)).toBe(ACKED);
    // node-1's agent read them: its database's last answer is past the RDB.
    await waitFor(
      async () => (active.heartbeatOf(await active.snapshot(), "node-1")?.last_txn_id ?? 0) >= primaryOffset,
      `node-1's agent reporting offset ${primaryOffset}`,
      WAIT_MS,
    );
    const epoch = (await active.topology())?.epoch ?? 0;

    // Act: node-1's database dies and is back from its RDB as node-4's replica (as a supervisor
    // starts it, fenced): behind what it acknowledged, and unable to catch up (node-4, its link to
    // node-1 down, refuses to feed it).
    node1.signal("SIGKILL");
    await node1.stop();
    const killedAt = Date.now();
    await node1.start({ replicaOf: node4.address, extraArgs: FENCED_START_ARGS });
    const back = await roleOf(node1);
    expect(back.role).toBe("slave");
    expect(back.offset ?? 0, "node-1 back behind what it acknowledged").toBeLessThan(primaryOffset);

    // Assess: the shard goes offline and is not brought back on node-1 (the code before did).
    await waitFor(
      async () => (await active.topology())?.status === "offline",
      "the shard offline (no eligible node)",
      WAIT_MS,
    );
    await holdsFor(
      async () => {
        const topology = await active.topology();
        const role = (await roleOf(node1)).role;
        if (topology?.status !== "online" && role !== "master") return true;
        throw new Error(
          `${Date.now() - killedAt} ms after node-1's kill: node-1 ${role}, topology ${topology?.status} epoch` +
            ` ${topology?.epoch} (primary ${topology?.primary_node_id}): ${topology?.failover?.reason ?? ""}`,
        );
      },
      "no bring-online on node-1 while node-4's copy is unreported",
      HOLD_MS,
    );
    const held = active
      .controllerLogLines()
      .find(
        (line) =>
          line.code === "waiting_for_replica" &&
          String(line.reason ?? line.message).includes("node-1 (database restarted behind its last answer"),
      );
    expect(held, "the controller logged its hold for node-1's last answer").toBeDefined();
    console.log(`held: ${String(held?.reason ?? held?.message)}`);

    // Act: an agent starts on node-4, well inside the grace; its heartbeat reports its copy.
    active.startAgent("node-4");
    const startedAt = Date.now();

    // Assess: the shard online on a writable primary holding every acknowledged write.
    const primary = await waitFor(
      async () => {
        const topology = await active.topology();
        const named = topology?.primary_node_id;
        if (topology?.status !== "online" || named === undefined || topology.epoch <= epoch) return false;
        if (!(await probeWrite(active.node(named), `${PREFIX}:after`)).accepted) return false;
        return named;
      },
      "the shard online on a writable primary after node-4's agent started",
      WAIT_MS + GRACE_MS,
    );
    console.log(`online on ${primary} ${Date.now() - startedAt} ms after node-4's agent started`);
    expect(await countKeys(active.node(primary), `${PREFIX}:acked`, ACKED)).toBe(ACKED);
    expect(await countKeys(active.node(primary), `${PREFIX}:before`, BEFORE)).toBe(BEFORE);
  });
});
