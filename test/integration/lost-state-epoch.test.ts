import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  probeWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForSettled,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";

/**
 * Simulator seed 7046 (guarantee 1: 7,731 acknowledged writes lost), with real processes: a parked
 * replica whose agent restarts without its state dir, beside its primary restarted empty.
 *
 * A switchover first brings the shard to node-2 at epoch E >= 1: node-1 and node-3 follow it by
 * commands of epoch E, so their agents have applied E and report it. Keys are written on node-2 and
 * acknowledged by both replicas (`WAIT 2`). The controllers are frozen (SIGSTOP); node-2's
 * redis-server is killed (SIGKILL) and both replicas' agents park them (`REPLICAOF 127.0.0.1 1`).
 * node-3's agent is killed; node-2's redis-server is started again at the same address without its
 * data, as a supervisor starts it (fenced by its config), and its agent judges it restarted without
 * its data; then node-3's agent starts again with its state dir deleted (a machine rebuilt from its
 * image). The topology still names node-2, online, at E: no controller decided anything since.
 *
 * On the code before 13ade3a the new agent's highest epoch was 0, it took the stored topology at E
 * for a decision newer than the one node-3 was parked under, and repointed node-3 at node-2's
 * address: node-3 full-synced the empty process and its keys were gone (in the seed n1 was then
 * promoted and wiped n2). Now the agent restores its epoch from its node's own last stored report
 * (`judgeAgainstOwnReport`, src/agent/db-identity.ts): the topology is not newer, and the park
 * stays. The order is the seed's (n3 restarted empty at 439.4 s, n1's stateless agent up at
 * 462.9 s and following it at once): a stateless agent started while node-2's address has no
 * listener repoints node-3 at it on the code before too, but its probe's connection to that address
 * closes and parks it again ("primary's connection closed"), now knowing where from and at which
 * epoch, so that an empty restart after that is not followed: a variant of this test in that order
 * kept all 500 keys on 13ade3a^ (1 run); only a restart inside that moment would be.
 *
 * Then the controllers resume and must bring the shard back on a node holding every acknowledged
 * key, every node following it with every key (node-2's empty process resynced).
 */

/**
 * As in parked-superseded.test.ts: the production failure timeout, so that agents slowed by a loaded
 * machine do not look dead (a switchover refused "primary node-1 is not alive" with CHAOS_CONFIG's
 * 1 s on two cores at load ~9).
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
const PREFIX = "lost-state-epoch";
const KEYS = 500;
/** The replicas' keepalive: each reads the topology and writes its report every ~500 ms, not every 5 s. */
const REPLICA_KEEPALIVE_MS = 500;
/**
 * The new agent must write this many heartbeats while node-3 is watched. Every written heartbeat
 * follows a topology read and the verdict on it in the same cycle (heartbeat-loop.ts); the code
 * before repointed node-3 in the first cycle whose read found the topology. 4 heartbeats are at
 * least 3 cycles after the first, each judging the same stored topology (nothing changes it while
 * the controllers are frozen), so a verdict that held for them holds for every later one.
 */
const JUDGED_HEARTBEATS = 4;
/**
 * And at least this long: ten keepalive intervals, far above what a repoint and its full sync take
 * (Redis connects within its 1 s replication cron; the test nodes sync with
 * `repl-diskless-sync-delay 0`).
 */
