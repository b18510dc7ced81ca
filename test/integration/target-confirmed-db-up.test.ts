import { randomUUID } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import type { FailoverState, Heartbeat, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
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
 * Simulator seed 282758 (guarantee 3), with real processes: a controller paused (a GC pause, a
 * Lambda frozen mid-invocation) between sending a failover's PROMOTE and confirming it, while the
 * target's database crashes right after its promotion. The target's agent then writes the down
 * report (src/agent/heartbeat-report.ts `downHeartbeat`): `db_status: down`, but the role, epoch
 * and `last_updated` of the database's last answer, so for a failure timeout it still reads
 * "primary at the failover's epoch, fresh". Before the fix the controller that took the failover
 * up confirmed the target from that report (`targetConfirmed`, src/core/continuation.ts): the
 * shard went online on a dead database and the cool-down that follows a completed change held the
 * replacement (30 s without a writable primary in the simulator). Now a target is confirmed only
 * from a database that answers: it is judged not alive and another node is promoted in its place,
 * with every acknowledged write.
 *
 * The frozen controller is the test's own: its plan is written to the topology directly and its
 * lock is held by the test until it "thaws" (the lock released), right after the target's crash;
 * then a real controller process, waiting on that lock, continues the plan. The rest is real
 * redis-server, agents, DynamoDB Local and SQS.
 */

const PREFIX = "target-db-up";
const KEYS = 200;
/**
 * A failure timeout of 3 s: the target's down report stays fresh that long after its database's
 * last answer, room for the thawed controller's first read on two loaded cores. A cool-down far
 * past the deadline below: the code before holds the replacement that long.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000, cooldownMs: 120_000 };
/** From the thaw: the retarget, PROMOTE, confirm and repoint, on two loaded cores (failure timeout + margin). */
const WRITABLE_WITHIN_MS = 30_000;
/** The frozen controller's lease: longer than everything up to its thaw. */
const FROZEN_LEASE_MS = 150_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a failover whose target's database died right after PROMOTE, its controller frozen before confirm (sim seed 282758)", () => {
  it("does not confirm the target from its down report; another node is promoted with every acknowledged write", {
    timeout: 180_000,
  }, async () => {
    expect(WRITABLE_WITHIN_MS).toBeLessThan(CONFIG.cooldownMs);

    // Prepare: node-1 primary on lineage L; every key acknowledged by node-2 and node-3. No
    // replication PINGs, so offsets move with writes only and node-3 keeps up with node-2 exactly.
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
      "node-2 and node-3 reporting all node-1 sent",
      async () => {
        const snapshot = await active.snapshot();
        return ["node-2", "node-3"].every(
          (id) => (active.heartbeatOf(snapshot, id)?.last_txn_id ?? 0) >= acknowledged,
        );
      },
      WAIT_MS,
    );

    // The cluster's controller stops; the frozen one (the test) holds the lock until its thaw.
    for (const controller of active.controllers) await controller.stop(3000);
    const frozenOwner = `frozen-controller-${randomUUID()}`;
    await active.waitFor(
      "the frozen controller's lock",
      async () =>
        (await active.aws.store.locks.acquire(active.shard, frozenOwner, FROZEN_LEASE_MS)) !== false,
      WAIT_MS,
    );
    const online = (await active.topology()) as Topology;
    expect(online).toMatchObject({ status: "online", primary_node_id: "node-1" });
    const lineageL = active.heartbeatOf(await active.snapshot(), "node-1")?.repl_id ?? "";
    expect(lineageL, "node-1's lineage").not.toBe("");

    // node-1's database dies for good; the frozen controller's failover onto node-2 is past
    // PROMOTE (phase confirm recorded) and its PROMOTE reaches node-2, which applies it.
    node1.signal("SIGKILL");
    await node1.stop();
    const epoch = online.epoch + 1;
    const startedAt = Date.now();
    const lineage = { node_id: "node-1", repl_id: lineageL, last_txn_id: acknowledged };
    const plan: FailoverState = {
      kind: "failover",
      old_primary_node_id: "node-1",
      new_primary_node_id: "node-2",
      new_primary_address: node2.address,
      reason: "test: primary node-1 is stale; its controller froze before confirm (seed 282758)",
      started_at: startedAt,
      candidates: [],
      phase_started: { locked: startedAt, epoch_bumped: startedAt, promote: startedAt, confirm: startedAt },
      lineage,
    };
    const confirming: Topology = {
      shard: active.shard,
      epoch,
      primary_node_id: "node-1",
      primary_address: node1.address,
      status: "failing_over",
      phase: "confirm",
      updated_at: startedAt,
      failover: plan,
      ...(online.ancestry === undefined ? {} : { ancestry: online.ancestry }),
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, online.epoch, confirming)).toBe(true);
    await active.aws.bus.send(active.shard, "node-2", {
      type: "PROMOTE",
      shard: active.shard,
      epoch,
      command_id: `frozen-${randomUUID()}`,
      issued_at: Date.now(),
    });
    let promoted: Heartbeat | undefined;
    await active.waitFor(
      `node-2 reporting itself primary at epoch ${epoch}, its database up`,
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-2");
        if (heartbeat?.db_status === "up" && heartbeat.role === "primary" && heartbeat.epoch >= epoch)
          promoted = heartbeat;
        return promoted !== undefined;
      },
      WAIT_MS,
    );
    const lineageM = promoted?.repl_id ?? "";
    expect(lineageM, "node-2's promotion starts a new lineage").not.toBe(lineageL);
    // node-3 follows the target the topology names past its point of no return, on lineage M.
    await waitForFollowers(active, "node-2", ["node-3"]);
    await active.waitFor(
      "node-3 reporting node-2's lineage M up to node-2's offset",
      async () => {
        const snapshot = await active.snapshot();
        const target = active.heartbeatOf(snapshot, "node-2");
        const replica = active.heartbeatOf(snapshot, "node-3");
        return (
          replica?.repl_id === lineageM &&
          target !== undefined &&
          replica.last_txn_id >= target.last_txn_id &&
          replica.last_txn_id >= acknowledged
        );
      },
      WAIT_MS,
    );
    expect(await countKeys(node3, `${PREFIX}:acked`, KEYS)).toBe(KEYS);

    // The next controller process starts; it waits on the frozen controller's lock.
    const earlierLogs = new Set(active.controllerLogLines().map((line) => line.log_file));
    const controller = active.startController();
    await active.waitFor(
      "the controller process logging",
      () => active.controllerLogLines().some((line) => !earlierLogs.has(line.log_file)),
      WAIT_MS,
    );
    expect(controller.child.exitCode).toBeNull();

    // Act: node-2's database crashes right after its promotion; its agent writes the down report,
    // which still reads "primary at the epoch, fresh". Then the frozen controller thaws (its lock
    // released) and the waiting controller continues the plan from phase confirm.
    node2.signal("SIGKILL");
    await node2.stop();
    let down: Heartbeat | undefined;
    await active.waitFor(
      "node-2's agent reporting its database down",
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-2");
        if (heartbeat?.db_status === "down") down = heartbeat;
        return down !== undefined;
      },
      WAIT_MS,
    );
    expect(await active.aws.store.locks.release(active.shard, frozenOwner)).toBe(true);
    const thawedAt = performance.now();
    const downAgeMs = Date.now() - (down?.last_updated ?? 0) / 1000;
    console.log(`node-2's down report at the thaw: ${JSON.stringify(down)}; ${Math.round(downAgeMs)} ms old`);
    // The hole's state: the down report still reads "primary at the epoch, fresh".
    expect(down).toMatchObject({ role: "primary", db_status: "down" });
    expect(down?.epoch ?? 0).toBeGreaterThanOrEqual(epoch);
    expect(downAgeMs, "node-2's down report fresh at the thaw").toBeLessThan(CONFIG.failureTimeoutMs - 1000);

    // Assess: a writable primary named by the topology within failure timeout + margin (before
    // the fix: online at the epoch on the dead node-2, a cool-down set, none writable), with every
    // acknowledged write; node-2 never confirmed.
    let writable: { primary: string; afterMs: number };
    try {
      writable = await waitForWritablePrimary(active, online.epoch, thawedAt, WRITABLE_WITHIN_MS);
    } catch (error) {
      const topology = await active.topology();
      const records = await active.aws.store.history.list(active.shard, 100);
      throw new Error(
        `${error instanceof Error ? error.message : String(error)}\ntopology: ${JSON.stringify(topology)}\nhistory: ${records
          .map((record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id}: ${record.reason}`)
          .join("\n")}`,
      );
    }
    console.log(`writable primary ${writable.primary} ${Math.round(writable.afterMs)} ms after the thaw`);
    expect(writable.primary).toBe("node-3");
    expect(await countKeys(node3, `${PREFIX}:acked`, KEYS)).toBe(KEYS);
    const records = await active.aws.store.history.list(active.shard, 100);
    const since = records.filter((record) => record.epoch > online.epoch);
    expect(
      since.filter((record) => record.new_primary_node_id === "node-2").map((record) => record.kind),
      "node-2 confirmed from its down report",
    ).toEqual([]);
    expect(since.map((record) => record.kind)).not.toContain("offline");
    expect(since.map((record) => record.reason).join("\n")).toMatch(
      /target node-2 is no longer alive after PROMOTE; promoting node-3 instead/,
    );
  });
});
