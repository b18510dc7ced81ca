import { afterEach, describe, expect, it } from "vitest";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { FailoverState, Heartbeat, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForWritablePrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Simulator seed 340561 (guarantee 3), with real processes: a controller frozen in the middle of a
 * bring_online whose target then dies. The shard was offline on lineage L; the controller brought
 * it online on node-2, whose database held L only as its earlier lineage (restarted from its RDB:
 * a new replication id M, `master_replid2` L). The plan stores the link the target's report showed
 * (`failover.target_link`, L up to its offset continued by M); `topology.ancestry` gets it only
 * when the change completes. The controller froze past its point of no return (phase `confirm`
 * recorded) and node-3 followed node-2 on M, holding every acknowledged write; then node-2's
 * database died before the plan completed.
 *
 * The next controller continues the plan: its target is dead, so another node is promoted in its
 * place (a retarget, src/core/decide/retarget.ts). Before the fix the retarget judged the other
 * nodes against L through the ancestry alone: node-3 on M was "foreign replication lineage M,
 * expected L" and the shard went offline, with no writable primary until the last resort's grace
 * (LAST_COPY_GRACE failure timeouts; in the simulator, for good). Now the plan's own target_link
 * counts too: node-3 is promoted, with every acknowledged write. The frozen controller is the
 * test's own topology writes, as a stopped controller leaves them; the rest is real redis-server,
 * agents, a controller process, DynamoDB Local and SQS.
 */

const PREFIX = "retarget-link";
const KEYS = 200;
/**
 * A failure timeout of 3 s: the last resort's grace the code before falls back to (LAST_COPY_GRACE
 * failure timeouts offline, 90 s) lies far past the deadline below, on two loaded cores.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** From the new controller's start: the retarget, PROMOTE, confirm and repoint, on two loaded cores. */
const WRITABLE_WITHIN_MS = 30_000;
/** No replication PINGs: offsets move with writes only, so node-3's offset is the RDB's. */
const NO_PINGS = ["--repl-ping-replica-period", "3600"];

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a bring_online whose target died past PROMOTE, its replica on the target's lineage (sim seed 340561)", () => {
  it("promotes the replica that followed the target through the plan's target_link, with every acknowledged write", {
    timeout: 180_000,
  }, async () => {
    expect(WRITABLE_WITHIN_MS).toBeLessThan(LAST_COPY_GRACE * CONFIG.failureTimeoutMs);

    // Prepare: node-1 primary on lineage L; every key acknowledged by node-2 and node-3, and on
    // node-2's disk. The cluster's controller then stops (the frozen one is played by the test).
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const [node1, node2, node3] = ["node-1", "node-2", "node-3"].map((id) => active.node(id));
    if (!node1 || !node2 || !node3) throw new Error("three nodes expected");
    for (const node of active.redis) {
      await withClient(node, (client) => client.config("SET", "repl-ping-replica-period", "3600"));
    }
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:acked`, KEYS, 2);
    const acknowledged = (await roleOf(node1)).offset ?? 0;
    await active.waitFor(
      "node-2 and node-3 holding all node-1 sent",
      async () =>
        ((await roleOf(node2)).offset ?? 0) >= acknowledged &&
        ((await roleOf(node3)).offset ?? 0) >= acknowledged,
      WAIT_MS,
    );
    await withClient(node2, (client) => client.save());
    for (const controller of active.controllers) await controller.stop(3000);
    const online = (await active.topology()) as Topology;
    const lineageL = active.heartbeatOf(await active.snapshot(), "node-1")?.repl_id ?? "";
    expect(lineageL, "node-1's lineage").not.toBe("");

    // node-1's database dies for good, node-2's too (to come back from its RDB); the frozen
    // controller's plan: bring the shard online on node-2, past PROMOTE. node-3 follows the target
    // the topology names past its point of no return.
    for (const node of [node1, node2]) {
      node.signal("SIGKILL");
      await node.stop();
    }
    const epoch = online.epoch + 1;
    const startedAt = Date.now();
    const lineage = { node_id: "node-1", repl_id: lineageL, last_txn_id: acknowledged };
    const plan: FailoverState = {
      kind: "bring_online",
      old_primary_node_id: "node-1",
      new_primary_node_id: "node-2",
      new_primary_address: node2.address,
      reason: "test: the last resort, node-2 holds the lineage as its earlier one (seed 340561)",
      started_at: startedAt,
      candidates: [],
      phase_started: { locked: startedAt, epoch_bumped: startedAt, promote: startedAt },
      lineage,
    };
    const planned: Topology = {
      shard: active.shard,
      epoch,
      status: "failing_over",
      phase: "promote",
      updated_at: startedAt,
      lineage,
      failover: plan,
      ...(online.ancestry === undefined ? {} : { ancestry: online.ancestry }),
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, online.epoch, planned)).toBe(true);

    // node-2's database is back from its RDB (lineage M continuing L), fenced by its config; node-3
    // resumes from it on M.
    await node2.start({ extraArgs: [...FENCED_START_ARGS, ...NO_PINGS] });
    let target: Heartbeat | undefined;
    await active.waitFor(
      "node-2 reporting its RDB restart: a new lineage continuing L",
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-2");
        if (
          heartbeat?.db_status === "up" &&
          heartbeat.role === "primary" &&
          heartbeat.repl_id !== lineageL &&
          heartbeat.prior_lineage?.repl_id === lineageL
        )
          target = heartbeat;
        return target !== undefined;
      },
      WAIT_MS,
    );
    const lineageM = target?.repl_id as string;
    const targetLink = {
      repl_id: lineageL,
      until: target?.prior_lineage?.last_txn_id as number,
      by: lineageM,
    };
    expect(targetLink.until).toBeGreaterThanOrEqual(acknowledged);
    expect(target?.epoch ?? 0, "node-2 never applied a PROMOTE of the plan's epoch").toBeLessThan(epoch);
    await waitForFollowers(active, "node-2", ["node-3"]);
    await active.waitFor(
      "node-3 on node-2's lineage M",
      async () => active.heartbeatOf(await active.snapshot(), "node-3")?.repl_id === lineageM,
      WAIT_MS,
    );
    expect(await countKeys(node3, `${PREFIX}:acked`, KEYS)).toBe(KEYS);

    // The frozen controller had recorded phase confirm, with the link its plan was decided on.
    const confirmAt = Date.now();
    const confirming: Topology = {
      ...planned,
      phase: "confirm",
      updated_at: confirmAt,
      failover: {
        ...plan,
        target_link: targetLink,
        phase_started: { ...plan.phase_started, confirm: confirmAt },
      },
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, epoch, confirming)).toBe(true);

    // Act: the target's database dies before the plan completes; its agent reports it down. Then
    // the next controller starts and continues the plan.
    node2.signal("SIGKILL");
    await node2.stop();
    await active.waitFor(
      "node-2's agent reporting its database down",
      async () => active.heartbeatOf(await active.snapshot(), "node-2")?.db_status === "down",
      WAIT_MS,
    );
    const controllerStartedAt = performance.now();
    active.startController();

    // Assess: a writable primary named by the topology within the deadline (before the fix: the
    // shard offline, node-3 "foreign replication lineage M, expected L"), node-3 with every
    // acknowledged write, and never offline.
    let writable: { primary: string; afterMs: number };
    try {
      writable = await waitForWritablePrimary(active, epoch, controllerStartedAt, WRITABLE_WITHIN_MS);
    } catch (error) {
      const records = await active.aws.store.history.list(active.shard, 100);
      const offline = records.filter((record) => record.kind === "offline").map((record) => record.reason);
      throw new Error(
        `${error instanceof Error ? error.message : String(error)}\noffline records: ${offline.join("\n") || "none"}`,
      );
    }
    console.log(
      `writable primary ${writable.primary} ${Math.round(writable.afterMs)} ms after the controller started`,
    );
    expect(writable.primary).toBe("node-3");
    expect(await countKeys(node3, `${PREFIX}:acked`, KEYS)).toBe(KEYS);
    const records = await active.aws.store.history.list(active.shard, 100);
    const since = records.filter((record) => record.epoch > online.epoch);
    expect(since.map((record) => record.kind)).not.toContain("offline");
    expect(since.map((record) => record.reason).join("\n")).toMatch(
      /target node-2 is no longer alive after PROMOTE; promoting node-3 instead/,
    );
  });
});
