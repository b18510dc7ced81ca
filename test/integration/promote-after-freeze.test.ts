import { afterEach, describe, expect, it } from "vitest";
import { runShardCycle } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import { MAX_CONFIRM_ROUNDS } from "../../src/core/continuation.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { CHAOS_CONFIG, startChaosCluster, WAIT_MS, withClient } from "../support/chaos-cluster.ts";
import { Gate, type GateCall, type TestController, testController } from "../support/frozen-controller.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Simulator seed 320092 (guarantee 1), with real redis-server and agent processes, DynamoDB Local
 * and SQS: a controller records phase `promote` of a failover, then freezes (GC pause, preempted
 * host) for longer than MAX_CONFIRM_ROUNDS confirm timeouts before it sends PROMOTE. On thaw it
 * sends PROMOTE and, short of invocation time, defers `confirm`. The next controller cycle, before
 * the target reports its promotion, judged the target "did not confirm in time" from the epoch bump
 * long ago and replanned or took the shard offline while the just-promoted target took acknowledged
 * writes (21 lost in the simulator). Now confirm's start is recorded when PROMOTE goes out, and a
 * live target is kept within one confirm timeout of it (src/controller/phases.ts `execute`,
 * src/core/continuation.ts `decideContinuation`, fix 3d9154d).
 */

/**
 * The in-process controllers' config: the chaos timings (the agents'), with a failure timeout twice
 * the agents' so that the target, whose agent is stopped for the second controller's decision
 * (measured 0.2-0.8 s, two runs at once), stays alive by a wide margin; and a lease that outlives the freeze.
 */
const CONFIG = parseFailoverConfig({ ...CHAOS_CONFIG, failureTimeoutMs: 2000, lockLeaseMs: 45_000 });
/** The confirm phase's bound (src/controller/deps.ts `defaultPhaseTimeouts`). */
const CONFIRM_MS = 2 * CONFIG.failureTimeoutMs + CONFIG.heartbeatIntervalMs;
/** Time left to the frozen controller's invocation before the freeze: the whole failover fits. */
const BEFORE_FREEZE_MS = 45_000;
/** ... and once it thaws: enough to send PROMOTE and hold the lock, short of confirm's bound + margin. */
const AFTER_THAW_MS = CONFIRM_MS;

let cluster: LocalCluster | undefined;
let stopped: string | undefined;
const controllers: TestController[] = [];

afterEach(async () => {
  if (stopped) cluster?.signalAgent(stopped, "SIGCONT");
  stopped = undefined;
  for (const controller of controllers) controller.gate?.release();
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  await cluster?.stop();
  cluster = undefined;
});

const isTopologyWrite = (call: GateCall) => call.op === "topology.compareAndSet";

