import { describe, expect, it } from "vitest";
import { runShardCycle } from "../../src/controller/orchestrator.ts";
import type { Command, Topology } from "../../src/core/model.ts";
import { cycleUntil } from "../support/controller-cycles.ts";
import { Gate, gatedStore, recordingBus } from "../support/frozen-controller.ts";
import { aScriptedShard, controller, TIMEOUTS } from "../support/scripted-shard.ts";

/**
 * The orchestrator against DynamoDB Local with scripted nodes: a controller whose lease was
 * taken over stops at its next write with LockLost and nothing written, and a cycle cut short by
 * the invocation's time budget leaves a state the next invocation finishes.
 */

function threeNodes() {
  const shard = aScriptedShard();
  shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
  shard.node("r1", { txn: 990 });
  shard.node("r2", { txn: 980 });
  return shard;
}

describe("orchestrator: the lock fences every write", () => {
  it("stops a controller whose lease was taken over at its next write, cleanly and with nothing written", async () => {
    // Prepare: the stale controller freezes right before recording phase confirm.
    const shard = threeNodes();
    await shard.start();
    const gate = new Gate({
      name: "before confirm is recorded",
      matches: (call) =>
        call.op === "topology.compareAndSet" && (call.args[2] as Topology | undefined)?.phase === "confirm",
    });
    const sent: Command[] = [];
    const stale = controller(shard, {
      store: gatedStore(shard.aws.store, gate),
      bus: recordingBus(shard.aws.bus, gate, sent),
    });
    const fresh = controller(shard);
    shard.kill("p1");
    await shard.waitUntilStale("p1");

    // Act
    const staleCycle = runShardCycle(stale.deps, shard.shard);
    await gate.reached;
    const sentBeforeFreeze = sent.length;
    const results = await cycleUntil(fresh.deps, shard.shard, (result) => result.outcome === "completed");
    const completed = await shard.aws.store.topology.read(shard.shard);
    gate.release();
    const staleResult = await staleCycle;

    // Assess
    expect(results[0]?.decision).toMatchObject({ kind: "none", code: "locked" });
    expect(staleResult.outcome).toBe("lost_race");
    expect(staleResult.reason).toMatch(/no longer held by .* \(fence 1\); nothing written/);
    expect(sent.length, "the stale controller sent nothing after it woke").toBe(sentBeforeFreeze);
    expect(await shard.aws.store.topology.read(shard.shard)).toEqual(completed);
    expect(completed).toMatchObject({ status: "online", epoch: 2, primary_node_id: "r1" });
    expect(await shard.aws.store.history.list(shard.shard)).toHaveLength(1);
    // The lock is the fresh controller's (released), not deleted by the stale one.
    expect((await shard.aws.store.heartbeats.snapshot(shard.shard)).lock).toMatchObject({ fence: 2 });
  });
});

describe("orchestrator: the invocation's time budget", () => {
  it("starts no phase the remaining time cannot cover, and the next invocation finishes the failover", async () => {
    // Prepare: enough time to bump the epoch and promote, not to wait for confirm.
    const shard = threeNodes();
    await shard.start();
    const timeouts = { ...TIMEOUTS, promote: 1000, confirm: 3000 };
    const { deps } = controller(shard, { timeouts });
    shard.kill("p1");
    await shard.waitUntilStale("p1");
    let clockAtStart = 0;
    // 3.5 s: covers the bump and promote (1 s + 1 s margin each), not confirm (3 s + 1 s).
    const remainingMs = () => 3500 - (Date.now() - clockAtStart);

    // Act 1: an invocation with less than confirm + margin left.
    clockAtStart = Date.now();
    const cut = await runShardCycle(deps, shard.shard, { remainingMs });
    const left = await shard.aws.store.topology.read(shard.shard);
    const lock = (await shard.aws.store.heartbeats.snapshot(shard.shard)).lock;

    // Act 2: the next invocation, with time.
    const results = await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");

    // Assess
    expect(cut.outcome).toBe("deferred");
    expect(cut.reason).toMatch(/phase confirm needs up to 3000 \+ 1000 ms, \d+ ms left in this invocation/);
    // confirm is recorded when PROMOTE goes out, before its time check (simulator seed 320092).
    expect(left).toMatchObject({ status: "failing_over", epoch: 2, phase: "confirm" });
    // Released, so the next invocation does not wait for the lease.
    expect(lock?.expires_at).toBe(0);
    expect(results[0]?.decision).toMatchObject({ kind: "continue_failover" });
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      status: "online",
      epoch: 2,
      primary_node_id: "r1",
    });
    const promotes = shard.get("r1").received.filter((command) => command.type === "PROMOTE");
    expect(new Set(promotes.map((command) => command.command_id)).size).toBe(1);
  });
});
