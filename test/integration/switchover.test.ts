import { describe, expect, it } from "vitest";
import {
  pauseShard,
  requestSwitchover,
  resumeShard,
  runShardCycle,
} from "../../src/controller/orchestrator.ts";
import { aScriptedShard, controller } from "../support/scripted-shard.ts";

/** Operator paths through the same orchestrator: switchover, pause, resume (scripted nodes). */

function threeNodeShard() {
  const shard = aScriptedShard();
  shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined, txn: 1000 });
  shard.node("r1", { txn: 990 });
  shard.node("r2", { txn: 980 });
  return shard;
}

describe("switchover", () => {
  it("pauses writes, waits for the target to catch up, promotes it and repoints the old primary", async () => {
    // Prepare
    const shard = threeNodeShard();
    await shard.start();
    const { deps, events } = controller(shard);

    // Act
    const result = await requestSwitchover(deps, shard.shard, { to: "r2", reason: "kernel upgrade" });

    // Assess
    expect(result).toMatchObject({ outcome: "completed", epoch: 2, primary: "r2" });
    expect(result.reason).toMatch(/kernel upgrade/);
    expect(shard.get("p1").received.map((command) => command.type)).toContain("PAUSE_WRITES");
    expect(shard.get("r2")).toMatchObject({ role: "primary", epoch: 2, txn: 1000 });
    const topology = await shard.aws.store.topology.read(shard.shard);
    expect(topology).toMatchObject({ status: "online", epoch: 2, primary_node_id: "r2" });
    expect(topology?.cooldown_until).toBeUndefined();
    const history = await shard.aws.store.history.list(shard.shard);
    expect(history[0]).toMatchObject({
      kind: "switchover",
      old_primary_node_id: "p1",
      new_primary_node_id: "r2",
    });
    expect(history[0]?.phase_timings).toHaveProperty("catch_up");
    await expect.poll(() => shard.get("p1").role, { timeout: 3000 }).toBe("replica");
    expect(shard.get("p1").primary).toBe("r2");
    expect(events.events.map((event) => event.detailType)).toEqual(["FailoverStarted", "FailoverCompleted"]);
  });

  it("aborts before PROMOTE when the target does not catch up, keeping the old primary", async () => {
    // Prepare
    const shard = threeNodeShard();
    shard.get("r1").frozen = true;
    await shard.start();
    const { deps, events, metrics } = controller(shard, { timeouts: { catch_up: 800 } });

    // Act
    const result = await requestSwitchover(deps, shard.shard, { to: "r1" });

    // Assess
    expect(result.outcome).toBe("aborted");
    expect(result.reason).toMatch(/catch_up/);
    expect(shard.get("r1").received.map((command) => command.type)).not.toContain("PROMOTE");
    const topology = await shard.aws.store.topology.read(shard.shard);
    // Abandoned under a further epoch: a new plan (back to p1) is a new epoch.
    expect(topology).toMatchObject({ status: "online", epoch: 3, primary_node_id: "p1" });
    expect(topology?.phase).toBeUndefined();
    expect(events.ofType("FailoverAborted")).toHaveLength(1);
    expect(metrics.get("failoverAborted")).toBe(1);
    expect(await shard.aws.store.history.list(shard.shard)).toEqual([]);
  });

  it("refuses a target that is not eligible, saying why, without touching the shard", async () => {
    // Prepare
    const shard = threeNodeShard();
    shard.get("r2").priority = 0;
    await shard.start();
    const { deps } = controller(shard);

    // Act
    const result = await requestSwitchover(deps, shard.shard, { to: "r2" });

    // Assess
    expect(result).toMatchObject({
      outcome: "refused",
      reason: "r2 is not eligible: priority 0 (never promote)",
    });
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({ epoch: 1, status: "online" });
  });
});

describe("pause and resume", () => {
  it("takes no automatic action on a paused shard and fails over once resumed", async () => {
    // Prepare
    const shard = threeNodeShard();
    await shard.start();
    const { deps } = controller(shard);

    // Act
    const paused = await pauseShard(deps, shard.shard, "planned maintenance");
    shard.kill("p1");
    await shard.waitUntilStale("p1");
    const whilePaused = await runShardCycle(deps, shard.shard);
    const resumed = await resumeShard(deps, shard.shard);
    const afterResume = await runShardCycle(deps, shard.shard);

    // Assess
    expect(paused).toMatchObject({ outcome: "paused", reason: "paused: planned maintenance" });
    expect(whilePaused.decision).toMatchObject({ kind: "none", code: "paused" });
    expect(whilePaused.reason).toBe("shard paused: planned maintenance");
    expect(resumed).toMatchObject({ outcome: "resumed", reason: "resumed, shard online" });
    expect(afterResume).toMatchObject({ outcome: "completed", primary: "r1" });
  });

  it("is idempotent: pausing a paused shard and resuming an online one change nothing", async () => {
    // Prepare
    const shard = threeNodeShard();
    await shard.start();
    const { deps } = controller(shard);

    // Act
    await pauseShard(deps, shard.shard);
    const again = await pauseShard(deps, shard.shard);
    await resumeShard(deps, shard.shard);
    const resumeAgain = await resumeShard(deps, shard.shard);

    // Assess
    expect(again.reason).toBe("already paused");
    expect(resumeAgain.reason).toBe("not paused (online)");
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({ status: "online", epoch: 1 });
  });
});