describe("a controller frozen between recording promote and sending PROMOTE", () => {
  it("leaves the next cycle confirming the just-promoted target, its acknowledged writes kept", {
    timeout: 90_000,
  }, async () => {
    // Prepare: the cluster's own controller only brings the shard online.
    cluster = await startChaosCluster();
    const active = cluster;
    for (const process of active.controllers) await process.stop(3000);
    const before = (await active.topology()) as Topology;

    // The first controller freezes at its first call after the topology write of phase `promote`
    // (chainFollowers' snapshot read, before PROMOTE): the sim's freeze point.
    let promoteRecorded = false;
    const staleGate = new Gate({
      name: "promote recorded -> PROMOTE sent",
      matches: (call) => {
        if (isTopologyWrite(call) && (call.args[2] as Topology | undefined)?.phase === "promote") {
          promoteRecorded = true;
          return false;
        }
        return promoteRecorded && call.op === "heartbeats.snapshot";
      },
    });
    // The second controller stops at its first topology write: its decision is made by then.
    const freshGate = new Gate({ name: "the next cycle's first topology write", matches: isTopologyWrite });
    const stale = testController(active.env, CONFIG, staleGate);
    const fresh = testController(active.env, CONFIG, freshGate);
    controllers.push(stale, fresh);
    let thawed = false;
    const staleRemaining = () => (thawed ? AFTER_THAW_MS : BEFORE_FREEZE_MS);

    // Act 1: the primary dies; the first controller plans the failover and freezes after `promote`.
    active.node("node-1").signal("SIGKILL");
    let staleRun: Promise<unknown> | undefined;
    await waitFor(
      async () => {
        if (staleGate.frozenAt) return true;
        const cycle = runShardCycle(stale.deps, active.shard, { remainingMs: staleRemaining });
        staleRun = cycle;
        const frozen = await Promise.race([cycle.then(() => false), staleGate.reached.then(() => true)]);
        if (!frozen) staleRun = undefined;
        return frozen;
      },
      "the first controller to record phase promote",
      WAIT_MS,
      100,
    );
    const plan = (await active.topology()) as Topology;
    expect(plan).toMatchObject({ status: "failing_over", phase: "promote", epoch: before.epoch + 1 });
    const target = plan.failover?.new_primary_node_id as string;
    const bumpedAt = plan.failover?.phase_started.epoch_bumped as number;
    expect(typeof bumpedAt).toBe("number");
    const others = ["node-2", "node-3"].filter((id) => id !== target);

    // The freeze lasts until the target would be overdue when counted from the epoch bump.
    const overdueAt = bumpedAt + MAX_CONFIRM_ROUNDS * CONFIRM_MS + 1500;
    await waitFor(() => Date.now() > overdueAt, "the plan to age past its confirm rounds", 30_000, 100);

    // The target's agent is stopped right after a heartbeat (it stays alive for the controllers, a
    // failure timeout of 2 s) so that it applies PROMOTE only after the next cycle decided: the
    // simulator's 24 ms between the target applying PROMOTE and the next invocation's verdict,
    // made deterministic.
    await waitFor(
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), target);
        return heartbeat !== undefined && Date.now() * 1000 - heartbeat.last_updated < 120_000; // µs
      },
      `a fresh heartbeat of ${target}`,
      10_000,
      20,
    );
    expect(active.signalAgent(target, "SIGSTOP")).toBe(true);
    stopped = target;
    const stoppedAt = Date.now();

    // Act 2: the first controller thaws with too little invocation time left for confirm: it sends
    // PROMOTE and defers.
    thawed = true;
    staleGate.release();
    const staleOutcome = (await staleRun) as { outcome: string; reason?: string };
    expect(staleOutcome.outcome, JSON.stringify(staleOutcome)).toBe("deferred");
    expect(
      stale.sent.some((command) => command.type === "PROMOTE" && command.epoch === plan.epoch),
      "the thawed controller sent PROMOTE",
    ).toBe(true);

    // Act 3: the next cycle, with full time, decides while the target has not yet applied PROMOTE.
    const freshRun = runShardCycle(fresh.deps, active.shard);
    const decided = await Promise.race([freshRun.then(() => false), freshGate.reached.then(() => true)]);
    const decisionMs = Date.now() - stoppedAt;
    active.signalAgent(target, "SIGCONT");
    stopped = undefined;
    const written = freshGate.frozenAt?.args[2] as Topology | undefined;
    console.log(
      `target ${target}; decision ${decisionMs} ms after its agent stopped; first write: ${JSON.stringify(
        written && {
          epoch: written.epoch,
          status: written.status,
          phase: written.phase,
          to: written.failover?.new_primary_node_id,
        },
      )}`,
    );

    // The target applies PROMOTE and takes writes, acknowledged by the other replica once it
    // follows: what the sim lost. Written from here until the next cycle ends.
    const acked: string[] = [];
    let writing = true;
    const writer = (async () => {
      let index = 0;
      while (writing) {
        const key = `acked:${index++}`;
        try {
          await withClient(active.node(target), async (client) => {
            if ((await client.set(key, `value-${index}`)) !== "OK") return;
            if (Number(await client.call("WAIT", "1", "1000")) >= 1) acked.push(key);
          });
        } catch {
          // Refused (READONLY before PROMOTE, NOREPLICAS under the guard): not acknowledged.
        }
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    try {
      await waitFor(() => acked.length > 0, `a write acknowledged on ${target} after its PROMOTE`, 15_000);
      freshGate.release();
      const outcome = await freshRun;

      // Assess: no replan, no offline: the same plan confirmed, online on the target at its epoch.
      const after = (await active.topology()) as Topology;
      expect(decided, `the next cycle ended without writing: ${JSON.stringify(outcome)}`).toBe(true);
      expect(
        { status: after.status, primary: after.primary_node_id, epoch: after.epoch },
        `next cycle: ${JSON.stringify(outcome)}`,
      ).toEqual({ status: "online", primary: target, epoch: plan.epoch });
      await waitFor(() => acked.length >= 10, "ten acknowledged writes", 15_000);
    } finally {
      writing = false;
      await writer;
    }
    await waitFor(
      async () => {
        const snapshot = await active.snapshot();
        return others.every((id) => {
          const heartbeat = active.heartbeatOf(snapshot, id);
          return heartbeat?.primary_node_id === target && heartbeat.primary_link === "up";
        });
      },
      `the other replica to follow ${target}`,
      WAIT_MS,
    );
    for (const id of [target, ...others]) {
      const held = await withClient(active.node(id), (client) => client.mget(...acked));
      expect(held.filter((value) => value === null).length, `acknowledged writes missing on ${id}`).toBe(0);
    }
    expect((await active.topology())?.primary_node_id).toBe(target);
  });
});
