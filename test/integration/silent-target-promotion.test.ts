import { afterEach, describe, expect, it } from "vitest";
import { type CycleResult, runShardCycle } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Topology } from "../../src/core/model.ts";
import { PROMOTION_FENCE_WINDOW_MS } from "../../src/core/write-guard.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
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
 * Simulator seed 7003 on the cool-down change's schedule (guarantee 1: 64 replica-acknowledged
 * writes lost; fixed in 794f0d5, `targetPromotion` in src/core/decide/retarget.ts), with real
 * redis-server processes and agents, DynamoDB Local and SQS, and an in-process controller.
 *
 * node-1 primary on lineage L, node-2 and node-3 its members; keys acknowledged by both (`WAIT 2`).
 * node-1 is cut off: its agent, then its database, SIGSTOP (a partitioned host, no crash report,
 * so the failover chains the other replica behind its target before PROMOTE). A controller fails
 * over to the target (node-2 or node-3, whichever it ranks first; in the seed n2) and freezes at
 * its first snapshot read of phase `confirm` (test/support/frozen-controller.ts). The target's
 * agent applies PROMOTE (a new replication id P continuing L) and stops before any report of it
 * reaches the store; the follower, chained behind it, takes P and acknowledges keys written to the
 * target (`WAIT 1`). The target's last stored report is a replica's at the epoch before.
 *
 * How the agent is stopped between applying PROMOTE and reporting it: that agent writes its
 * heartbeat right after applying (src/agent/command-consumer.ts: "command applied", then a forced
 * cycle), milliseconds apart, so a SIGSTOP timed on the log line or on ROLE turning master would
 * win the race only by luck. Each replica's agent reaches DynamoDB through its own TCP proxy
 * (test/support/tcp-proxy.ts; SQS direct), set before the failover to reset any request whose body
 * reports the node as primary (the heartbeat put's marshalled `"role":{"S":"primary"}`; neither
 * replica reports so until promoted); the follower's passes everything again once the plan names
 * the target. Through the target's, the topology read that screens the PROMOTE, the snapshot of
 * the old primary's report and the replica-set write that opens its guard pass; its report as
 * primary never does.
 * Once its log says "command applied" the agent is killed (SIGKILL), so it never fences itself
 * for the failed writes; the proxy only makes that window certain. The failover starts once the
 * old primary's guard window (PROMOTION_FENCE_WINDOW_MS) has passed since the replicas' last
 * contact with it (their agents report the link down), so the target opens its writes at its
 * PROMOTE (its log's `waitMs` 0, checked) as in the seed, not on a timer of the killed agent.
 *
 * Then the frozen controller thaws (its confirm times out) and controller cycles judge the silent
 * target; node-1 comes back (SIGCONT) and cycles judge again; then the target's supervisor restarts
 * its agent (its proxy passing everything) and the cluster's controller process runs on.
 *
 * On the code before (main's retarget.ts) the continuation judged the follower "foreign replication
 * lineage P, expected L", took the shard offline, brought it back on node-1 when it returned
 * ("shard offline and node-1 returned eligible"), and both replicas full-synced from node-1: the
 * keys acknowledged on P were gone (node-1 held 0 of 100). Now the follower, linked to the silent
 * target at the plan's epoch, vouches for its promotion: the retarget judges on P, holds while the
 * target's agent is unheard (`member_unheard_retarget`); node-1 steps down to the target, the
 * restarted agent reports the promotion, and the shard is online on the target with every key.
 * Measured: with main's retarget.ts 3 of 3 runs failed so (offline at epoch 2, online on node-1 at
 * epoch 3, node-1 holding 0 of the 100 keys acknowledged on P); now 3 of 3 pass (online on node-2
 * at the plan's epoch with every key; 25.7-31.5 s per run, the cluster's start included). The
 * target's agent was killed 14-86 ms after it logged the PROMOTE applied, its report never stored.
 * No fixed sleeps: every wait is on a condition with a deadline (the guard window is one on the clock).
 */

const PREFIX = "silent-target";
/** Keys acknowledged by both replicas on L before the old primary is cut off. */
const BEFORE = 200;
/** Keys written to the promoted target on its new lineage P, each acknowledged by the follower (`WAIT 1`). */
const PROMOTED = 100;
/**
 * What a heartbeat put reporting the node as primary carries in its body (the document client's
 * marshalled item): the target's store proxy resets such a request before it reaches DynamoDB.
 */
const PRIMARY_REPORT = '"role":{"S":"primary"}';
/** As undone-promotion.test.ts: agents slowed by a loaded machine do not look dead mid-failover. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** The in-process controller: the cluster's timings, a lease that outlives the freeze. */
const FROZEN_CONFIG = parseFailoverConfig({ ...CONFIG, lockLeaseMs: 60_000 });
/** Slack on top of the old primary's guard window before the failover may promote (scheduling). */
const WINDOW_SLACK_MS = 1500;
/** From the target's agent restart: its report, the continuation's confirm, repoint, on a loaded machine. */
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
  what: string,
  log: string[],
): Promise<CycleResult> {
  return waitFor(
    async () => {
      const result = await runShardCycle(controller.deps, shard);
      log.push(`${result.outcome}@${result.epoch ?? "-"}: ${result.reason}`);
      return /quiet within their keepalive/.test(result.reason) ? undefined : result;
    },
    what,
    2 * WAIT_MS,
    200,
  );
}