const MIN_WATCH_MS = 5000;
const FENCED = "database restarted without its data: fenced until it follows the shard's primary";

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a parked replica whose agent restarts without its state dir, beside its primary restarted empty (simulator seed 7046)", () => {
  it("keeps the replica parked with every acknowledged key (its agent restores its epoch from its own report), and the shard comes back with every key", {
    timeout: 240_000,
  }, async () => {
    // Arrange: node-1 primary; a switchover to node-2 at epoch E, node-1 and node-3 its members.
    cluster = await startChaosCluster({
      config: CONFIG,
      readyTimeoutMs: 120_000,
      agentEnv: () => ({ [ENV.replicaKeepaliveMs]: String(REPLICA_KEEPALIVE_MS) }),
    });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    // A refused switchover changes nothing ("primary node-1 is not alive": its report older than
    // the failure timeout when the CLI read it, on a loaded machine): asked again until it completes.
    let switched = "";
    await active.waitFor(
      "a switchover to node-2 completed",
      async () => {
        const result = await shardguard(
          active,
          "switchover",
          "--shard",
          active.shard,
          "--json",
          "--to",
          "node-2",
        );
        switched = `exit ${result.code}: ${result.stderr}${result.stdout}`;
        if (result.code === 0) {
          expect(JSON.parse(result.stdout), switched).toMatchObject({
            ok: true,
            outcome: "completed",
            primary: "node-2",
          });
          return true;
        }
        expect(result.stdout, switched).toMatch(/"outcome":"refused"/);
        return false;
      },
      WAIT_MS * 2,
    );
    await waitForFollowers(active, "node-2", ["node-1", "node-3"]);
    await waitForMembers(active, "node-2", ["node-1", "node-3"]);
    const primary = active.node("node-2");
    const replica = active.node("node-3");
    const other = active.node("node-1");

    // Keys acknowledged by both replicas.
    await writeKeys(primary, PREFIX, KEYS, 2);
    const before = (await active.topology()) as Topology;
    expect(before.status).toBe("online");
    expect(before.primary_node_id).toBe("node-2");
    expect(before.epoch, "the switchover's epoch").toBeGreaterThanOrEqual(1);
    // The premise: node-3's stored report carries the epoch its agent applied, the topology's.
    await active.waitFor(
      `node-3's report at epoch ${before.epoch}`,
      async () => active.heartbeatOf(await active.snapshot(), "node-3")?.epoch === before.epoch,
      WAIT_MS,
    );
    for (const node of [replica, other])
      expect(await countKeys(node, PREFIX, KEYS), `${node.id} before the kill`).toBe(KEYS);

    // Act: the controllers frozen; node-2's redis-server killed, both replicas parked by their agents.
    for (const controller of active.controllers) controller.child.kill("SIGSTOP");
    primary.signal("SIGKILL");
    await primary.stop();
    const isParkedNow = async (node: RedisNode) => {
      const role = await roleOf(node);
      return role.role === "slave" && role.primaryPort === PARKED_PORT;
    };
    await active.waitFor(
      "node-1 and node-3 parked by their agents",
      async () => (await isParkedNow(replica)) && (await isParkedNow(other)),
      WAIT_MS,
    );

    // node-3's agent dies; node-2's redis-server comes back empty at its address (fenced by its
    // config), and its agent judges it restarted without its data.
    await active.stopAgent("node-3");
    const primaryLines = active.logLines("agent-node-2.log").length;
    primary.wipeData();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    expect(await countKeys(primary, PREFIX, KEYS), "node-2 back without its keys").toBe(0);
    await active.waitFor(
      "node-2's agent fencing its empty process",
      () =>
        active
          .logLines("agent-node-2.log")
          .slice(primaryLines)
          .some((line) => line.message === FENCED),
      WAIT_MS,
    );
    expect(await isParkedNow(replica), "node-3 still parked with no agent").toBe(true);

    // node-3's agent starts again with its state dir deleted.
    const replicaLines = active.logLines("agent-node-3.log").length;
    const restartedAt = Date.now();
    active.startAgent("node-3", { wipeStateDir: true });

    // Assess: node-3 watched until its new agent wrote JUDGED_HEARTBEATS heartbeats and for
    // MIN_WATCH_MS: it stays parked with every key (the code before left the park at the first).
    const heartbeats = new Set<number>();
    const watchStart = performance.now();
    let left: string | undefined;
    await active.waitFor(
      `node-3's new agent writing ${JUDGED_HEARTBEATS} heartbeats in ${MIN_WATCH_MS} ms, or node-3 leaving its park`,
      async () => {
        if (!(await isParkedNow(replica))) {
          const role = await roleOf(replica);
          left = `node-3 ${role.role} of port ${role.primaryPort} (${role.state}) ${Math.round(performance.now() - watchStart)} ms after its agent started`;
          return true;
        }
        const updated = active.heartbeatOf(await active.snapshot(), "node-3")?.agent_updated;
        if (updated !== undefined && updated / 1000 > restartedAt) heartbeats.add(updated);
        return heartbeats.size >= JUDGED_HEARTBEATS && performance.now() - watchStart >= MIN_WATCH_MS;
      },
      WAIT_MS,
    );
    if (left !== undefined) {
      // The code before: let the full sync from node-2's empty process finish, to show what it cost.
      await active
        .waitFor(
          "node-3 synced from node-2",
          async () => {
            const role = await roleOf(replica);
            return role.role === "slave" && role.primaryPort === primary.port && role.state === "connected";
          },
          WAIT_MS,
        )
        .catch(() => undefined);
    }
    const agentLines = active.logLines("agent-node-3.log").slice(replicaLines);
    const followed = agentLines.filter((line) => line.message === "following the topology's primary");
    const held = await countKeys(replica, PREFIX, KEYS);
    const report = active.heartbeatOf(await active.snapshot(), "node-3");
    const role = await roleOf(replica);
    console.log(
      `topology: epoch ${before.epoch} online node-2 (unchanged while frozen)\n` +
        `${left ?? `node-3 stayed parked for ${Math.round(performance.now() - watchStart)} ms, ${heartbeats.size} heartbeats of its new agent`}\n` +
        `node-3's new agent: report at epoch ${report?.epoch}; ${followed.length === 0 ? "never followed the topology's primary" : `followed: ${String(followed[0]?.reason)}`}\n` +
        `node-3: ${role.role} of port ${role.primaryPort} (${role.state}), ${held} of ${KEYS} keys`,
    );
    expect(left, "node-3 left its park").toBeUndefined();
    expect(
      followed.map((line) => line.reason),
      "node-3's new agent following node-2",
    ).toEqual([]);
    expect(held, "node-3's acknowledged keys").toBe(KEYS);
    expect(await countKeys(other, PREFIX, KEYS), "node-1's acknowledged keys").toBe(KEYS);
    expect(report?.epoch, "node-3's new agent's epoch, restored from its report").toBe(before.epoch);

    // Then: the controllers resume and bring the shard onto a node holding every acknowledged key.
    for (const controller of active.controllers) controller.child.kill("SIGCONT");
    const thawedAt = performance.now();
    let serving: Topology | undefined;
    await active.waitFor(
      "an online primary past the frozen epoch taking writes, holding every acknowledged key",
      async () => {
        const topology = await active.topology();
        if (topology?.status !== "online" || topology.epoch <= before.epoch) return false;
        const node = active.node(topology.primary_node_id ?? "");
        if (!(await probeWrite(node, `${PREFIX}:probe`)).accepted) return false;
        if ((await countKeys(node, PREFIX, KEYS)) !== KEYS) return false;
        serving = topology;
        return true;
      },
      WAIT_MS,
    );
    const servingMs = Math.round(performance.now() - thawedAt);
    // Every node follows it, node-2's empty process resynced, each with every key.
    await waitForSettled(active);
    for (const node of [other, primary, replica])
      expect(await countKeys(node, PREFIX, KEYS), `${node.id} after the thaw`).toBe(KEYS);
    console.log(
      `after the thaw: online at epoch ${serving?.epoch} on ${serving?.primary_node_id} with every key ${servingMs} ms after, every node following it ${Math.round(performance.now() - thawedAt)} ms after`,
    );
  });
});
