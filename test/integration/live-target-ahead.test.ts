import { afterEach, describe, expect, it } from "vitest";
import { parseFailoverConfig } from "../../src/core/config.ts";
import { MAX_CONFIRM_ROUNDS } from "../../src/core/continuation.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  linesWith,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForSettled,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import {
  cycleUntilFrozen,
  Gate,
  type GateCall,
  type TestController,
  testController,
} from "../support/frozen-controller.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Simulator seed 420290 (guarantee 1, rule `live_target_ahead`, fix c002a06), with real
 * redis-server processes and agents, DynamoDB Local and SQS.
 *
 * node-1 primary, node-2 and node-3 members. node-3 lags: its redis-server is stopped (SIGSTOP)
 * while a batch of keys is written on node-1, each acknowledged by a replica (`WAIT 1`): node-2's
 * acknowledgement, node-3's last `REPLCONF ACK` still young enough for Redis's guard to count it
 * (as in the seed, where its acknowledgements arrived on time while its stream fell behind).
 * node-1's database is killed while node-3 is still stopped; node-3 then resumes and gets only what
 * the kernel had buffered for it (the batch is larger than the loopback socket buffers: the rest
 * died in node-1's output buffer). node-2 holds every key, node-3 lacks the batch's tail.
 *
 * The failover's controller freezes between recording phase `promote` and sending PROMOTE. The
 * mechanism: the controller is the real controller code (`runShardCycle`) run in this process on
 * the cluster's endpoints, its store and command bus behind a test-side gate
 * (test/support/frozen-controller.ts, as in promote-after-freeze.test.ts): it stops at its first
 * call after the topology write that records `promote` (chainFollowers' snapshot read, before any
 * PROMOTE goes out), a point the store calls define exactly, which a SIGSTOP of a controller
 * process timed on the topology item would hit only by luck (the write and the send are
 * milliseconds apart). It stays frozen past its lock lease and past MAX_CONFIRM_ROUNDS confirm
 * timeouts since its epoch bump; only then is a controller process of the cluster started: the next
 * invocation, which finds the plan overdue with its target node-2 alive (agent heard, database up,
 * a parked replica holding the lineage further than node-3).
 *
 * On the code before the fix (c002a06^) it judged node-2 "did not confirm in time after PROMOTE"
 * (none had been sent) and promoted node-3 instead; node-2, repointed at node-3, full-synced from it
 * and the acknowledged keys only node-2 held were gone. Now it sends node-2 its PROMOTE again: node-2
 * is the primary at the plan's epoch and every acknowledged key is on it and on node-3.
 */

const PREFIX = "live-target-ahead";
/** Keys acknowledged by both replicas before node-3 lags. */
const BEFORE_KEYS = 200;
/**
 * Keys written while node-3 is stopped, acknowledged by node-2: 100 values of 100 kB, 10 MB, more
 * than node-1's socket send buffer (tcp_wmem max 4 MB) and node-3's receive buffer (not grown while
 * its process reads nothing) hold, so node-3 cannot get the whole batch once it resumes.
 */
const LAG_KEYS = 100;
const LAG_VALUE_BYTES = 100_000;
/**
 * A failure timeout of 3 s (as in promoted-target-restarted.test.ts): agents slowed by a loaded
 * machine do not look dead, so node-2 stays alive for the next controller's verdict. The batch
 * needs megabytes to outrun the socket buffers, so node-3 ends 6-10 MB behind node-2 (in the seed
 * 6,000 bytes): a `maxLagOnFailover` of 64 MB (default 1 MB) keeps node-3 an eligible candidate,
 * as it was in the seed.
 */
const CONFIG = {
  ...CHAOS_CONFIG,
  failureTimeoutMs: 3000,
  fenceTimeoutMs: 2000,
  maxLagOnFailover: 64 * 1024 * 1024,
};
/** The frozen controller: the cluster's timings, a 10 s lease that the freeze outlives. */
const FROZEN_CONFIG = parseFailoverConfig({ ...CONFIG, lockLeaseMs: 10_000 });
/** The confirm phase's bound (src/controller/deps.ts `defaultPhaseTimeouts`). */
const CONFIRM_MS = 2 * CONFIG.failureTimeoutMs + CONFIG.heartbeatIntervalMs;

let cluster: LocalCluster | undefined;
const controllers: TestController[] = [];
/** Processes this test stopped (SIGSTOP), resumed in afterEach if still stopped. */
const stoppedNodes: RedisNode[] = [];
const stoppedAgents: string[] = [];

afterEach(async (context) => {
  for (const node of stoppedNodes.splice(0)) if (node.running) node.signal("SIGCONT");
  for (const id of stoppedAgents.splice(0)) cluster?.signalAgent(id, "SIGCONT");
  for (const controller of controllers) controller.gate?.release();
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** A database's `master_repl_offset` (INFO): where it stands on its lineage, replica or not. */
async function replOffset(node: RedisNode): Promise<number> {
  const info = await withClient(node, (client) => client.info("replication"));
  return Number(/^master_repl_offset:(\d+)/m.exec(info)?.[1] ?? "-1");
}

/** How many of the keys `<prefix>:0..count-1` a node holds (EXISTS: no values transferred). */
async function existing(node: RedisNode, prefix: string, count: number): Promise<number> {
  const keys = Array.from({ length: count }, (_, index) => `${prefix}:${index}`);
  return withClient(node, async (client) => Number(await client.exists(...keys)));
}

describe("a failover's controller frozen between recording promote and sending PROMOTE, past its lease, its target alive and ahead (simulator seed 420290)", () => {
  it("has the next controller send the target its PROMOTE again, not promote the member behind it: every acknowledged key kept", {
    timeout: 240_000,
  }, async () => {
    // Arrange: node-1 primary, node-2 and node-3 linked members; keys acknowledged by both.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const [node1, node2, node3] = ["node-1", "node-2", "node-3"].map((id) => active.node(id)) as [
      RedisNode,
      RedisNode,
      RedisNode,
    ];
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:before`, BEFORE_KEYS, 2);
    // The failover is the test's controllers': the cluster's controller process stops.
    for (const process of active.controllers) await process.stop(3000);
    const before = (await active.topology()) as Topology;
    expect(before).toMatchObject({ status: "online", primary_node_id: "node-1" });

    // Act 1: node-3 lags. node-1's agent is stopped first so that it does not drop node-3 from
    // the replica set while node-3 acknowledges nothing (the guard keeps demanding both members;
    // Redis counts node-3 good for ~2 s after its last acknowledgement); node-3's database stops;
    // the batch is written and acknowledged by node-2; node-1's database dies; node-3 resumes.
    expect(active.signalAgent("node-1", "SIGSTOP")).toBe(true);
    stoppedAgents.push("node-1");
    node3.signal("SIGSTOP");
    stoppedNodes.push(node3);
    const lagStarted = performance.now();
    let lagWrite: string | undefined;
    try {
      await withClient(node1, async (client) => {
        const pipeline = client.pipeline();
        for (let index = 0; index < LAG_KEYS; index++)
          pipeline.set(`${PREFIX}:lag:${index}`, `${index}:`.padEnd(LAG_VALUE_BYTES, "x"));
        const refused = (await pipeline.exec())?.find(([error]) => error !== null)?.[0];
        if (refused) throw new Error(`refused: ${refused.message}`);
        const acked = Number(await client.call("WAIT", "1", "5000"));
        if (acked < 1) throw new Error(`WAIT 1 answered ${acked}`);
      });
    } catch (error) {
      lagWrite = error instanceof Error ? error.message : String(error);
    }
    const lagWriteMs = Math.round(performance.now() - lagStarted);
    node1.signal("SIGKILL");
    await node1.stop();
    node3.signal("SIGCONT");
    stoppedNodes.splice(0);
    active.signalAgent("node-1", "SIGCONT");
    stoppedAgents.splice(0);
    // The premise: the whole batch acknowledged (by node-2: node-3 was stopped), node-2 holds it,
    // node-3 does not, and node-3 is behind node-2 on the same lineage.
    expect(lagWrite, `the batch written and acknowledged in ${lagWriteMs} ms`).toBeUndefined();
    expect(await existing(node2, `${PREFIX}:lag`, LAG_KEYS)).toBe(LAG_KEYS);
    const settledOffset = async (node: RedisNode) => {
      let last = -1;
      let offset = 0;
      // node-3 drains what the kernel buffered for it, then sees the connection closed.
      await waitFor(
        async () => {
          offset = await replOffset(node);
          const steady = offset === last;
          last = offset;
          return steady;
        },
        `${node.id}'s offset to stop moving`,
        WAIT_MS,
        500,
      );
      return offset;
    };
    const offset2 = await settledOffset(node2);
    const offset3 = await settledOffset(node3);
    const lagOn3 = await existing(node3, `${PREFIX}:lag`, LAG_KEYS);
    console.log(
      `batch of ${LAG_KEYS} x ${LAG_VALUE_BYTES} B acknowledged in ${lagWriteMs} ms; node-2 at ${offset2}, ` +
        `node-3 at ${offset3} holding ${lagOn3} of the batch's keys`,
    );
    expect(offset3, "node-3 behind node-2").toBeLessThan(offset2);
    expect(lagOn3, "node-3 lacks part of the batch").toBeLessThan(LAG_KEYS);

    // Act 2: a controller plans the failover (target node-2, the furthest) and freezes at its first
    // call after the topology write of phase promote, before PROMOTE.
    let promoteRecorded = false;
    const gate = new Gate({
      name: "promote recorded -> PROMOTE sent",
      matches: (call: GateCall) => {
        if (
          call.op === "topology.compareAndSet" &&
          (call.args[2] as Topology | undefined)?.phase === "promote"
        ) {
          promoteRecorded = true;
          return false;
        }
        return promoteRecorded;
      },
    });
    const frozen = testController(active.env, FROZEN_CONFIG, gate);
    controllers.push(frozen);
    const frozenRun = (
      await cycleUntilFrozen(
        frozen,
        active.shard,
        "a controller to record phase promote of a failover",
        WAIT_MS,
      )
    ).run;
    const plan = (await active.topology()) as Topology;
    expect(plan).toMatchObject({ status: "failing_over", phase: "promote", epoch: before.epoch + 1 });
    expect(plan.failover?.new_primary_node_id, "the plan's target").toBe("node-2");
    const ranked3 = plan.failover?.candidates.find((candidate) => candidate.node_id === "node-3");
    expect(
      ranked3,
      `node-3 ranked eligible behind node-2: ${JSON.stringify(plan.failover?.candidates)}`,
    ).toMatchObject({ eligible: true });
    expect(
      frozen.sent.filter((command) => command.type === "PROMOTE"),
      `no PROMOTE before the freeze (frozen at ${gate.frozenAt?.op})`,
    ).toEqual([]);
    const bumpedAt = plan.failover?.phase_started.epoch_bumped as number;
    expect(typeof bumpedAt).toBe("number");

    // The freeze lasts past the frozen controller's lease and until the target is overdue counted
    // from the epoch bump (MAX_CONFIRM_ROUNDS confirm timeouts), with node-2's agent heard since.
    const overdueAt = bumpedAt + MAX_CONFIRM_ROUNDS * CONFIRM_MS + 1000;
    expect(overdueAt - bumpedAt).toBeGreaterThan(FROZEN_CONFIG.lockLeaseMs);
    await waitFor(() => Date.now() > overdueAt, "the plan to age past its confirm rounds", 60_000, 200);
    const stillPlan = (await active.topology()) as Topology;
    expect(stillPlan, "the plan unchanged during the freeze").toMatchObject({
      status: "failing_over",
      phase: "promote",
      epoch: plan.epoch,
    });
    const roleOf2 = await roleOf(node2);
    expect(roleOf2.role, "node-2 still a replica: no PROMOTE reached it").toBe("slave");

    // Act 3: the next invocation: a controller process of the cluster.
    const resumedAt = performance.now();
    const startedPastOverdueMs = Date.now() - overdueAt;
    active.startController();
    const seen: string[] = [];
    await active.waitFor(
      "the shard online again",
      async () => {
        const topology = await active.topology();
        const state = `${topology?.epoch}:${topology?.status}:${topology?.phase ?? "-"}:${topology?.failover?.new_primary_node_id ?? topology?.primary_node_id ?? "-"}`;
        if (seen.at(-1) !== state) seen.push(state);
        return topology?.status === "online";
      },
      WAIT_MS,
    );
    const onlineMs = Math.round(performance.now() - resumedAt);
    await waitForSettled(active, ["node-2", "node-3"]);

    // The frozen controller thaws (its PROMOTE, at its epoch, then the lock lost) and ends.
    gate.release();
    const thawed = await Promise.race([
      frozenRun?.then((result) => {
        const { outcome, reason } = result as { outcome?: string; reason?: string };
        return `${outcome}: ${reason}`;
      }),
      new Promise<string>((resolve) => setTimeout(() => resolve("still running"), WAIT_MS)),
    ]);

    // Assess: node-2 the primary at the plan's epoch, every acknowledged key on both nodes.
    const after = (await active.topology()) as Topology;
    const continuations = linesWith(active.controllerLogLines(), "continuing failover").map(
      (line) => `${line.continuation}: ${line.reason}`,
    );
    const held: Record<string, string> = {};
    for (const node of [node2, node3])
      held[node.id] =
        `${await existing(node, `${PREFIX}:before`, BEFORE_KEYS)}/${BEFORE_KEYS} before, ` +
        `${await existing(node, `${PREFIX}:lag`, LAG_KEYS)}/${LAG_KEYS} lag`;
    console.log(
      `plan epoch ${plan.epoch} -> node-2, its controller frozen at ${gate.frozenAt?.op}; next controller started ${startedPastOverdueMs} ms past ` +
        `overdue; topology: ${seen.join(" -> ")}; online ${onlineMs} ms after\n` +
        `next controller: ${continuations.join(" | ") || "no continuation logged"}\nthawed controller: ${thawed}\n` +
        `keys held: ${JSON.stringify(held)}`,
    );
    for (const node of [node2, node3]) {
      expect(await existing(node, `${PREFIX}:before`, BEFORE_KEYS), `${node.id}: keys before`).toBe(
        BEFORE_KEYS,
      );
      expect(await existing(node, `${PREFIX}:lag`, LAG_KEYS), `${node.id}: keys node-2 acknowledged`).toBe(
        LAG_KEYS,
      );
    }
    expect(
      { status: after.status, primary: after.primary_node_id, epoch: after.epoch },
      `topology after resuming: ${seen.join(" -> ")}`,
    ).toEqual({ status: "online", primary: "node-2", epoch: plan.epoch });
    expect(continuations[0], "the next controller's continuation").toMatch(/^continue: /);
  });
});
