import { afterEach, describe, expect, it } from "vitest";
import { type CycleResult, runShardCycle } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { awsEnv } from "../support/aws.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  describeInfo,
  describeReport,
  linesWith,
  probeWrite,
  replicationOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import {
  afterConfirmRecorded,
  cycleUntilFrozen,
  Gate,
  type TestController,
  testController,
} from "../support/frozen-controller.ts";
import { TcpProxy } from "../support/tcp-proxy.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Simulator seed 171777 (guarantee 1: 1,655 replica-acknowledged writes lost; fixed in 471f7d9,
 * `targetPromotion` in src/core/decide/retarget.ts), with real redis-server processes and agents,
 * DynamoDB Local and SQS, and an in-process controller.
 *
 * node-1 primary on lineage L, node-2 and node-3 its members. Keys SAVED are acknowledged by both
 * and both replicas SAVE (an RDB on L at point R); keys AFTER are acknowledged by both too (L to X,
 * X > R), and node-1's agent reports X (the plan's point). Each replica's agent reaches SQS through
 * its own TCP proxy (test/support/tcp-proxy.ts; DynamoDB direct), which from here resets every
 * `ReceiveMessage` (a queue that delivers nothing: the simulator's unreliable queue); the agents
 * keep heartbeating. node-1 is cut off (its agent, then its database, SIGSTOP); the replicas'
 * agents park them. A controller fails over to the target it ranks first (node-2 or node-3; the
 * other is "the holder"), plan L@X, and freezes at its first snapshot read of phase `confirm`
 * (test/support/frozen-controller.ts): its PROMOTE sits in the target's queue, never received.
 *
 * How each state is reached, and what is done by hand:
 * - The holder's replication link is cut: its `masteruser`/`masterauth` are set by hand to a user
 *   no node has, so every sync it starts fails (`WRONGPASS`) and it keeps L to X, whatever its agent
 *   points it at (in the seed n3 never resynced; with real agents the holder otherwise re-links to
 *   node-1 when it returns, or follows the plan's target, and full-syncs N). Cleared by hand once
 *   the shard is online again (the cut heals).
 * - The target's agent is stopped (SIGSTOP) so its last report stays the replica's at the epoch
 *   before, no crash report; then its redis-server is killed (SIGKILL) and started again from its
 *   RDB without `replicaof`, with the fenced config (by hand: the test plays the supervisor). Redis 7
 *   gives it a new id N continuing L from R, behind X.
 * - node-1 comes back (SIGCONT, database and agent): its real agent reads the plan's topology, which
 *   names the target, and demotes it to the target's restarted process at the plan's epoch (link
 *   up, full sync onto N; its probe remembers N's prior L@R).
 *
 * Then the frozen controller thaws (its confirm times out) and controller cycles judge the
 * unconfirmed target while its agent is stopped; the target's supervisor resumes its agent (it
 * reports its database restarted without its data) and cycles judge until the plan is left; the
 * queues deliver again and the cluster's controller process runs on.
 *
 * On the code before (471f7d9^'s retarget.ts) node-1, linked to the restarted target at the epoch
 * on N continuing L, vouched for a promotion that never happened: the retarget judged on N, found the
 * holder's L "foreign", took the shard offline (recording that N continues L up to R), brought it
 * back on node-1 ("shard offline and node-1 returned eligible") and the holder full-synced from it.
 * Now the restarted process is no promotion (the target's last report is the replica's, but N
 * branches off L at R, before the plan's point X; once its agent reports, a crash report): the
 * retarget judges on L, waits for the stopped target's agent (a member unheard), then promotes the
 * holder, and the shard is online on it with every acknowledged key.
 * Measured: with 471f7d9^'s retarget.ts 4 of 4 runs failed so (offline at epoch 2, "node-3: foreign
 * replication lineage L, expected N", online on node-1 at epoch 3 holding 100 of 100 SAVED keys and
 * 0 of the 200 AFTER keys; the holder full-synced from it: the 200 gone from every node; 29-43 s
 * per test); now 4 of 4 pass (online on node-3 at epoch 2 with every key; 44-57 s per test, the
 * cluster's start included). The target was node-2 in every run.
 * No fixed sleeps: every wait is on a condition with a deadline.
 */

const PREFIX = "restarted-target";
/** Keys in both replicas' RDBs. */
const SAVED = 100;
/** Keys acknowledged by both replicas after their RDBs: the restarted target lacks them. */
const AFTER = 200;
/** An SQS request the proxies reset: the agents' long polls for commands. */
const RECEIVE = "ReceiveMessage";
/**
 * The holder's replication credentials, set by hand: a user no node has, so every handshake it
 * starts fails (`WRONGPASS`) and it keeps L to X (its replication link cut); cleared once online.
 */
const CUT_CREDENTIALS = "cut-off";
/** As silent-target-promotion.test.ts: agents slowed by a loaded machine do not look dead mid-failover. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** The in-process controller: the cluster's timings, a lease that outlives the freeze. */
const FROZEN_CONFIG = parseFailoverConfig({ ...CONFIG, lockLeaseMs: 60_000 });
/** From the queues' return: the retarget's PROMOTE, confirm and repoint, on a loaded machine. */
const BACK_WITHIN_MS = 45_000;

let cluster: LocalCluster | undefined;
const proxies: TcpProxy[] = [];
const controllers: TestController[] = [];
const stoppedNodes: RedisNode[] = [];
const stoppedAgents: string[] = [];

afterEach(async (context) => {
  for (const node of stoppedNodes.splice(0)) if (node.running) node.signal("SIGCONT");
  for (const id of stoppedAgents.splice(0)) cluster?.signalAgent(id, "SIGCONT");
  for (const controller of controllers) controller.gate?.release();
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
  for (const proxy of proxies.splice(0)) await proxy.close();
});

/** Runs controller cycles until one is not a wait for quiet replicas' reports; returns it. */
async function cycleUntilJudged(
  controller: TestController,
  shard: string,
  log: string[],
): Promise<CycleResult> {
  return waitFor(
    async () => {
      const result = await runShardCycle(controller.deps, shard);
      log.push(`${result.outcome}@${result.epoch ?? "-"}: ${result.reason}`);
      return /quiet within their keepalive/.test(result.reason) ? undefined : result;
    },
    "the continuation's verdict",
    2 * WAIT_MS,
    200,
  );
}

describe("a failover's target restarted from its RDB as a primary before it applied PROMOTE (simulator seed 171777)", () => {
  it("is no promotion: the retarget promotes the node holding the plan's lineage, online with every acknowledged key", {
    timeout: 150_000,
  }, async () => {
    // Arrange: an SQS proxy per replica's agent; node-1 primary on L; SAVED in both replicas' RDBs,
    // AFTER acknowledged by both past them.
    const direct = awsEnv().AWS_ENDPOINT_URL_SQS;
    if (!direct) throw new Error("no AWS_ENDPOINT_URL_SQS from the global setup");
    const upstream = new URL(direct);
    const queueProxy = new Map<string, TcpProxy>();
    for (const id of ["node-2", "node-3"]) {
      const proxy = new TcpProxy(upstream.hostname, Number(upstream.port));
      await proxy.start();
      proxies.push(proxy);
      queueProxy.set(id, proxy);
    }
    cluster = await startChaosCluster({
      config: CONFIG,
      readyTimeoutMs: 90_000,
      agentEnv: (id) => {
        const proxy = queueProxy.get(id);
        return proxy ? { AWS_ENDPOINT_URL_SQS: proxy.url } : undefined;
      },
    });
    const active = cluster;
    const node1 = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:saved`, SAVED, 2);
    for (const id of ["node-2", "node-3"]) await withClient(active.node(id), (client) => client.call("SAVE"));
    await writeKeys(node1, `${PREFIX}:after`, AFTER, 2);
    const lineageL = (await replicationOf(node1)).replId;
    const pointX = (await replicationOf(node1)).offset;
    for (const process of active.controllers) await process.stop(3000);
    const before = (await active.topology()) as Topology;
    expect(before).toMatchObject({ status: "online", primary_node_id: "node-1" });
    // The replicas' queues deliver nothing from here: polls in flight are cut, new ones reset.
    for (const proxy of queueProxy.values()) {
      proxy.resetRequestsContaining(RECEIVE);
      await proxy.cut();
      await proxy.start();
    }
    const polled = new Map(
      [...queueProxy].map(([id, proxy]) => [id, proxy.requests(`AmazonSQS.${RECEIVE}`)]),
    );
    await active.waitFor(
      "both replicas' agents polling again (and reset)",
      () =>
        [...queueProxy].every(
          ([id, proxy]) => proxy.requests(`AmazonSQS.${RECEIVE}`) > (polled.get(id) ?? 0),
        ),
      WAIT_MS,
    );

    await active.waitFor(
      "node-1 reporting L to X",
      async () => {
        const report = active.heartbeatOf(await active.snapshot(), "node-1");
        return report?.repl_id === lineageL && report.last_txn_id >= pointX;
      },
      WAIT_MS,
    );

    // Act 1: node-1 cut off (agent, then database, SIGSTOP); a failover freezes in phase confirm.
    expect(active.signalAgent("node-1", "SIGSTOP")).toBe(true);
    stoppedAgents.push("node-1");
    node1.signal("SIGSTOP");
    stoppedNodes.push(node1);
    await active.waitFor(
      "node-2 and node-3 reporting their link to node-1 down",
      async () => {
        const snapshot = await active.snapshot();
        return ["node-2", "node-3"].every((id) => active.heartbeatOf(snapshot, id)?.primary_link === "down");
      },
      WAIT_MS,
    );
    const gate = new Gate(afterConfirmRecorded());
    const frozen = testController(active.env, FROZEN_CONFIG, gate);
    controllers.push(frozen);
    const frozenRun = (
      await cycleUntilFrozen(
        frozen,
        active.shard,
        "the controller to record phase confirm of a failover",
        2 * WAIT_MS,
      )
    ).run;
    const plan = (await active.topology()) as Topology;
    expect(plan).toMatchObject({ status: "failing_over", phase: "confirm", epoch: before.epoch + 1 });
    expect(frozen.sent.some((command) => command.type === "PROMOTE")).toBe(true);
    expect(plan.failover?.lineage).toMatchObject({ repl_id: lineageL, last_txn_id: pointX });
    const targetId = plan.failover?.new_primary_node_id ?? "";
    expect(["node-2", "node-3"]).toContain(targetId);
    const holderId = targetId === "node-2" ? "node-3" : "node-2";
    const target = active.node(targetId);
    const holder = active.node(holderId);

    // Act 2: the holder's replication link is cut (its credentials, by hand); the target's agent
    // stops (SIGSTOP: its last report stays a replica's at the epoch before), and its database is
    // killed and started again from its RDB without `replicaof` (by hand: the test plays the supervisor).
    await withClient(holder, async (client) => {
      await client.config("SET", "masteruser", CUT_CREDENTIALS);
      await client.config("SET", "masterauth", CUT_CREDENTIALS);
    });
    expect(active.signalAgent(targetId, "SIGSTOP")).toBe(true);
    stoppedAgents.push(targetId);
    target.signal("SIGKILL");
    await active.waitFor(`${targetId}'s redis-server gone`, () => !target.running, WAIT_MS);
    await target.start({ extraArgs: FENCED_START_ARGS });
    const restarted = await replicationOf(target);
    const lineageN = restarted.replId;
    expect(
      { role: restarted.role, newId: lineageN !== lineageL, prior: restarted.prior?.replId === lineageL },
      describeInfo(targetId, restarted),
    ).toEqual({ role: "primary", newId: true, prior: true });
    const pointR = restarted.prior?.offset ?? 0;
    expect(pointR).toBeLessThan(pointX);

    // Act 3: node-1 returns; its agent demotes it to the target's restarted process at the plan's epoch.
    node1.signal("SIGCONT");
    active.signalAgent("node-1", "SIGCONT");
    stoppedNodes.splice(0);
    stoppedAgents.splice(stoppedAgents.indexOf("node-1"), 1);
    let reports = "";
    await active.waitFor(
      `node-1 reporting N at epoch ${plan.epoch}, linked to ${targetId}; ${targetId}'s last report a replica's before`,
      async () => {
        const snapshot = await active.snapshot();
        reports = snapshot.nodes.map(describeReport).join("; ");
        const linked = active.heartbeatOf(snapshot, "node-1");
        const silent = active.heartbeatOf(snapshot, targetId);
        return (
          linked?.role === "replica" &&
          linked.epoch >= plan.epoch &&
          linked.primary_node_id === targetId &&
          linked.primary_link === "up" &&
          linked.repl_id === lineageN &&
          linked.prior_lineage?.repl_id === lineageL &&
          silent?.role === "replica" &&
          silent.db_crash === undefined &&
          silent.epoch < plan.epoch
        );
      },
      WAIT_MS,
    );
    const applied = linesWith(active.logLines(`agent-${targetId}.log`), "command applied");
    expect(applied.filter((line) => line.commandType === "PROMOTE")).toEqual([]);
    const holderInfo = describeInfo(holderId, await replicationOf(holder));
    expect(
      await countKeys(holder, `${PREFIX}:after`, AFTER),
      `${holderId} holds L to X: ${holderInfo}; ${describeInfo("node-1", await replicationOf(node1))}; ${reports}`,
    ).toBe(AFTER);

    // Act 4: the frozen controller thaws (its confirm times out) and cycles judge while the
    // target's agent is stopped; then its supervisor resumes it (it reports its database restarted
    // without its data: a crash report, or a primary once the shard left the plan) and cycles judge until the plan is left (the queues still
    // deliver nothing, so the target never applies its PROMOTE).
    gate.release();
    const thawed = await frozenRun?.then(
      (result) => `${(result as CycleResult).outcome}: ${(result as CycleResult).reason}`,
    );
    const cycles: string[] = [];
    const firstVerdict = await cycleUntilJudged(frozen, active.shard, cycles);
    expect(active.signalAgent(targetId, "SIGCONT")).toBe(true);
    stoppedAgents.splice(0);
    await active.waitFor(
      `${targetId}'s agent reporting its restarted database`,
      async () => {
        const report = active.heartbeatOf(await active.snapshot(), targetId);
        return report !== undefined && (report.db_crash !== undefined || report.role === "primary");
      },
      WAIT_MS,
    );
    cycles.push(`(${targetId}'s agent back)`);
    const verdict = await waitFor(
      async () => {
        const result = await runShardCycle(frozen.deps, active.shard);
        const topology = await active.topology();
        const now = `${topology?.epoch} ${topology?.status} ${topology?.failover?.new_primary_node_id ?? topology?.primary_node_id ?? "-"}`;
        cycles.push(`${result.outcome}@${result.epoch ?? "-"}: ${result.reason} (topology then: ${now})`);
        return (topology?.epoch ?? 0) > plan.epoch ? result : undefined;
      },
      "the continuation to leave the plan",
      2 * WAIT_MS,
      200,
    ).catch(() => firstVerdict);
    const afterVerdict = (await active.topology()) as Topology;
    // The queues deliver again; the cluster's controller runs from here.
    for (const proxy of queueProxy.values()) proxy.resetRequestsContaining(undefined);
    active.startController();

    // Assess: online on a writable primary holding every acknowledged key.
    const seen: string[] = [];
    let serving: Topology | undefined;
    let healed = false;
    await active
      .waitFor(
        "an online primary taking writes",
        async () => {
          const topology = await active.topology();
          if (topology === undefined) return false;
          const state = `${topology.epoch}:${topology.status}:${topology.phase ?? "-"}:${topology.failover?.new_primary_node_id ?? topology.primary_node_id ?? "-"}`;
          if (seen.at(-1) !== state) seen.push(state);
          if (topology.status !== "online" || topology.epoch <= plan.epoch) return false;
          if (!healed) {
            // The holder's replication link heals once the shard is online again.
            await withClient(holder, async (client) => {
              await client.config("SET", "masteruser", "");
              await client.config("SET", "masterauth", "");
            });
            healed = true;
          }
          if (!(await probeWrite(active.node(topology.primary_node_id ?? ""), `${PREFIX}:probe`)).accepted)
            return false;
          serving = topology;
          return true;
        },
        BACK_WITHIN_MS,
      )
      .catch(() => undefined);
    const infos: string[] = [];
    for (const node of active.redis) {
      infos.push(
        await replicationOf(node).then(
          (info) => describeInfo(node.id, info),
          (error: unknown) => `${node.id}: ${error instanceof Error ? error.message : String(error)}`,
        ),
      );
    }
    const afterKeys: string[] = [];
    for (const node of active.redis) {
      afterKeys.push(
        `${node.id} ${await countKeys(node, `${PREFIX}:after`, AFTER).catch(() => "?")}/${AFTER}`,
      );
    }
    const history = (await active.aws.store.history.list(active.shard, 100))
      .filter((record) => record.epoch > before.epoch)
      .map(
        (record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`,
      );
    const diagnostics =
      `L ${lineageL.slice(0, 6)} to ${pointX}; plan ${plan.failover?.lineage?.repl_id.slice(0, 6)}@${plan.failover?.lineage?.last_txn_id}; target ${targetId} restarted on N ${lineageN.slice(0, 6)} from L@${pointR}; holder ${holderId}\n` +
      `reports before the thaw: ${reports}\nthawed controller: ${thawed}\n` +
      `first verdict: ${firstVerdict.outcome}: ${firstVerdict.reason}\n` +
      `verdict: ${verdict.outcome}: ${verdict.reason} -> ${afterVerdict.epoch} ${afterVerdict.status} ${afterVerdict.failover?.new_primary_node_id ?? afterVerdict.primary_node_id ?? "-"}\n` +
      `cycles: ${cycles.join(" | ")}\ntopology after: ${seen.join(" -> ")}\nINFO replication: ${infos.join("; ")}\n` +
      `AFTER keys: ${afterKeys.join(", ")}\n` +
      `history since: ${history.join(" | ") || "none"}`;
    console.log(diagnostics);

    expect(
      serving,
      `online with a writable primary within ${BACK_WITHIN_MS} ms:\n${diagnostics}`,
    ).toBeDefined();
    const primaryId = serving?.primary_node_id ?? "";
    for (const [prefix, count] of [
      [`${PREFIX}:saved`, SAVED],
      [`${PREFIX}:after`, AFTER],
    ] as const) {
      expect(
        await countKeys(active.node(primaryId), prefix, count),
        `${primaryId}'s ${prefix} keys:\n${diagnostics}`,
      ).toBe(count);
    }
    expect(primaryId, `the holder is the primary:\n${diagnostics}`).toBe(holderId);
  });
});
