import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { requestSwitchover, runShardCycle } from "../../src/controller/orchestrator.ts";
import { handleOperatorRequest } from "../../src/controller/requests.ts";
import type { FailoverPhase } from "../../src/core/model.ts";
import { NOW } from "../support/builders.ts";
import { MemoryShard } from "../support/memory-shard.ts";
import { settled } from "../support/settled.ts";

/**
 * Operator requests within the invocation's time budget (the failover phases' budget): a
 * switchover starts only when the remaining time carries it to PROMOTE, each phase only when the
 * remaining time covers its bound plus the margin, the lease is cut to the remaining time, and a
 * switchover cut short leaves a state the next invocation continues from. The remaining time is
 * cut by hand at a phase boundary, as a slow phase would cut it.
 *
 * Default timeouts for failureTimeoutMs 3 s, heartbeatIntervalMs 1 s: catch_up 7 s, promote 5 s,
 * confirm 7 s, repoint and cleanup 5 s; margin 1 s per phase.
 */

beforeEach(() => {
  vi.useFakeTimers({ now: NOW });
});

afterEach(() => {
  vi.useRealTimers();
});

/** An invocation whose remaining time drops to `cutTo` ms once `phase` has done its work. */
function invocation(shard: MemoryShard, startMs: number, phase?: FailoverPhase, cutTo?: number) {
  let left = startMs;
  const deps = shard.deps({
    onPhase: (_shard, done) => {
      if (done === phase && cutTo !== undefined) left = cutTo;
    },
  });
  return { deps, remainingMs: () => left };
}

const commands = (shard: MemoryShard, type: string) =>
  shard.sent
    .filter(({ command }) => command.type === type)
    .map(({ node, command }) => `${node}:${command.command_id}`);

describe("a switchover within the invocation's time", () => {
  it("is refused, with nothing changed, when the remaining time cannot carry it through catch_up and promote", async () => {
    // Prepare: 1 ms short of catch_up + promote + 2 margins.
    const shard = new MemoryShard();
    const before = shard.topology;

    // Act: through the Lambda's operator entry point.
    const response = await settled(
      handleOperatorRequest(
        shard.deps(),
        { action: "switchover", shard: "s1", to: "r1" },
        { remainingMs: () => 13_999 },
      ),
    );

    // Assess
    expect(response).toMatchObject({ ok: false, outcome: "refused", epoch: 3 });
    expect(response.reason).toBe(
      "shard s1: phase epoch_bumped (catch_up, promote) needs up to 7000 + 5000 + 2000 ms, 13999 ms left in this invocation; nothing changed, try again",
    );
    expect(shard.topology).toBe(before);
    expect(shard.sent).toEqual([]);
    expect(shard.leases).toEqual([{ op: "acquire", leaseMs: 13_999 }]);
    expect(shard.lock?.expires_at).toBe(0);
  });

  it("cut short after PROMOTE: ends deferred with the phase recorded and the lock released; the next invocation completes it at the same epoch", async () => {
    // Prepare: time for the bump, catch_up and promote; 1 ms short of confirm + margin after PROMOTE.
    const shard = new MemoryShard();
    const { deps, remainingMs } = invocation(shard, 20_000, "promote", 7999);

    // Act 1: the cut invocation.
    const cut = await settled(requestSwitchover(deps, "s1", { to: "r1" }, { remainingMs }));
    const left = shard.topology;
    const lockAfterCut = shard.lock;

    // Act 2: the next invocation's cycle, with time.
    const next = await settled(runShardCycle(shard.deps(), "s1"));

    // Assess
    expect(cut.outcome).toBe("deferred");
    expect(cut.reason).toBe(
      "shard s1: phase confirm needs up to 7000 + 1000 ms, 7999 ms left in this invocation; the next invocation continues",
    );
    // confirm is recorded when PROMOTE goes out, before its time check (simulator seed 320092):
    // the next invocation gives the target its confirm timeout from the send.
    expect(left).toMatchObject({ status: "failing_over", epoch: 4, phase: "confirm" });
    expect(left?.failover).toMatchObject({
      kind: "switchover",
      old_primary_node_id: "p1",
      new_primary_node_id: "r1",
    });
    expect(lockAfterCut?.expires_at).toBe(0);
    expect(shard.leases[0]).toEqual({ op: "acquire", leaseMs: 20_000 });
    expect(next).toMatchObject({
      decision: { kind: "continue_failover" },
      outcome: "completed",
      epoch: 4,
      primary: "r1",
    });
    expect(shard.topology).toMatchObject({ status: "online", epoch: 4, primary_node_id: "r1" });
    expect(commands(shard, "PROMOTE")).toEqual(["r1:s1:4:PROMOTE:r1"]);
    expect(commands(shard, "REPLICAOF").sort()).toEqual(["p1:s1:4:REPLICAOF:p1", "r2:s1:4:REPLICAOF:r2"]);
    expect(shard.history).toMatchObject([{ epoch: 4, kind: "switchover", new_primary_node_id: "r1" }]);
  });

  it("cut short after catch_up, before PROMOTE: abandoned at once under a new epoch, the old primary stays", async () => {
    // Prepare: 1 ms short of promote + margin once the target has caught up.
    const shard = new MemoryShard();
    const { deps, remainingMs } = invocation(shard, 20_000, "catch_up", 5999);

    // Act
    const result = await settled(requestSwitchover(deps, "s1", { to: "r1" }, { remainingMs }));

    // Assess
    expect(result.outcome).toBe("aborted");
    expect(result.reason).toBe(
      "shard s1: phase promote needs up to 5000 + 1000 ms, 5999 ms left in this invocation; switchover aborted, p1 stays primary",
    );
    expect(shard.topology).toMatchObject({ status: "online", epoch: 5, primary_node_id: "p1" });
    expect(shard.topology?.failover).toBeUndefined();
    expect(commands(shard, "PROMOTE")).toEqual([]);
    expect(shard.lock?.expires_at).toBe(0);
  });
});

