import { copyFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Heartbeat, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  describeInfo,
  describeReport,
  linesWith,
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
import {
  afterConfirmRecorded,
  cycleUntilFrozen,
  Gate,
  type TestController,
  testController,
} from "../support/frozen-controller.ts";

/**
 * Simulator seed 100696 (guarantee 3: `failing_over` to the end, no writable primary; fixed in
 * 9ed8ed8), with real redis-server processes and agents, DynamoDB Local and SQS.
 *
 * node-1 primary on lineage L, node-2 and node-3 its replicas; keys acknowledged by both
 * (`WAIT 2`). Each replica's RDB is saved (SAVE) and copied aside, then more keys are acknowledged
 * on L: the RDBs are on L, behind the promotion point. node-1 dies whole (its agent, then its
 * database, both SIGKILL: no crash report, so the failover chains the other replica behind its
 * target before PROMOTE, as in the seed where n3 followed n2 at the epoch). A controller fails over
 * to the target (node-2 or node-3, whichever it ranks first; in the seed n2), the other replica (the
 * follower) follows it, the target applies PROMOTE (a new replication id P continuing L at the
 * promotion point) and the follower takes P. That controller freezes at its first snapshot read of
 * phase `confirm` (an in-process controller behind a gate, test/support/frozen-controller.ts; the
 * seed's `controller-overlap` left its lease running), so nobody records `confirm`. Keys written to
 * the target and acknowledged by the follower (`WAIT 1`) are on P only. The target's database is
 * killed (SIGKILL) and restarted from its RDB saved on L, with `replicaof` node-1 (dead) and the
 * fenced settings on its command line, as a supervisor with that config starts it: a replica on L,
 * behind; its agent parks it. Then the controller thaws and the cluster's controller process runs
 * the cycles after it.
 *
 * On the code before the fix (9ed8ed8^ for src/) every continuation cycle found the target alive
 * and holding the lineage L further than every eligible node (the follower, on P, "foreign
 * replication lineage P, expected L"): rule `live_target_ahead`, "... alive and holds the lineage to
 * ... sending its PROMOTE again", a PROMOTE its agent ignores ("already applied"); the shard stays
 * `failing_over` with no writable primary. Now the target's promotion is read from the follower
 * (on P, its `prior_lineage` L continuing the plan's): judged on P, the follower holds the most and
 * the continuation replans to it; the shard is online on it with every acknowledged key.
 * Measured: on 9ed8ed8^ no writable primary at the deadline, 5-8 such continuations and as many
 * PROMOTEs ignored by the target's agent (4 of 4 runs); now online on the follower 16.8-21.8 s
 * after the thaw, the thawed controller's confirm timeout included (4 of 4).
 *
 * Arranged by hand: the RDB the target restarts from (a copy of its SAVE before the promotion,
 * restored before its restart) and its restart command line (`replicaof` node-1); node-1 never
 * returns (in the seed it came back and followed the target; not needed for the failure).
 * No fixed sleeps: every wait is on a condition with a deadline.
 */

const PREFIX = "undone-promotion";
/** Keys acknowledged by both replicas on L before their SAVE. */
const SAVED = 200;
/** Keys acknowledged by both replicas on L after their SAVE: past the target's RDB. */
const LATER = 100;
/** Keys written to the promoted target on P, each acknowledged by the follower (`WAIT 1`). */
const PROMOTED = 100;
/** The RDB the target comes back from (a copy of its SAVE: later syncs may rewrite dump.rdb). */
const EARLY_RDB = "early-l.rdb";
/**
 * A failure timeout of 3 s (as in promoted-target-restarted.test.ts): agents slowed by a loaded
 * machine do not look dead mid-failover, so the restarted target stays alive for every verdict.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** The in-process controller: the cluster's timings, a lease that outlives the freeze. */
const FROZEN_CONFIG = parseFailoverConfig({ ...CONFIG, lockLeaseMs: 60_000 });
/**
 * From the thaw: the thawed controller's confirm timeout (6.25 s), the continuation's rounds for a
 * live target (MAX_CONFIRM_ROUNDS confirm timeouts from the epoch bump, mostly spent in the freeze),
 * the replan, PROMOTE, the new primary's fence window and confirm, on a loaded machine.
 */
const BACK_WITHIN_MS = 60_000;

let cluster: LocalCluster | undefined;
const controllers: TestController[] = [];

afterEach(async (context) => {
  for (const controller of controllers) controller.gate?.release();
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a failover's target whose promotion was undone after it applied PROMOTE (simulator seed 100696)", () => {
  it("replans to the node holding its promoted lineage: online on it with every acknowledged key", {
    timeout: 300_000,
  }, async () => {
    // Arrange: node-1 primary on L; keys acknowledged by both replicas, their RDBs saved and kept
    // aside, then more keys acknowledged by both.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const node1 = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:saved`, SAVED, 2);
    const savedAt: Record<string, ReplicationInfo> = {};
    for (const id of ["node-2", "node-3"]) {
      const node = active.node(id);
      await withClient(node, (client) => client.call("SAVE"));
      savedAt[id] = await replicationOf(node);
      copyFileSync(join(node.dataDir, "dump.rdb"), join(node.dataDir, EARLY_RDB));
    }
    await writeKeys(node1, `${PREFIX}:later`, LATER, 2);
    const lineageL = (await replicationOf(node1)).replId;
    // The failover is the test's in-process controller's: the cluster's controller stops.
    for (const process of active.controllers) await process.stop(3000);
    const before = (await active.topology()) as Topology;
    expect(before).toMatchObject({ status: "online", primary_node_id: "node-1" });

    // The controller freezes at its first snapshot read of phase confirm: PROMOTE sent, not confirmed.
    const gate = new Gate(afterConfirmRecorded());
    const frozen = testController(active.env, FROZEN_CONFIG, gate);
    controllers.push(frozen);

    // Act 1: node-1 dies whole; the controller fails over and freezes in confirm.
    await active.stopAgent("node-1", "SIGKILL");
    node1.signal("SIGKILL");
    await node1.stop();
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
    const target = active.node(targetId);
    const follower = active.node(followerId);

    // The target applies PROMOTE (P, L as its replid2) and the follower, chained behind it, takes P.
    let lineageP = "";
    await active.waitFor(
      `${targetId} promoted on a new id continuing L, ${followerId} following it on that id`,
      async () => {
        const promoted = await replicationOf(target);
        const followed = await replicationOf(follower);
        lineageP = promoted.replId;
        return (
          promoted.role === "primary" &&
          promoted.replId !== lineageL &&
          promoted.prior?.replId === lineageL &&
          followed.role === "replica" &&
          followed.primary?.port === target.port &&
          followed.primary.link === "up" &&
          followed.replId === lineageP
        );
      },
      WAIT_MS,
    );
    const promotionPoint = (await replicationOf(target)).prior?.offset ?? 0;

    // Keys on P, acknowledged by the follower (`WAIT 1`); the target takes writes once its agent
    // lifted its fence (the old primary's guard window).
    let refused = "";
    await active
      .waitFor(
        `${targetId} taking writes acknowledged by ${followerId}`,
        async () => {
          try {
            await writeKeys(target, `${PREFIX}:promoted`, PROMOTED, 1);
            return true;
          } catch (error) {
            refused = error instanceof Error ? error.message : String(error);
            return false;
          }
        },
        WAIT_MS,
      )
      .catch((error: unknown) => {
        throw new Error(
          `${error instanceof Error ? error.message : String(error)}; last refusal: ${refused}`,
        );
      });
    const writtenOnP = (await replicationOf(target)).offset;
    expect(
      await countKeys(follower, `${PREFIX}:promoted`, PROMOTED),
      `${followerId} holds the keys on P`,
    ).toBe(PROMOTED);
    // Both agents report P at the plan's epoch (the follower's `prior_lineage` L is what the fix reads).
    await active.waitFor(
      `${targetId} and ${followerId} reporting P at epoch ${plan.epoch}`,
      async () => {
        const snapshot = await active.snapshot();
        return [targetId, followerId].every((id) => {
          const heartbeat = active.heartbeatOf(snapshot, id);
          return (
            heartbeat?.repl_id === lineageP &&
            heartbeat.epoch >= plan.epoch &&
            heartbeat.last_txn_id >= (id === targetId ? writtenOnP : 0)
          );
        });
      },
      WAIT_MS,
    );

    // Act 2: the target's database dies and comes back from its RDB on L, with `replicaof` node-1.
    target.signal("SIGKILL");
    await target.stop();
    await active.waitFor(
      `${targetId}'s agent reporting its database down`,
      async () => active.heartbeatOf(await active.snapshot(), targetId)?.db_status === "down",
      WAIT_MS,
    );
    copyFileSync(join(target.dataDir, EARLY_RDB), join(target.dataDir, "dump.rdb"));
    const restartedAt = Date.now();
    await target.start({ replicaOf: node1.address, extraArgs: FENCED_START_ARGS });
    const restarted = await replicationOf(target);
    expect(
      { role: restarted.role, replId: restarted.replId },
      `the target back as a replica on L: ${describeInfo(targetId, restarted)}`,
    ).toEqual({ role: "replica", replId: lineageL });
    expect(restarted.offset, "the target back at its RDB's offset").toBeLessThanOrEqual(
      savedAt[targetId]?.offset ?? -1,
    );
    expect(restarted.offset, "the target's RDB behind the promotion point").toBeLessThan(promotionPoint);
    // Its agent parks it and reports the restarted process; the follower stays on P.
    await active.waitFor(
      `${targetId} parked by its agent`,
      async () => (await roleOf(target)).primaryPort === PARKED_PORT,
      WAIT_MS,
    );
    let reports = "";
    await active.waitFor(
      `${targetId} reported as a replica on L, ${followerId} on P, both heard since the restart`,
      async () => {
        const snapshot = await active.snapshot();
        const [mine, theirs] = [targetId, followerId].map((id) => active.heartbeatOf(snapshot, id));
        reports = [mine, theirs].map(describeReport).join("; ");
        const heard = (node: Heartbeat | undefined) => (node?.agent_updated ?? 0) / 1000 > restartedAt;
        return (
          heard(mine) &&
          heard(theirs) &&
          mine?.db_status === "up" &&
          mine.role === "replica" &&
          mine.repl_id === lineageL &&
          theirs?.db_status === "up" &&
          theirs.repl_id === lineageP
        );
      },
      WAIT_MS,
    );
    expect(await countKeys(follower, `${PREFIX}:promoted`, PROMOTED)).toBe(PROMOTED);

    // Act 3: the controller thaws (its confirm finds no primary) and the cluster's controller runs
    // the cycles after it.
    gate.release();
    const resumedAt = performance.now();
    const thawed = await Promise.race([
      frozenRun?.then((result) => {
        const { outcome, reason } = result as { outcome?: string; reason?: string };
        return `${outcome}: ${reason}`;
      }),
      new Promise<string>((resolve) => setTimeout(() => resolve("still running"), WAIT_MS)),
    ]);
    active.startController();

    // Assess: online within BACK_WITHIN_MS on a writable primary holding P with every acknowledged
    // key (before the fix: `failing_over` for good, the same PROMOTE sent every cycle).
    const seen: string[] = [];
    let serving: Topology | undefined;
    let lastCheck = "";
    await active
      .waitFor(
        "an online primary taking writes, holding every acknowledged key",
        async () => {
          const topology = await active.topology();
          if (topology === undefined) return false;
          const state = `${topology.epoch}:${topology.status}:${topology.phase ?? "-"}:${topology.failover?.new_primary_node_id ?? topology.primary_node_id ?? "-"}`;
          if (seen.at(-1) !== state) seen.push(state);
          if (topology.status !== "online" || topology.epoch <= plan.epoch) return false;
          const node = active.node(topology.primary_node_id ?? "");
          const probe = await probeWrite(node, `${PREFIX}:probe`);
          lastCheck = `${node.id} ${probe.role}: ${probe.accepted ? "accepted" : probe.refusal}`;
          if (!probe.accepted) return false;
          serving = topology;
          return true;
        },
        BACK_WITHIN_MS,
      )
      .catch(() => undefined);
    const tookMs = Math.round(performance.now() - resumedAt);

    const infos: string[] = [];
    for (const node of [node1, target, follower]) {
      infos.push(
        await replicationOf(node).then(
          (info) => describeInfo(node.id, info),
          (error: unknown) => `${node.id}: ${error instanceof Error ? error.message : String(error)}`,
        ),
      );
    }
    const finalReports = (await active.snapshot()).nodes.map(describeReport).join("; ");
    const continuations = linesWith(active.controllerLogLines(), "continuing failover").map(
      (line) => `${line.continuation}: ${line.reason}`,
    );
    const resent = continuations.filter((line) => /alive and holds the lineage/.test(line)).length;
    const ignored = linesWith(active.logLines(`agent-${targetId}.log`), "command ignored").filter((line) =>
      /already applied/.test(String(line.reason)),
    ).length;
    const history = (await active.aws.store.history.list(active.shard, 100))
      .filter((record) => record.epoch > before.epoch)
      .map(
        (record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`,
      );
    const diagnostics =
      `L ${lineageL.slice(0, 6)}, target ${targetId} promoted to P ${lineageP.slice(0, 6)} at ${promotionPoint}, ` +
      `${PROMOTED} keys acknowledged on P (to ${writtenOnP}); ${targetId} restarted from its RDB at ` +
      `${restarted.offset} on L, parked; follower ${followerId}\n` +
      `reports before the thaw: ${reports}\nthawed controller: ${thawed}\n` +
      `topology after resuming: ${seen.join(" -> ")}; ` +
      `${serving ? `serving on ${serving.primary_node_id} ${tookMs} ms after` : `no writable primary within ${BACK_WITHIN_MS} ms (last check: ${lastCheck || "never online"})`}\n` +
      `INFO replication: ${infos.join("; ")}\nreports now: ${finalReports}\n` +
      `continuations "alive and holds the lineage ... sending its PROMOTE again": ${resent}; ` +
      `PROMOTEs ${targetId}'s agent ignored as already applied: ${ignored}\n` +
      `continuations: ${continuations.slice(0, 3).join(" | ") || "none"}${continuations.length > 3 ? ` | ... (${continuations.length})` : ""}\n` +
      `history since: ${history.join(" | ") || "none"}`;
    console.log(diagnostics);

    expect(
      serving,
      `online with a writable primary within ${BACK_WITHIN_MS} ms:\n${diagnostics}`,
    ).toBeDefined();
    const primaryId = serving?.primary_node_id ?? "";
    const primary = active.node(primaryId);
    const held = await replicationOf(primary);
    expect(
      primaryId === followerId || held.replId === lineageP || held.prior?.replId === lineageP,
      `the primary ${primaryId} holds P (${describeInfo(primaryId, held)}):\n${diagnostics}`,
    ).toBe(true);
    for (const [prefix, count] of [
      [`${PREFIX}:saved`, SAVED],
      [`${PREFIX}:later`, LATER],
      [`${PREFIX}:promoted`, PROMOTED],
    ] as const) {
      expect(await countKeys(primary, prefix, count), `${primaryId}'s ${prefix} keys:\n${diagnostics}`).toBe(
        count,
      );
    }
  });
});
