import { afterEach, describe, expect, it } from "vitest";
import { DOWN_AHEAD_GRACE } from "../../src/core/decide/replacing.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
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
 * Nemesis seed 6803 (guarantee 1), with real processes: primary node-1's only live replica node-2
 * (node-3 dead for good) acknowledges writes (`WAIT 1`) its RDB lacks; node-2's database is killed
 * and restarted from that older RDB as a replica of node-1 (same replication id, a lower offset),
 * and node-1 hangs (SIGSTOP) right after, before node-2 could catch up.
 *
 * Before the fix the controller brought the shard back on node-2 within ~3 s (offline, then
 * `bring_online`, or a failover): node-2's heartbeat carried only its new, lower offset, and
 * `replica_down_ahead` skipped the candidate itself. node-1, the only copy of what node-2 had
 * acknowledged, was fenced and resynced from node-2 when it woke: those writes were lost. Now
 * node-2's agent reports its previous process's last answer (`restarted_behind`) until it catches
 * up, and the controller holds its promotion (`replica_down_ahead`, `replica_down_ahead_offline`)
 * for DOWN_AHEAD_GRACE failure timeouts after that answer, waiting for node-1 to return.
 */

const PREFIX = "behind";
const BEFORE = 50;
const ACKED = 40;
/** The hold the fix promises, from node-2's last answer (just before its kill). */
const GRACE_MS = DOWN_AHEAD_GRACE * CHAOS_CONFIG.failureTimeoutMs;
/**
 * How long node-1 stays hung and the controller must not promote node-2: the code before did
 * within ~3 s; well under the grace (30 s at the chaos timings), with room for a loaded host.
 */
const HUNG_MS = 12_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  // node-1 may be left stopped by a failed assertion: stop() continues it before its SIGTERM.
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a replica restarted from an RDB older than what it acknowledged, then its primary hangs", () => {
  it("does not promote it while the primary is hung, and keeps every write it acknowledged", {
    timeout: 120_000,
  }, async () => {
    expect(HUNG_MS).toBeLessThan(GRACE_MS / 2);

    // Prepare: node-1 primary, node-2 and node-3 its replicas, keys on every node; node-3 then dies
    // for good (database and agent), and node-1's guard counts node-2 alone.
    cluster = await startChaosCluster();
    const active = cluster;
    const node1 = active.node("node-1");
    const node2 = active.node("node-2");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:before`, BEFORE, 2);
    await active.stopAgent("node-3", "SIGKILL");
    active.node("node-3").signal("SIGKILL");
    await active.node("node-3").stop();
    await waitFor(
      async () => {
        const members = (await active.snapshot()).replicaSets["node-1"] ?? [];
        return (
          members.length === 1 &&
          members[0] === "node-2" &&
          (await probeWrite(node1, `${PREFIX}:probe`)).accepted
        );
      },
      "node-1's replica set down to node-2 and node-1 taking writes",
      WAIT_MS,
    );

    // node-2's RDB, saved now, lacks what it acknowledges next (the servers run with `save ""`).
    await withClient(node2, (client) => client.call("SAVE"));
    const savedAt = (await roleOf(node2)).offset ?? 0;
    await writeKeys(node1, `${PREFIX}:acked`, ACKED, 1);
    const primaryOffset = (await roleOf(node1)).offset ?? 0;
    expect(primaryOffset, "the acknowledged writes past node-2's RDB").toBeGreaterThan(savedAt);
    // node-2's agent read them: its previous process's last answer is past the RDB.
    await waitFor(
      async () => (active.heartbeatOf(await active.snapshot(), "node-2")?.last_txn_id ?? 0) >= primaryOffset,
      `node-2's agent reporting offset ${primaryOffset}`,
      WAIT_MS,
    );
    const before = await active.topology();
    expect(before?.status).toBe("online");
    expect(before?.primary_node_id).toBe("node-1");

    // Act: node-2's database dies; node-1 hangs; node-2's is back from its RDB as node-1's replica
    // (as a supervisor starts it, fenced), behind what it acknowledged and unable to catch up.
    node2.signal("SIGKILL");
    await node2.stop();
    node1.signal("SIGSTOP");
    const hungAt = Date.now();
    await node2.start({ replicaOf: node1.address, extraArgs: FENCED_START_ARGS });
    const back = await roleOf(node2);
    expect(back.role).toBe("slave");
    expect(back.offset ?? 0, "node-2 back behind what it acknowledged").toBeLessThan(primaryOffset);

    // Assess: no promotion of node-2 while node-1 is hung (the code before did within ~3 s).
    await holdsFor(
      async () => {
        const topology = await active.topology();
        const role = (await roleOf(node2)).role;
        const target = topology?.failover?.new_primary_node_id;
        if (topology?.primary_node_id !== "node-2" && target !== "node-2" && role !== "master") return true;
        throw new Error(
          `${Date.now() - hungAt} ms after node-1 hung: node-2 ${role}, topology ${topology?.status} epoch` +
            ` ${topology?.epoch} (primary ${topology?.primary_node_id}, target ${target}): ${topology?.failover?.reason}`,
        );
      },
      "no promotion of node-2 while node-1 is hung",
      HUNG_MS - (Date.now() - hungAt),
    );
    const held = active
      .controllerLogLines()
      .find(
        (line) =>
          line.code === "waiting_for_replica" &&
          String(line.reason ?? line.message).includes("node-2 (database restarted behind its last answer"),
      );
    expect(held, "the controller logged its hold for node-2's last answer").toBeDefined();
    console.log(`held: ${String(held?.reason ?? held?.message)}`);

    // Act: node-1 wakes, well inside the grace.
    node1.signal("SIGCONT");
    const wokeAt = Date.now();

    // Assess: the shard online on a writable primary holding every acknowledged write.
    const primary = await waitFor(
      async () => {
        const topology = await active.topology();
        const named = topology?.primary_node_id;
        if (topology?.status !== "online" || named === undefined) return false;
        const node = active.node(named);
        if (!(await probeWrite(node, `${PREFIX}:after`)).accepted) return false;
        return named;
      },
      "the shard online on a writable primary after node-1 woke",
      WAIT_MS,
    );
    console.log(
      `online on ${primary} ${Date.now() - wokeAt} ms after node-1 woke (hung ${wokeAt - hungAt} ms)`,
    );
    expect(await countKeys(active.node(primary), `${PREFIX}:acked`, ACKED)).toBe(ACKED);
    expect(await countKeys(active.node(primary), `${PREFIX}:before`, BEFORE)).toBe(BEFORE);
    // node-2 caught up (from node-1, or it is the primary holding them).
    await waitFor(
      async () => (await countKeys(node2, `${PREFIX}:acked`, ACKED)) === ACKED,
      "node-2 holding every write it acknowledged",
      WAIT_MS,
    );
  });
});