describe("pause and resume within the invocation's time", () => {
  it("asks for a lease cut to the remaining time", async () => {
    // Prepare
    const shard = new MemoryShard();

    // Act
    const response = await settled(
      handleOperatorRequest(shard.deps(), { action: "pause", shard: "s1" }, { remainingMs: () => 4321 }),
    );

    // Assess
    expect(response).toMatchObject({ ok: true, outcome: "paused" });
    expect(shard.leases).toEqual([{ op: "acquire", leaseMs: 4321 }]);
    expect(shard.topology).toMatchObject({ status: "paused", epoch: 3 });
  });

  it("is refused, nothing locked or written, with under a second left", async () => {
    // Prepare
    const shard = new MemoryShard();
    const before = shard.topology;

    // Act
    const response = await settled(
      handleOperatorRequest(shard.deps(), { action: "resume", shard: "s1" }, { remainingMs: () => 900 }),
    );

    // Assess
    expect(response).toMatchObject({ ok: false, outcome: "refused" });
    expect(response.reason).toBe(
      "shard s1: 900 ms left in this invocation, under the 1000 ms shortest lease; too late to take the lock; try again",
    );
    expect(shard.leases).toEqual([]);
    expect(shard.topology).toBe(before);
  });
});

describe("the lineage history a change of primary records", () => {
  it("appends the new primary's link (its lineage continues the old one at its offset), carried through later writes", async () => {
    // Prepare: promotions give new replication ids, as in Redis.
    const shard = new MemoryShard();
    shard.trackLineages = true;

    // Act: a switchover to r1.
    const result = await requestSwitchover(shard.deps(), "s1", { to: "r1" });

    // Assess
    expect(result.outcome).toBe("completed");
    expect(shard.topology?.primary_node_id).toBe("r1");
    expect(shard.topology?.ancestry).toEqual([
      {
        repl_id: "lineage-a",
        until: shard.nodes.get("r1")?.prior?.last_txn_id,
        by: `lineage-a-e${shard.topology?.epoch}`,
      },
    ]);
  });
});
