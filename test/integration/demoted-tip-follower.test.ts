import { afterEach, describe, expect, it } from "vitest";
import { isParked } from "../../src/agent/primary-probe.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  describeInfo,
  describeReport,
  probeWrite,
  replicationOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForNewPrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Simulator hunt seed 7064 (guarantee 1: 1,786 replica-acknowledged writes lost; fixed in 99e6c21,
 * gate `offTip` in `demotedLineage`, src/core/decide/online-view.ts), with real redis-server
 * processes and agents, DynamoDB Local, SQS and the cluster's controller process.
 *
 * node-1 primary on L0 with keys SAVED, which it SAVEs (an RDB on L0). Its database is killed
 * (SIGKILL, kept down); the controller fails over to T (node-2 or node-3, whichever it ranks
 * first; the other is H, "the holder"), whose promotion the shard's history records (the link's
 * `by`: T's new id Lt). Keys AFTER are written on T and acknowledged by H; T SAVEs (an RDB on Lt
 * holding every key). Then, the controller stopped (so that no cycle judges a half-built scene):
 * - T's agent is killed and its database too (SIGKILL both: the simulator's agent-lost-state and
 *   kill-redis in "replicaof" mode); H's agent parks H (its primary's connection closed), on Lt
 *   with every key;
 * - T's database is started from its RDB with its deployment config's `replicaof` (node-1, still
 *   down: the test plays the supervisor): a replica on Lt, link down; its agent is started with
 *   its state dir wiped and parks it (the topology still names T primary);
 * - node-1's database is started from its old RDB (the supervisor's fenced config): Redis gives it
 *   a new id N1 continuing L0, without AFTER; its real agent finds it restarted without its data
 *   and steps it down to the topology's primary T, which refuses its sync (a replica whose own
 *   link is down answers NOMASTERLINK): node-1 names T, link down, on N1.
 * Then the controller runs again and judges the demoted primary T (a replica for longer than the
 * failure timeout).
 *
 * On the code before (99e6c21^'s online-view.ts) the demoted primary's lineage was the one its
 * followers agree on: node-1's own N1, which never synced from T. H on Lt was "foreign", node-1
 * "not in T's replica set": the shard went offline, and (in the seed) came back on node-1, every
 * node full-syncing from it, the AFTER keys gone from every copy. Now the history's tip Lt, which
 * T still answers on, is the lineage: H, parked holding every write, is promoted.
 * Measured (twenty-sixth session, beside two simulator processes): with 99e6c21^'s online-view.ts
 * 4 of 4 runs failed so (offline at epoch 2, "node-3: foreign replication lineage Lt, expected
 * N1", online on node-1 at epoch 3 holding 0 of the 200 AFTER keys, node-3 full-synced from it:
 * 0 of 200; node-2 still parked with them); now 4 of 4 pass (online on node-3 at epoch 2 with every
 * key; 15-22 s per test). T was node-2 in every run.
 * No fixed sleeps: every wait is on a condition with a deadline.
 */

const PREFIX = "demoted-tip";
/** Keys in node-1's RDB. */
const SAVED = 100;
/** Keys written on T after node-1's crash, acknowledged by H, in T's RDB: node-1's lacks them. */
const AFTER = 200;
/** Agents slowed by a loaded machine do not look dead mid-failover (as in restarted-target-not-promoted). */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** From the controller's return: the demoted grace, the failover's PROMOTE and repoints, loaded. */
const BACK_WITHIN_MS = 60_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a demoted primary on the tip of the shard's history, followed only by a node that never synced from it (simulator seed 7064)", () => {
  it("is judged by the tip: the parked replica holding every acknowledged key is promoted", {
    timeout: 180_000,
  }, async () => {
    // Arrange: node-1 primary on L0 with SAVED in its RDB; crashed; T promoted, AFTER acknowledged by H.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const node1 = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:saved`, SAVED, 2);
    await withClient(node1, (client) => client.call("SAVE"));
    const lineage0 = (await replicationOf(node1)).replId;
    const first = (await active.topology()) as Topology;

    node1.signal("SIGKILL");
    await active.waitFor("node-1's redis-server gone", () => !node1.running, WAIT_MS);
    const promoted = await waitForNewPrimary(active, first.epoch);
    const targetId = promoted.primary_node_id ?? "";
    expect(["node-2", "node-3"]).toContain(targetId);
    const holderId = targetId === "node-2" ? "node-3" : "node-2";
    const target = active.node(targetId);
    const holder = active.node(holderId);
    await waitForFollowers(active, targetId, [holderId]);
    await waitForMembers(active, targetId, [holderId]);
    await writeKeys(target, `${PREFIX}:after`, AFTER, 1);
    await withClient(target, (client) => client.call("SAVE"));
    const tip = await replicationOf(target);
    const lineageT = tip.replId;
    expect(tip.prior?.replId, describeInfo(targetId, tip)).toBe(lineage0);
    const recorded = (await active.topology()) as Topology;
    expect(recorded.ancestry?.at(-1)?.by, "the history's tip is T's promotion").toBe(lineageT);

    // Act 1: the controller stops; T's agent and database die; H's agent parks H on Lt.
    for (const process of active.controllers) await process.stop(3000);
    await active.stopAgent(targetId, "SIGKILL");
    target.signal("SIGKILL");
    await active.waitFor(`${targetId}'s redis-server gone`, () => !target.running, WAIT_MS);
    await active.waitFor(
      `${holderId} parked on Lt`,
      async () => {
        const info = await replicationOf(holder);
        return isParked(info) && info.replId === lineageT;
      },
      WAIT_MS,
    );

    // Act 2: T's supervisor starts its database from its RDB with the config's replicaof (node-1,
    // still down) and its agent with a wiped state dir; the agent parks it.
    await target.start({ replicaOf: node1.address, extraArgs: FENCED_START_ARGS });
    const restarted = await replicationOf(target);
    expect({ role: restarted.role, replId: restarted.replId }, describeInfo(targetId, restarted)).toEqual({
      role: "replica",
      replId: lineageT,
    });
    active.startAgent(targetId, { wipeStateDir: true });
    await active.waitFor(
      `${targetId} parked by its new agent, reporting a replica on Lt`,
      async () => {
        if (!isParked(await replicationOf(target))) return false;
        const report = active.heartbeatOf(await active.snapshot(), targetId);
        return report?.role === "replica" && report.repl_id === lineageT;
      },
      WAIT_MS,
    );

    // Act 3: node-1's supervisor starts its database from the old RDB; its agent steps it down to
    // T, which refuses the sync (NOMASTERLINK): node-1 names T, link down, on its new id N1.
    await node1.start({ extraArgs: FENCED_START_ARGS });
    let reports = "";
    await active.waitFor(
      `node-1 following ${targetId} on a new id, link down`,
      async () => {
        const snapshot = await active.snapshot();
        reports = snapshot.nodes.map(describeReport).join("; ");
        const report = active.heartbeatOf(snapshot, "node-1");
        return (
          report?.role === "replica" &&
          report.primary_node_id === targetId &&
          report.primary_link === "down" &&
          report.repl_id !== lineageT &&
          report.repl_id !== lineage0
        );
      },
      WAIT_MS,
    );
    const node1Info = await replicationOf(node1);
    expect(node1Info.prior?.replId, describeInfo("node-1", node1Info)).toBe(lineage0);
    expect(await countKeys(node1, `${PREFIX}:after`, AFTER), "node-1's RDB predates AFTER").toBe(0);
    const holderInfo = await replicationOf(holder);
    expect(
      {
        parked: isParked(holderInfo),
        replId: holderInfo.replId,
        after: await countKeys(holder, `${PREFIX}:after`, AFTER),
      },
      `${describeInfo(holderId, holderInfo)}; ${reports}`,
    ).toEqual({ parked: true, replId: lineageT, after: AFTER });

    // Act 4: the controller runs again.
    active.startController();

    // Assess: online at a later epoch on a writable primary holding every acknowledged key.
    const seen: string[] = [];
    let serving: Topology | undefined;
    await active
      .waitFor(
        "an online primary taking writes",
        async () => {
          const topology = await active.topology();
          if (topology === undefined) return false;
          const state = `${topology.epoch}:${topology.status}:${topology.phase ?? "-"}:${topology.failover?.new_primary_node_id ?? topology.primary_node_id ?? "-"}`;
          if (seen.at(-1) !== state) seen.push(state);
          if (topology.status !== "online" || topology.epoch <= recorded.epoch) return false;
          if (!(await probeWrite(active.node(topology.primary_node_id ?? ""), `${PREFIX}:probe`)).accepted)
            return false;
          serving = topology;
          return true;
        },
        BACK_WITHIN_MS,
      )
      .catch(() => undefined);
    const infos: string[] = [];
    const afterKeys: string[] = [];
    for (const node of active.redis) {
      infos.push(
        await replicationOf(node).then(
          (info) => describeInfo(node.id, info),
          (error: unknown) => `${node.id}: ${error instanceof Error ? error.message : String(error)}`,
        ),
      );
      afterKeys.push(
        `${node.id} ${await countKeys(node, `${PREFIX}:after`, AFTER).catch(() => "?")}/${AFTER}`,
      );
    }
    const history = (await active.aws.store.history.list(active.shard, 100))
      .filter((record) => record.epoch > recorded.epoch)
      .map(
        (record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`,
      );
    const diagnostics =
      `L0 ${lineage0.slice(0, 6)}; T ${targetId} on Lt ${lineageT.slice(0, 6)}; holder ${holderId}\n` +
      `reports before the controller's return: ${reports}\n` +
      `topology after: ${seen.join(" -> ")}\nINFO replication: ${infos.join("; ")}\n` +
      `AFTER keys: ${afterKeys.join(", ")}\nhistory since: ${history.join(" | ") || "none"}`;
    console.log(diagnostics);

    expect(
      serving,
      `online with a writable primary within ${BACK_WITHIN_MS} ms:\n${diagnostics}`,
    ).toBeDefined();
    const primaryId = serving?.primary_node_id ?? "";
    expect(primaryId, `the holder is the primary:\n${diagnostics}`).toBe(holderId);
    for (const [prefix, count] of [
      [`${PREFIX}:saved`, SAVED],
      [`${PREFIX}:after`, AFTER],
    ] as const) {
      expect(
        await countKeys(active.node(primaryId), prefix, count),
        `${primaryId}'s ${prefix} keys:\n${diagnostics}`,
      ).toBe(count);
    }
  });
});
