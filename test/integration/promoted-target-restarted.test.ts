import { afterEach, describe, expect, it } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { Heartbeat, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  describeReport,
  linesWith,
  probeWrite,
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
 * Simulator seed 72080 (guarantee 3: offline for good, every replica-acknowledged write held by a
 * parked replica), with real redis-server processes and agents, DynamoDB Local and SQS.
 *
 * node-1 primary on lineage L, node-2 and node-3 acknowledge every key (`WAIT 1`). node-1's
 * database dies; a controller fails over to the target (node-2 or node-3, whichever it ranks first)
 * and the target applies PROMOTE: a new replication id M, L kept as its `master_replid2` up to the
 * promotion point. The controller then freezes in phase `confirm` before it confirms (an in-process
 * controller held at its first snapshot read of that phase, as a GC pause or a preempted host holds
 * one). The other replica, the keeper, never completes a sync from the target (the test has the
 * target refuse PSYNC and SYNC: in the seed no sync completed either): it stays on L at the
 * promotion point. The target takes a few writes of its own (no replica); its database is killed
 * and comes back empty (fenced), node-1's too; then the controller thaws and the cluster's
 * controller process runs the cycles after it.
 *
 * The continuation finds the target not alive after PROMOTE and, nothing else eligible on the
 * target's new lineage M, takes the shard offline on M. The shard's history (`topology.ancestry`)
 * gets a link only when a change completes, and this one never did: on the code before d72ea28
 * the offline mark stored M without the promotion's link L -> M, the keeper on L was "foreign
 * replication lineage L, expected M" to every later cycle and the shard stayed offline for good.
 * Now the offline mark records that link from the target's own report (its agent's down report
 * keeps its last answer's `prior_lineage` as `answered_prior_lineage`), and rule 7's ancestor last
 * resort brings the shard back on the keeper, with every acknowledged write, well inside the last
 * resort's grace. Measured: on the code before (d72ea28^) offline at the deadline, ancestry empty,
 * the keeper "foreign" (3 of 3 runs); now offline with the link recorded and back on the keeper
 * 7.7-9.4 s after the thaw, the thawed controller's confirm timeout (6.25 s) included (4 of 4).
 *
 * The keeper is parked by its agent before the target's empty process starts: the test waits for
 * it, so the unpark race fixed in f5ea90d (a parked replica unparked onto an address whose process
 * died in between, then full-synced from the empty restart) cannot arise here.
 */

const PREFIX = "promoted-target-restarted";
/** Keys acknowledged by a replica (`WAIT 1`) on L, before the failover: the keeper holds them all. */
const KEYS = 300;
/** Writes the promoted target takes on M before its database dies (acknowledged by no replica). */
const TARGET_WRITES = 20;
/**
 * A failure timeout of 3 s (as in parked-superseded.test.ts): agents slowed by a loaded machine do
 * not look dead mid-failover, and the last resort's grace (LAST_COPY_GRACE failure timeouts, 90 s)
 * lies far past the deadline below.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** The in-process controller: the cluster's timings, a lease that outlives the freeze. */
const FROZEN_CONFIG = parseFailoverConfig({ ...CONFIG, lockLeaseMs: 60_000 });
const GRACE_MS = LAST_COPY_GRACE * CONFIG.failureTimeoutMs;
/** From the controllers resuming: the retarget's offline mark, the last resort, PROMOTE, confirm. */
const BACK_WITHIN_MS = 45_000;
/** No replication PINGs: offsets move with writes only, so the keeper stands at the promotion point. */
const NO_PINGS = ["--repl-ping-replica-period", "3600"];
/** Refuses every replica's sync on a database (its clients are the agent and the test's). */
const REFUSE_SYNC = ["SETUSER", "default", "-psync", "-sync"];
const ALLOW_SYNC = ["SETUSER", "default", "+psync", "+sync"];

let cluster: LocalCluster | undefined;
const controllers: TestController[] = [];

afterEach(async (context) => {
  for (const controller of controllers) controller.gate?.release();
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** INFO replication of `node` as fields. */
async function replication(node: RedisNode): Promise<Record<string, string>> {
  const text = await withClient(node, (client) => client.info("replication"));
  const fields: Record<string, string> = {};
  for (const line of text.split("\n")) {
    const at = line.indexOf(":");
    if (at > 0) fields[line.slice(0, at)] = line.slice(at + 1).trim();
  }
  return fields;
}

describe("a failover's target promoted, then restarted empty before the controller confirmed it (simulator seed 72080)", () => {
  it("brings the shard back on the parked replica holding the lineage up to the promotion point, with every acknowledged write", {
    timeout: 240_000,
  }, async () => {
    expect(BACK_WITHIN_MS).toBeLessThan(GRACE_MS);

    // Arrange: node-1 primary on L; every key acknowledged by a replica and held by both.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const node1 = active.node("node-1");
    for (const node of active.redis) {
      await withClient(node, (client) => client.config("SET", "repl-ping-replica-period", "3600"));
    }
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:acked`, KEYS, 1);
    const written = (await roleOf(node1)).offset ?? 0;
    await active.waitFor(
      "node-2 and node-3 holding all node-1 sent",
      async () =>
        ((await roleOf(active.node("node-2"))).offset ?? 0) >= written &&
        ((await roleOf(active.node("node-3"))).offset ?? 0) >= written,
      WAIT_MS,
    );
    const lineageL = (await replication(node1)).master_replid ?? "";
    // The failover is the test's in-process controller's: the cluster's controller stops.
    for (const process of active.controllers) await process.stop(3000);
    const before = (await active.topology()) as Topology;
    // Neither replica serves a sync until the target is known: whichever is promoted, the other
    // never syncs from it (the keeper's refusal is lifted once the plan names the target).
    for (const id of ["node-2", "node-3"])
      await withClient(active.node(id), (client) => client.call("ACL", ...REFUSE_SYNC));

    // The controller freezes at its first snapshot read of phase confirm: PROMOTE sent, not confirmed.
    const gate = new Gate(afterConfirmRecorded());
    const frozen = testController(active.env, FROZEN_CONFIG, gate);
    controllers.push(frozen);

    // Act: node-1's database dies; the controller fails over and freezes in confirm.
    node1.signal("SIGKILL");
    await node1.stop();
    const frozenRun = (
      await cycleUntilFrozen(
        frozen,
        active.shard,
        "the controller to record phase confirm of a failover",
        WAIT_MS,
      )
    ).run;
    const plan = (await active.topology()) as Topology;
    expect(plan).toMatchObject({ status: "failing_over", phase: "confirm", epoch: before.epoch + 1 });
    expect(frozen.sent.some((command) => command.type === "PROMOTE")).toBe(true);
    const targetId = plan.failover?.new_primary_node_id ?? "";
    const keeperId = ["node-2", "node-3"].find((id) => id !== targetId) ?? "";
    expect(["node-2", "node-3"]).toContain(targetId);
    const target = active.node(targetId);
    const keeper = active.node(keeperId);
    await withClient(keeper, (client) => client.call("ACL", ...ALLOW_SYNC));

    // The target applies PROMOTE (lineage M, L as its replid2) and its agent reports it.
    let promotedReport: Heartbeat | undefined;
    await active.waitFor(
      `${targetId} reporting itself promoted at epoch ${plan.epoch}, continuing L`,
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), targetId);
        if (
          heartbeat?.role === "primary" &&
          heartbeat.db_status === "up" &&
          heartbeat.epoch >= plan.epoch &&
          heartbeat.repl_id !== lineageL &&
          heartbeat.prior_lineage?.repl_id === lineageL
        )
          promotedReport = heartbeat;
        return promotedReport !== undefined;
      },
      WAIT_MS,
    );
    const promoted = await replication(target);
    const lineageM = promoted.master_replid ?? "";
    const promotionPoint = Number(promoted.second_repl_offset) - 1;
    expect(promoted.master_replid2, "the target continues L").toBe(lineageL);
    expect(lineageM).toBe(promotedReport?.repl_id);

    // The target takes writes of its own (no replica syncs from it); its agent reports them.
    let targetWrites = 0;
    await withClient(target, async (client) => {
      for (let index = 0; index < TARGET_WRITES; index++) {
        try {
          if ((await client.set(`${PREFIX}:target-only:${index}`, "v")) === "OK") targetWrites++;
        } catch {
          // Refused by the write guard: not taken.
        }
      }
    });
    const targetOffset = (await roleOf(target)).offset ?? 0;
    await active.waitFor(
      `${targetId}'s report at its offset`,
      async () => (active.heartbeatOf(await active.snapshot(), targetId)?.last_txn_id ?? 0) >= targetOffset,
      WAIT_MS,
    );

    // The premise: the keeper holds L up to the promotion point and every acknowledged key.
    const kept = await replication(keeper);
    expect(kept.master_replid, `${keeperId} still on L`).toBe(lineageL);
    expect(Number(kept.master_repl_offset), `${keeperId} at the promotion point`).toBe(promotionPoint);
    expect(await countKeys(keeper, `${PREFIX}:acked`, KEYS)).toBe(KEYS);

    // The target's database dies; its agent reports it down. The keeper is parked by its agent
    // (it refuses every sync), as in the seed: no empty process coming back can full-sync its data away.
    target.signal("SIGKILL");
    await target.stop();
    await active.waitFor(
      `${targetId}'s agent reporting its database down`,
      async () => active.heartbeatOf(await active.snapshot(), targetId)?.db_status === "down",
      WAIT_MS,
    );
    await active.waitFor(
      `${keeperId} parked by its agent`,
      async () => {
        const role = await roleOf(keeper);
        return role.role === "slave" && role.primaryPort === PARKED_PORT;
      },
      WAIT_MS,
    );
    const keeperRole = await roleOf(keeper);

    // node-1's and the target's databases come back empty, as a supervisor starts them (fenced by
    // their config); every agent reports after that.
    const restartedAt = Date.now();
    for (const node of [node1, target]) {
      node.wipeData();
      await node.start({ extraArgs: [...FENCED_START_ARGS, ...NO_PINGS] });
    }
    const heardSince = (node: Heartbeat | undefined) => (node?.agent_updated ?? 0) / 1000 > restartedAt;
    let reports = "";
    await active.waitFor(
      "the target reported restarted, node-1 answering, every agent heard since",
      async () => {
        const snapshot = await active.snapshot();
        const nodes = ["node-1", targetId, keeperId].map((id) => active.heartbeatOf(snapshot, id));
        reports = nodes.map(describeReport).join("; ");
        const [old, failed, holder] = nodes;
        return (
          nodes.every(heardSince) &&
          (old?.db_status === "up" || old?.db_crash?.state === "restarted") &&
          failed?.db_crash?.state === "restarted" &&
          holder?.db_status === "up"
        );
      },
      WAIT_MS,
    );
    expect(await countKeys(keeper, `${PREFIX}:acked`, KEYS), `${keeperId} kept every key`).toBe(KEYS);

    // The controller thaws (its confirm finds the target dead) and the cluster's controller runs
    // the cycles after it.
    gate.release();
    const resumedAt = performance.now();
    const thawed = await Promise.race([
      frozenRun?.then((outcome) => JSON.stringify(outcome)),
      new Promise<string>((resolve) => setTimeout(() => resolve("still running"), WAIT_MS)),
    ]);
    active.startController();

    // Assess: online on the keeper, writable, with every acknowledged key, within BACK_WITHIN_MS
    // (before the fix: offline for good, the keeper "foreign").
    const seen: string[] = [];
    let serving: Topology | undefined;
    await active
      .waitFor(
        "an online primary taking writes, holding every acknowledged key",
        async () => {
          const topology = await active.topology();
          if (topology === undefined) return false;
          const state = `${topology.epoch}:${topology.status}:${topology.primary_node_id ?? "-"}`;
          if (seen.at(-1) !== state) seen.push(state);
          if (topology.status !== "online" || topology.epoch <= plan.epoch) return false;
          const node = active.node(topology.primary_node_id ?? "");
          if (!(await probeWrite(node, `${PREFIX}:probe`)).accepted) return false;
          if ((await countKeys(node, `${PREFIX}:acked`, KEYS)) !== KEYS) return false;
          serving = topology;
          return true;
        },
        BACK_WITHIN_MS,
      )
      .catch(() => undefined);
    const tookMs = Math.round(performance.now() - resumedAt);
    const history = (await active.aws.store.history.list(active.shard, 100)).filter(
      (record) => record.epoch > before.epoch,
    );
    const foreign = linesWith(active.controllerLogLines(), /foreign replication lineage/).length;
    const offline = history.find((record) => record.kind === "offline");
    const stored = (await active.topology()) as Topology;
    console.log(
      `L ${lineageL.slice(0, 6)}, target ${targetId} promoted to M ${lineageM.slice(0, 6)} at ${promotionPoint}, ` +
        `took ${targetWrites} of ${TARGET_WRITES} writes (to ${targetOffset}); keeper ${keeperId} ` +
        `(ROLE slave of port ${keeperRole.primaryPort}${keeperRole.primaryPort === PARKED_PORT ? ", parked" : ""})\n` +
        `reports before the thaw: ${reports}\nthawed controller: ${thawed}\n` +
        `topology after resuming: ${seen.join(" -> ")}; ` +
        `${serving ? `serving on ${serving.primary_node_id} ${tookMs} ms after` : `no writable primary with every key within ${BACK_WITHIN_MS} ms`} (grace ${GRACE_MS} ms)\n` +
        `stored ancestry: ${JSON.stringify(stored.ancestry ?? [])}\n` +
        `controller log lines "foreign replication lineage": ${foreign}\n` +
        `history since: ${history.map((record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`).join(" | ") || "none"}`,
    );
    expect(
      serving?.primary_node_id,
      `online on ${keeperId} within ${BACK_WITHIN_MS} ms: ${seen.join(" -> ")}; last offline mark: ${offline?.reason ?? "none"}`,
    ).toBe(keeperId);
    expect(await countKeys(keeper, `${PREFIX}:acked`, KEYS)).toBe(KEYS);
  });
});