describe("a failover's target whose agent stopped between applying its PROMOTE and reporting it (simulator seed 7003, cool-down schedule)", () => {
  it("keeps the writes its follower acknowledged on the promoted lineage: online on a node holding every one", {
    timeout: 180_000,
  }, async () => {
    // Arrange: a store proxy per replica's agent (its DynamoDB route; SQS direct); node-1
    // primary on L, node-2 and node-3 its members; keys acknowledged by both.
    const direct = awsEnv().AWS_ENDPOINT_URL_DYNAMODB;
    if (!direct) throw new Error("no AWS_ENDPOINT_URL_DYNAMODB from the global setup");
    const upstream = new URL(direct);
    const storeProxy = new Map<string, TcpProxy>();
    for (const id of ["node-2", "node-3"]) {
      const proxy = new TcpProxy(upstream.hostname, Number(upstream.port));
      await proxy.start();
      proxies.push(proxy);
      storeProxy.set(id, proxy);
    }
    cluster = await startChaosCluster({
      config: CONFIG,
      readyTimeoutMs: 90_000,
      agentEnv: (id) => {
        const proxy = storeProxy.get(id);
        return proxy ? { AWS_ENDPOINT_URL_DYNAMODB: proxy.url } : undefined;
      },
    });
    const active = cluster;
    const node1 = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:before`, BEFORE, 2);
    const lineageL = (await replicationOf(node1)).replId;
    // The failover is the test's in-process controller's: the cluster's controller stops.
    for (const process of active.controllers) await process.stop(3000);
    const before = (await active.topology()) as Topology;
    expect(before).toMatchObject({ status: "online", primary_node_id: "node-1" });
    // Whichever replica becomes the target, no report of it as primary reaches the store.
    for (const proxy of storeProxy.values()) proxy.resetRequestsContaining(PRIMARY_REPORT);

    // Act 1: node-1 is cut off (its agent, then its database, SIGSTOP: a partitioned host); the
    // failover begins once the old primary's guard window has passed since (the target opens its
    // writes at its PROMOTE, as in the seed), and its controller freezes in phase confirm.
    expect(active.signalAgent("node-1", "SIGSTOP")).toBe(true);
    stoppedAgents.push("node-1");
    node1.signal("SIGSTOP");
    stoppedNodes.push(node1);
    // A replica's last contact is its agent's last INFO with the link up: until its agent parks it.
    await active.waitFor(
      "node-2 and node-3 reporting their link to node-1 down",
      async () => {
        const snapshot = await active.snapshot();
        return ["node-2", "node-3"].every((id) => active.heartbeatOf(snapshot, id)?.primary_link === "down");
      },
      WAIT_MS,
    );
    const parkedAt = Date.now();
    await waitFor(
      () => Date.now() > parkedAt + PROMOTION_FENCE_WINDOW_MS + WINDOW_SLACK_MS,
      "the old primary's guard window to pass since the replicas' last contact",
      WAIT_MS,
      100,
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
    const targetId = plan.failover?.new_primary_node_id ?? "";
    expect(["node-2", "node-3"]).toContain(targetId);
    const followerId = targetId === "node-2" ? "node-3" : "node-2";
    // Only the target's reports as primary are held back.
    storeProxy.get(followerId)?.resetRequestsContaining(undefined);
    const target = active.node(targetId);
    const follower = active.node(followerId);

    // The target's agent applies PROMOTE; its report of it is reset at the proxy; the agent is
    // killed (SIGKILL) as soon as its log says the command was applied.
    const applied = await waitFor(
      () =>
        linesWith(active.logLines(`agent-${targetId}.log`), "command applied").find(
          (line) => line.commandType === "PROMOTE" && line.commandEpoch === plan.epoch,
        ),
      `${targetId}'s agent to apply PROMOTE`,
      WAIT_MS,
      20,
    );
    await active.stopAgent(targetId, "SIGKILL");
    const killedAfterMs = Date.now() - Date.parse(String(applied.timestamp));
    const promoted = linesWith(active.logLines(`agent-${targetId}.log`), /^promoted;/).at(-1);
    expect(promoted?.waitMs, `the target's writes open at its PROMOTE: ${JSON.stringify(promoted)}`).toBe(0);

    // The follower, chained behind the target before PROMOTE, follows it on its new lineage P.
    let lineageP = "";
    await active.waitFor(
      `${targetId} promoted on a new id continuing L, ${followerId} following it on that id`,
      async () => {
        const mine = await replicationOf(target);
        const theirs = await replicationOf(follower);
        lineageP = mine.replId;
        return (
          mine.role === "primary" &&
          mine.replId !== lineageL &&
          mine.prior?.replId === lineageL &&
          theirs.role === "replica" &&
          theirs.primary?.port === target.port &&
          theirs.primary.link === "up" &&
          theirs.replId === lineageP
        );
      },
      WAIT_MS,
    );
    const promotionPoint = (await replicationOf(target)).prior?.offset ?? 0;
    await writeKeys(target, `${PREFIX}:promoted`, PROMOTED, 1);
    const writtenOnP = (await replicationOf(target)).offset;
    expect(await countKeys(follower, `${PREFIX}:promoted`, PROMOTED)).toBe(PROMOTED);
    // The state the fix reads: the follower reports P at the plan's epoch, linked to the target;
    // the target's last report is a replica's at the epoch before.
    let reports = "";
    await active.waitFor(
      `${followerId} reporting P at epoch ${plan.epoch}, linked to ${targetId}`,
      async () => {
        const snapshot = await active.snapshot();
        const theirs = active.heartbeatOf(snapshot, followerId);
        reports = snapshot.nodes.map(describeReport).join("; ");
        return (
          theirs?.repl_id === lineageP &&
          theirs.epoch >= plan.epoch &&
          theirs.primary_node_id === targetId &&
          theirs.primary_link === "up" &&
          theirs.last_txn_id >= writtenOnP
        );
      },
      WAIT_MS,
    );
    const silent = active.heartbeatOf(await active.snapshot(), targetId);
    expect(
      { role: silent?.role, behind: (silent?.epoch ?? 0) < plan.epoch },
      `${targetId}'s last report: ${describeReport(silent)}`,
    ).toEqual({ role: "replica", behind: true });

    // Act 2: the frozen controller thaws (its confirm times out); the next cycles judge the
    // silent target.
    gate.release();
    const thawed = await frozenRun?.then((result) => {
      const { outcome, reason } = result as CycleResult;
      return `${outcome}: ${reason}`;
    });
    const cycles: string[] = [];
    const verdict = await cycleUntilJudged(frozen, active.shard, "the continuation's verdict", cycles);
    const afterVerdict = (await active.topology()) as Topology;

    // Act 3: the old primary comes back (SIGCONT, database then agent) and reports; the next
    // cycles judge with it.
    node1.signal("SIGCONT");
    stoppedNodes.splice(0);
    const backAt = Date.now();
    active.signalAgent("node-1", "SIGCONT");
    stoppedAgents.splice(0);
    await active.waitFor(
      "node-1's agent reporting after its return",
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-1");
        return (heartbeat?.agent_updated ?? 0) / 1000 > backAt && heartbeat?.db_status === "up";
      },
      WAIT_MS,
    );
    const second = await cycleUntilJudged(frozen, active.shard, "the verdict with node-1 back", cycles);
    const afterSecond = (await active.topology()) as Topology;

    // Act 4: the target's supervisor restarts its agent (its store route whole again); the
    // cluster's controller runs from here.
    storeProxy.get(targetId)?.resetRequestsContaining(undefined);
    active.startAgent(targetId);
    active.startController();

    // Assess: online on a writable primary holding every acknowledged key.
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
          if (topology.status !== "online" || topology.epoch < plan.epoch) return false;
          const probe = await probeWrite(active.node(topology.primary_node_id ?? ""), `${PREFIX}:probe`);
          if (!probe.accepted) return false;
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
    const history = (await active.aws.store.history.list(active.shard, 100))
      .filter((record) => record.epoch > before.epoch)
      .map(
        (record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`,
      );
    const diagnostics =
      `L ${lineageL.slice(0, 6)}; target ${targetId} promoted to P ${lineageP.slice(0, 6)} at ${promotionPoint} ` +
      `(its agent killed ${killedAfterMs} ms after applying it), ${PROMOTED} keys acknowledged by ${followerId} on P (to ${writtenOnP})\n` +
      `reports before the thaw: ${reports}\nthawed controller: ${thawed}\n` +
      `verdict: ${verdict.outcome}: ${verdict.reason} -> ${afterVerdict.epoch} ${afterVerdict.status}\n` +
      `with node-1 back: ${second.outcome}: ${second.reason} -> ${afterSecond.epoch} ${afterSecond.status} ${afterSecond.primary_node_id ?? ""}\n` +
      `cycles: ${cycles.join(" | ")}\n` +
      `topology after: ${seen.join(" -> ")}\nINFO replication: ${infos.join("; ")}\n` +
      `history since: ${history.join(" | ") || "none"}`;
    console.log(diagnostics);

    expect(
      serving,
      `online with a writable primary within ${BACK_WITHIN_MS} ms:\n${diagnostics}`,
    ).toBeDefined();
    const primaryId = serving?.primary_node_id ?? "";
    const primary = active.node(primaryId);
    for (const [prefix, count] of [
      [`${PREFIX}:before`, BEFORE],
      [`${PREFIX}:promoted`, PROMOTED],
    ] as const) {
      expect(await countKeys(primary, prefix, count), `${primaryId}'s ${prefix} keys:\n${diagnostics}`).toBe(
        count,
      );
    }
  });
});
