import { setTimeout as pause } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { runShardCycle } from "../../src/controller/orchestrator.ts";
import { RecordingLogger } from "../support/agent-harness.ts";
import { cycleUntil } from "../support/controller-cycles.ts";
import { aScriptedShard, CONFIG, controller, TIMEOUTS } from "../support/scripted-shard.ts";
import { waitFor } from "../support/wait.ts";

/** The orchestrator on the local stack with scripted nodes (test/support/scripted-shard.ts). */

describe("orchestrator on the local stack", () => {
  it("fails a dead primary over to the most advanced replica and repoints the others", async () => {
    // Prepare
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980 });
    await shard.start();
    const { deps, events, metrics } = controller(shard);
    expect((await runShardCycle(deps, shard.shard)).outcome).toBe("no_action");

    // Act
    shard.kill("p1");
    const started = Date.now();
    const results = await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");
    const elapsed = Date.now() - started;

    // Assess
    const topology = await shard.aws.store.topology.read(shard.shard);
    expect(topology).toMatchObject({ epoch: 2, primary_node_id: "r1", status: "online" });
    expect(topology?.phase).toBeUndefined();
    expect(topology?.cooldown_until).toBeGreaterThan(shard.aws.clock.now());
    const history = await shard.aws.store.history.list(shard.shard);
    expect(history).toHaveLength(1);
    expect(history[0]).toMatchObject({
      epoch: 2,
      kind: "failover",
      old_primary_node_id: "p1",
      new_primary_node_id: "r1",
    });
    expect(Object.keys(history[0]?.phase_timings ?? {})).toEqual(
      expect.arrayContaining(["locked", "epoch_bumped", "promote", "confirm", "repoint", "cleanup"]),
    );
    await waitFor(() => shard.get("r2").primary === "r1", "r2 repointed to r1", 5000);
    expect(shard.get("r2")).toMatchObject({ role: "replica", primary: "r1", epoch: 2 });
    const snapshot = await shard.aws.store.heartbeats.snapshot(shard.shard);
    expect(snapshot.nodes.map((node) => node.node_id).sort()).toEqual(["r1", "r2"]);
    expect(events.events.map((event) => event.detailType)).toEqual(["FailoverStarted", "FailoverCompleted"]);
    expect(metrics.get("failoverStarted")).toBe(1);
    expect(metrics.get("failoverCompleted")).toBe(1);
    expect(results.at(-1)?.reason).toMatch(/failover to r1 completed at epoch 2/);
    console.log(`failover: detected and completed ${elapsed} ms after the primary died`);
  });

  it("has the old primary's other replicas follow the target before it sends PROMOTE (a hung primary that wakes finds none to acknowledge)", async () => {
    // Prepare: p1 stops answering with no crash report (hung, as far as anyone knows).
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980 });
    await shard.start();
    const { deps } = controller(shard);

    // Act
    shard.kill("p1");
    await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");

    // Assess: r2 followed r1 (REPLICAOF, once) before r1 was promoted; the code before repointed
    // it only after r1 confirmed.
    const order = shard.applied.filter((entry) => entry === "r2:REPLICAOF" || entry === "r1:PROMOTE");
    expect(order).toEqual(["r2:REPLICAOF", "r1:PROMOTE"]);
    expect(shard.get("r2")).toMatchObject({ role: "replica", primary: "r1", epoch: 2 });
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      epoch: 2,
      primary_node_id: "r1",
    });
  });

  it("promotes after at most a failure timeout when a replica of the old primary does not apply the REPLICAOF", async () => {
    // Prepare: r2's agent takes no commands (heard, but its queue is never read).
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980, responsive: false });
    await shard.start();
    const log = new RecordingLogger();
    const { deps } = controller(shard, { log });

    // Act
    shard.kill("p1");
    await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");

    // Assess: the failover completed without r2, and said so.
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      epoch: 2,
      primary_node_id: "r1",
    });
    expect(shard.applied).toContain("r1:PROMOTE");
    expect(shard.applied).not.toContain("r2:REPLICAOF");
    expect(log.find("promoting before every replica of the old primary followed the target")).toMatchObject({
      level: "warn",
      attributes: { target: "r1", followers: ["r2"] },
    });
  });

  it("lets exactly one of five simultaneous controllers fail over, bumping the epoch once", async () => {
    // Prepare
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980 });
    await shard.start();
    shard.kill("p1");
    await shard.waitUntilStale("p1");
    const controllers = Array.from({ length: 5 }, () => controller(shard));

    // Act
    const results = await Promise.all(controllers.map(({ deps }) => runShardCycle(deps, shard.shard)));

    // Assess
    expect(results.filter((result) => result.outcome === "completed")).toHaveLength(1);
    expect(results.filter((result) => result.outcome !== "completed").map((r) => r.outcome)).not.toContain(
      "aborted",
    );
    const topology = await shard.aws.store.topology.read(shard.shard);
    expect(topology).toMatchObject({ epoch: 2, primary_node_id: "r1", status: "online" });
    expect(await shard.aws.store.history.list(shard.shard)).toHaveLength(1);
    const started = controllers.flatMap(({ events }) => events.ofType("FailoverStarted"));
    expect(started).toHaveLength(1);
    expect(shard.get("r1").received.filter((command) => command.type === "PROMOTE")).toHaveLength(1);
  });

  it("completes a failover whose controller was killed right after sending PROMOTE, after the lease", async () => {
    // Prepare
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990 });
    shard.node("r2", { txn: 980 });
    await shard.start();
    let killed = false;
    const doomed = controller(shard, {
      onPhase: async (_shard, phase) => {
        if (phase !== "promote") return;
        killed = true;
        // The process is gone: nothing after PROMOTE runs, nothing is released.
        await new Promise(() => {});
      },
    });
    const survivor = controller(shard);
    shard.kill("p1");
    await shard.waitUntilStale("p1");

    // Act
    // Cycles until one reaches PROMOTE and hangs there: on a loaded host the first may still see
    // the replicas' heartbeats too old to vote and decide nothing.
    void (async () => {
      while (!killed) {
        await runShardCycle(doomed.deps, shard.shard);
        await pause(CONFIG.tickIntervalMs); // a controller's pace between passes
      }
    })();
    await waitFor(() => killed, "the doomed controller at phase promote");
    const stuck = await shard.aws.store.topology.read(shard.shard);
    // The doomed controller's lease, as stored: the survivor may take over only once it ends (the
    // lease began at the acquire, before the plan's phases: on a loaded host they take a while).
    const lease = (await shard.aws.store.heartbeats.snapshot(shard.shard)).lock;
    const results = await cycleUntil(survivor.deps, shard.shard, (result) => result.outcome === "completed");

    // Assess
    expect(stuck).toMatchObject({ status: "failing_over", phase: "promote", epoch: 2 });
    expect(results[0]?.decision).toMatchObject({ kind: "none", code: "locked" });
    expect(lease?.expires_at).toBeDefined();
    // (100 ms for the controller's AWS-aligned clock against this process's.)
    expect(Date.now()).toBeGreaterThanOrEqual((lease?.expires_at ?? Number.POSITIVE_INFINITY) - 100);
    const topology = await shard.aws.store.topology.read(shard.shard);
    expect(topology).toMatchObject({ epoch: 2, primary_node_id: "r1", status: "online" });
    expect(await shard.aws.store.history.list(shard.shard)).toHaveLength(1);
    // The survivor re-sent nothing new: PROMOTE carries the same id, applied once.
    const promotes = shard.get("r1").received.filter((command) => command.type === "PROMOTE");
    expect(new Set(promotes.map((command) => command.command_id)).size).toBe(1);
    await waitFor(() => shard.get("r2").primary === "r1", "r2 repointed to r1", 5000);
    expect(shard.get("r2")).toMatchObject({ primary: "r1", epoch: 2 });
  });

  it("takes a shard with no eligible node offline and brings it online when a node returns", async () => {
    // Prepare: r1 may never be promoted, r2 is down. r1 holds no more than r2: a priority-0 node
    // holding more would keep the shard offline (gate priority_zero_ahead_offline).
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 980, priority: 0 });
    shard.node("r2", { txn: 990, alive: false });
    await shard.start();
    const { deps, events, metrics } = controller(shard);
    shard.kill("p1");

    // Act 1: the primary dies with nobody eligible.
    const offline = await cycleUntil(deps, shard.shard, (result) => result.outcome === "offline");

    // Assess 1
    expect(offline.at(-1)?.reason).toMatch(/no node is eligible/);
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      status: "offline",
      epoch: 2,
      lineage: { repl_id: "lineage-a" },
    });
    const whileOffline = await runShardCycle(deps, shard.shard);
    expect(whileOffline.decision).toMatchObject({ kind: "none", code: "offline_no_candidate" });

    // Act 2: r2 returns with its data.
    shard.get("r2").alive = true;
    const online = await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");

    // Assess 2
    expect(online.at(-1)?.decision).toMatchObject({ kind: "bring_online", target: { node_id: "r2" } });
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      status: "online",
      epoch: 3,
      primary_node_id: "r2",
    });
    const history = await shard.aws.store.history.list(shard.shard);
    expect(history.map((record) => [record.epoch, record.kind])).toEqual([
      [3, "bring_online"],
      [2, "offline"],
    ]);
    expect(events.events.map((event) => event.detailType)).toEqual([
      "ShardOffline",
      "FailoverStarted",
      "FailoverCompleted",
      "ShardOnline",
    ]);
    expect(metrics.get("failoverCompleted")).toBe(1);
  });

  it("replaces a promoted node that never confirms with the next candidate under a further epoch", async () => {
    // Prepare: r1 is alive but its agent never applies a command. r2 holds as much as r1: a live
    // target holding more than every other node keeps the plan, its PROMOTE sent again (rule
    // live_target_ahead, guarantee 1: simulator seed 420290; orchestrator-continuation.test.ts).
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { txn: 990, responsive: false });
    shard.node("r2", { txn: 990 });
    await shard.start();
    const { deps, events } = controller(shard, { timeouts: { ...TIMEOUTS, confirm: 500 } });
    shard.kill("p1");

    // Act
    const results = await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");

    // Assess
    expect(results.map((result) => result.outcome)).toContain("stuck");
    expect(results.at(-1)?.reason).toMatch(/r1 did not confirm in time after PROMOTE; promoting r2 instead/);
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      status: "online",
      epoch: 3,
      primary_node_id: "r2",
    });
    const history = await shard.aws.store.history.list(shard.shard);
    expect(history.map((record) => [record.epoch, record.new_primary_node_id])).toEqual([[3, "r2"]]);
    expect(events.ofType("FailoverStarted").map((event) => event.detail.new_primary)).toEqual(["r1", "r2"]);
  });
});
