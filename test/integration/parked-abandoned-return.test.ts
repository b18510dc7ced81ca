import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import { replicatingFrom } from "../../src/agent/redis-info.ts";
import { topologyBefore } from "../../src/core/continuation.ts";
import type { FailoverState, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  countKeys,
  probeWrite,
  replicationOf,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Simulator seed 150370 (guarantee 1: 200 acknowledged writes lost), with real processes. Primary
 * node-1 saves its RDB, then takes more writes both replicas acknowledge (`WAIT 2`); its
 * redis-server is killed (SIGKILL) and started again from the older RDB, fenced by its config.
 * Both replicas' agents park them (`REPLICAOF 127.0.0.1 1`) when the connection closes, and their
 * probes find the new process at node-1's address lacking their data ("restarted"). Then a
 * failover starts (epoch E+1, `failing_over`) and is abandoned before its PROMOTE: the controller
 * writes the topology as it was before the plan under epoch E+2 (`abandon`,
 * src/controller/transitions.ts: `topologyBefore` with the epoch bumped, status `online`), naming
 * node-1 at the same address again, a return no controller judged against node-1's restart.
 *
 * No real controller path reaches that abandonment reliably (an interrupted plan resumed before
 * PROMOTE when `decide` finds nothing to do any more, or an interrupted switchover), so the test
 * writes both topology items directly in DynamoDB Local, as `startPlan` and `abandon` leave them
 * (the return built with the product's own `topologyBefore`), while the controllers are frozen
 * (SIGSTOP) from just before the kill. The abandonment's history record is not written: the agents
 * do not read it.
 *
 * On the code before 523f67f a parked replica took any newer `online` topology naming the address
 * it was parked from as a new decision: both replicas followed node-1 and full-synced its older
 * dataset, and the keys written after the SAVE were gone from every node. Now the probe remembers
 * that the process there lacks the replica's data (`lacksMyData`), and `staysParked`
 * (src/agent/fencing.ts) keeps the park. Once the replicas have been watched long enough to have
 * judged the return several times (below), the controllers resume and must bring the shard onto a
 * node holding every acknowledged key (a replica, as the controller ranks offsets).
 */

const PREFIX = "parked-abandoned-return";
/** Keys in node-1's RDB (acknowledged by both replicas). */
const SAVED = 300;
/** Keys written after the SAVE, acknowledged by both replicas: what a follow would wipe (200 in the seed). */
const LATER = 200;
/** The replicas' keepalive: each reads the topology and writes its report every ~500 ms, not every 5 s. */
const REPLICA_KEEPALIVE_MS = 500;
/**
 * Each replica's agent must write this many heartbeats after the return was stored. Every written
 * heartbeat follows a topology read and the verdict on it in the same cycle (heartbeat-loop.ts), and
 * cycles run one after another: the second one written after the store began its read after it.
 * So 4 heartbeats are at least 3 cycles that judged the return; the code before follows in the first.
 */
const JUDGED_HEARTBEATS = 4;
/** And at least this long (10 keepalive intervals): a follow and its full sync take a few ms. */
const MIN_WATCH_MS = 5000;
const FENCED = "database restarted without its data: fenced until it follows the shard's primary";

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** The address `node` replicates from (REPLICAOF), by the agent's own INFO parser; undefined for a master. */
async function replicationTarget(node: RedisNode): Promise<string | undefined> {
  return replicatingFrom(await replicationOf(node));
}

async function dbsize(node: RedisNode): Promise<number> {
  return withClient(node, async (client) => Number(await client.dbsize()));
}

describe("both replicas parked from a primary restarted from an older RDB, an abandoned failover returning the shard to it (simulator seed 150370)", () => {
  it("keeps both replicas parked with every acknowledged key: neither follows the return nor full-syncs the older dataset", {
    timeout: 240_000,
  }, async () => {
    // Arrange: node-1 primary, node-2 and node-3 linked members.
    cluster = await startChaosCluster({
      readyTimeoutMs: 120_000,
      agentEnv: (id) =>
        id === "node-1" ? undefined : { [ENV.replicaKeepaliveMs]: String(REPLICA_KEEPALIVE_MS) },
    });
    const active = cluster;
    const primary = active.node("node-1");
    const replicas = ["node-2", "node-3"].map((id) => active.node(id));
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);

    // Keys acknowledged by both replicas, node-1's RDB saved, then more keys acknowledged by both.
    await writeKeys(primary, `${PREFIX}:saved`, SAVED, 2);
    await withClient(primary, (client) => client.save());
    await writeKeys(primary, `${PREFIX}:later`, LATER, 2);
    const written = (await roleOf(primary)).offset ?? 0;
    await active.waitFor(
      "node-1's report at its offset past every key",
      async () => (active.heartbeatOf(await active.snapshot(), "node-1")?.last_txn_id ?? 0) >= written,
      WAIT_MS,
    );
    const holdsEverything = async (node: RedisNode) =>
      (await countKeys(node, `${PREFIX}:saved`, SAVED)) === SAVED &&
      (await countKeys(node, `${PREFIX}:later`, LATER)) === LATER;
    for (const node of replicas) expect(await holdsEverything(node), `${node.id} before the kill`).toBe(true);
    const before = (await active.topology()) as Topology;
    expect(before.status).toBe("online");
    expect(before.primary_node_id).toBe("node-1");

    // Act: the controllers frozen; node-1's redis-server killed, both replicas parked by their
    // agents (the connection closed), node-1 started again from the older RDB, fenced by its config.
    for (const controller of active.controllers) controller.child.kill("SIGSTOP");
    primary.signal("SIGKILL");
    await primary.stop();
    const isParkedNow = async (node: RedisNode) => {
      const role = await roleOf(node);
      return role.role === "slave" && role.primaryPort === PARKED_PORT;
    };
    await active.waitFor(
      "node-2 and node-3 parked by their agents",
      async () =>
        (await isParkedNow(replicas[0] as RedisNode)) && (await isParkedNow(replicas[1] as RedisNode)),
      WAIT_MS,
    );
    const restartedAt = Date.now();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    // The premise: node-1 back with the RDB's keys only.
    expect(await countKeys(primary, `${PREFIX}:saved`, SAVED), "node-1's RDB keys").toBe(SAVED);
    expect(await countKeys(primary, `${PREFIX}:later`, LATER), "node-1 lacks the keys after the SAVE").toBe(
      0,
    );

    // Both replicas' probes find node-1's new process lacking their data; node-1's agent fences it.
    const heardSince = (agentUpdated: number | undefined, sinceMs: number) =>
      (agentUpdated ?? 0) / 1000 > sinceMs;
    let probes = "";
    await active.waitFor(
      "both replicas' probes reporting node-1 restarted without their data, node-1's agent fencing it",
      async () => {
        const snapshot = await active.snapshot();
        const reports = ["node-2", "node-3"].map((id) => active.heartbeatOf(snapshot, id));
        probes = reports
          .map((report) => `${report?.node_id}: probe ${report?.primary_probe}, link ${report?.primary_link}`)
          .join("; ");
        return (
          reports.every(
            (report) =>
              report?.primary_probe === "restarted" && heardSince(report.agent_updated, restartedAt),
          ) && active.logLines("agent-node-1.log").some((line) => line.message === FENCED)
        );
      },
      WAIT_MS,
    );
    for (const node of replicas) {
      expect(await isParkedNow(node), `${node.id} parked`).toBe(true);
      expect(await holdsEverything(node), `${node.id} holding every key while parked`).toBe(true);
    }

    // A failover starts (E+1, failing_over, as `startPlan` writes it) ...
    const parkedAt = (await active.topology()) as Topology;
    const startedAt = Date.now();
    const plan: FailoverState = {
      kind: "failover",
      old_primary_node_id: "node-1",
      new_primary_node_id: "node-2",
      new_primary_address: (replicas[0] as RedisNode).address,
      reason: "primary node-1 restarted without its data (test: simulator seed 150370)",
      started_at: startedAt,
      candidates: [],
      phase_started: { locked: startedAt, epoch_bumped: startedAt },
    };
    const failingOver: Topology = {
      ...parkedAt,
      epoch: parkedAt.epoch + 1,
      status: "failing_over",
      phase: "epoch_bumped",
      updated_at: startedAt,
      failover: plan,
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, parkedAt.epoch, failingOver)).toBe(
      true,
    );
    const heartbeatsSince = new Map<string, Set<number>>();
    const countHeartbeats = async (sinceMs: number) => {
      const snapshot = await active.snapshot();
      for (const id of ["node-2", "node-3"]) {
        const updated = active.heartbeatOf(snapshot, id)?.agent_updated;
        if (updated === undefined || updated / 1000 <= sinceMs) continue;
        const seen = heartbeatsSince.get(id) ?? new Set<number>();
        seen.add(updated);
        heartbeatsSince.set(id, seen);
      }
      return Math.min(...["node-2", "node-3"].map((id) => heartbeatsSince.get(id)?.size ?? 0));
    };
    await active.waitFor(
      "both replicas' agents judging the failover under way",
      async () => (await countHeartbeats(startedAt)) >= 2,
      WAIT_MS,
    );
    for (const node of replicas)
      expect(await isParkedNow(node), `${node.id} parked during the failover`).toBe(true);

    // ... and is abandoned before its PROMOTE: the shard returns to node-1, at its address, under E+2.
    const returnedAt = Date.now();
    const returned: Topology = {
      ...topologyBefore(failingOver, plan, returnedAt),
      epoch: failingOver.epoch + 1,
      status: "online",
    };
    expect(returned.primary_node_id).toBe("node-1");
    expect(returned.primary_address).toBe(primary.address);
    expect(await active.aws.store.topology.compareAndSet(active.shard, failingOver.epoch, returned)).toBe(
      true,
    );

    // Assess: watched until each replica's agent has judged the return in at least 3 cycles and for
    // MIN_WATCH_MS, neither replica leaves its park (the code before followed at the first).
    heartbeatsSince.clear();
    const watchStart = performance.now();
    let left: string | undefined;
    await active.waitFor(
      `both replicas judging the return in ${JUDGED_HEARTBEATS} heartbeats and ${MIN_WATCH_MS} ms, or one leaving its park`,
      async () => {
        for (const node of replicas) {
          if (!(await isParkedNow(node))) {
            const role = await roleOf(node);
            left = `${node.id} ${role.role} of port ${role.primaryPort} (${role.state}) ${Math.round(performance.now() - watchStart)} ms after the return`;
            return true;
          }
        }
        const judged = await countHeartbeats(returnedAt);
        return judged >= JUDGED_HEARTBEATS && performance.now() - watchStart >= MIN_WATCH_MS;
      },
      WAIT_MS,
    );
    const followedReturn = (id: string) =>
      active
        .logLines(`agent-${id}.log`)
        .some(
          (line) =>
            line.message === "following the topology's primary" && line.topologyEpoch === returned.epoch,
        );
    if (left !== undefined) {
      // The code before: each replica whose agent followed the return finishes its full sync, the
      // other judges the return as long as the watch asks, to show what it cost.
      await active
        .waitFor(
          "each replica synced from the return or judging it in as many heartbeats",
          async () => {
            await countHeartbeats(returnedAt);
            for (const node of replicas) {
              if (!followedReturn(node.id)) {
                if ((heartbeatsSince.get(node.id)?.size ?? 0) < JUDGED_HEARTBEATS) return false;
                continue;
              }
              const role = await roleOf(node);
              if (role.role !== "slave" || role.primaryPort !== primary.port || role.state !== "connected")
                return false;
            }
            return true;
          },
          WAIT_MS,
        )
        .catch(() => undefined);
    }
    const states = await Promise.all(
      replicas.map(async (node) => {
        return {
          id: node.id,
          target: await replicationTarget(node),
          dbsize: await dbsize(node),
          saved: await countKeys(node, `${PREFIX}:saved`, SAVED),
          later: await countKeys(node, `${PREFIX}:later`, LATER),
        };
      }),
    );
    const agentFollowed = ["node-2", "node-3"].filter(followedReturn);
    console.log(
      `probes before the return: ${probes}\n` +
        `topology: ${before.epoch} online node-1 -> ${failingOver.epoch} failing_over -> ${returned.epoch} online node-1 (the return)\n` +
        `${left ?? `neither replica left its park in ${Math.round(performance.now() - watchStart)} ms, ${JUDGED_HEARTBEATS}+ heartbeats each`}\n` +
        `agents following the return: ${agentFollowed.join(", ") || "none"}\n` +
        states
          .map(
            (state) =>
              `${state.id}: replica of ${state.target}, DBSIZE ${state.dbsize}, saved ${state.saved}/${SAVED}, later ${state.later}/${LATER}`,
          )
          .join("; "),
    );
    // Every acknowledged key on both parked replicas, still parked (replicas of 127.0.0.1:1).
    expect(
      states.map(({ dbsize: _dbsize, ...state }) => state),
      "the replicas' replication targets and the acknowledged keys they hold",
    ).toEqual(
      replicas.map((node) => ({
        id: node.id,
        target: `127.0.0.1:${PARKED_PORT}`,
        saved: SAVED,
        later: LATER,
      })),
    );
    for (const state of states)
      expect(state.dbsize, `${state.id}'s DBSIZE`).toBeGreaterThanOrEqual(SAVED + LATER);
    expect(left, "a replica left its park for the return").toBeUndefined();
    expect(agentFollowed, "agents following the return").toEqual([]);

    // Then: the controllers resume and bring the shard onto a node holding every acknowledged key.
    for (const controller of active.controllers) controller.child.kill("SIGCONT");
    const thawedAt = performance.now();
    let serving: Topology | undefined;
    await active.waitFor(
      "an online primary after the return taking writes, holding every acknowledged key",
      async () => {
        const topology = await active.topology();
        if (topology?.status !== "online" || topology.epoch <= returned.epoch) return false;
        const node = active.node(topology.primary_node_id ?? "");
        if (!(await probeWrite(node, `${PREFIX}:probe`)).accepted) return false;
        if (!(await holdsEverything(node))) return false;
        serving = topology;
        return true;
      },
      WAIT_MS,
    );
    console.log(
      `after the thaw: online at epoch ${serving?.epoch} on ${serving?.primary_node_id}, serving every key ${Math.round(performance.now() - thawedAt)} ms after`,
    );
  });
});
