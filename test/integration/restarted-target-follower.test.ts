import { afterEach, describe, expect, it } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { Topology } from "../../src/core/model.ts";
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
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { hangPrimaryParkReplicas, planOnto } from "../support/hung-primary.ts";

/**
 * Simulator seed 500367 (guarantee 1; 5 replica-acknowledged writes lost), with real redis-server
 * processes and agents, DynamoDB Local and SQS.
 *
 * node-1 primary on lineage L; node-2 and node-3 its replicas, every key acknowledged by both (to
 * offset x). node-1 hangs whole; the replicas' probes park them. A failover to node-2 is planned
 * (epoch e+1, phase promote, node-2 ranked on x) and node-3 points at its target. node-2's database
 * is killed; node-1 wakes, takes a tail nobody acknowledges (the replicas' agents stopped meanwhile),
 * and its agent steps it down to node-2, which does not answer: parked (its report: L past x).
 * node-2's database is restarted from its RDB at x, a master on a new id M continuing L to x; its
 * agent fences it ("restarted without its data": node-1 reports more of L) and reports it down and
 * restarted. node-3 links to that process and
 * takes M. Then node-2 takes writes node-3 acknowledges (in the seed after the PROMOTE it applied
 * 14 ms before the retarget's read, reported after it; here by hand, its agent stopped for the
 * writes: the fence lifted with \`min-replicas-to-write 1\`; the agent then fences it again and its
 * report stays the crashed replica's). The plan's two
 * topology writes are the test's own, as the controller that made them leaves them; a controller
 * process then continues the plan.
 *
 * Before the fix the retarget read no promotion from node-3 (the target crashed since its last
 * report: the rule of simulator seed 171777, whose restarted target's RDB was behind), judged node-3
 * "foreign replication lineage M, expected L", took the shard offline and brought it back on node-1
 * (L past x): node-3 full-synced from it and the writes it acknowledged were gone. Now a crashed
 * target's linked follower vouches for it when its earlier lineage reaches the offset the plan
 * ranked the target on (\`targetPromotion\`, src/core/decide/retarget.ts): node-3 is promoted with
 * every acknowledged write. No fixed sleeps: every wait is on a condition with a deadline.
 */

const PREFIX = "restarted-target-follower";
const KEYS = 200;
/** Writes node-1 takes on waking that nobody acknowledges: L past the plan's point. */
const TAIL = 20;
/** Writes node-2's restarted process takes, each acknowledged by node-3 (`WAIT 1`). */
const ON_M = 50;
/** A failure timeout of 3 s: agents slowed by a loaded machine do not look dead mid-failover. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** From the controller's start: the retarget (or the offline mark and bring-online), PROMOTE, confirm. */
const SERVING_WITHIN_MS = 60_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const id of ["node-1", "node-2", "node-3"]) cluster?.signalAgent(id, "SIGCONT");
  for (const node of cluster?.redis ?? []) node.signal("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a failover's target restarted from an RDB at its ranked offset, its follower holding what it took (simulator seed 500367)", () => {
  it("promotes the follower linked to the restarted target, with every acknowledged write", {
    timeout: 300_000,
  }, async () => {
    // Prepare: node-1 primary on L, every key acknowledged by node-2 and node-3; node-1 hangs whole
    // and the replicas' probes park them.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const scene = await hangPrimaryParkReplicas(active, PREFIX, KEYS);
    const { node1, node2, node3, x, online } = scene;
    const lineageL = scene.lineage.repl_id;

    // The plan: fail over to node-2, ranked on x (epoch e+1, phase promote, its confirm rounds spent).
    const bumpedAt = Date.now() - 60_000;
    const plan = planOnto(active, scene, "node-2", bumpedAt, "test: primary node-1 is stale (seed 500367)");
    const e1 = online.epoch + 1;
    const planned: Topology = {
      ...online,
      epoch: e1,
      status: "failing_over",
      phase: "promote",
      updated_at: bumpedAt,
      failover: plan,
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, online.epoch, planned)).toBe(true);
    await active.waitFor(
      "node-3 pointed at node-2",
      async () => (await replicationOf(node3)).primary?.port === node2.port,
      WAIT_MS,
    );
    await withClient(node2, (client) => client.save());

    // node-2's database dies (its RDB at x kept). node-1 wakes with a tail nobody acknowledges; its
    // agent steps it down to node-2, which does not answer: parked from it. The replicas' agents are
    // stopped until then: a parked replica's probe follows the very process it was parked from once
    // it answers as a primary.
    node2.signal("SIGKILL");
    await node2.stop();
    for (const id of ["node-2", "node-3"]) active.signalAgent(id, "SIGSTOP");
    node1.signal("SIGCONT");
    await withClient(node1, (client) => client.config("SET", "min-replicas-to-write", "0"));
    await writeKeys(node1, `${PREFIX}:tail`, TAIL, 0);
    const tail = (await replicationOf(node1)).offset;
    active.signalAgent("node-1", "SIGCONT");
    await active.waitFor(
      "node-1 parked from node-2 by its agent, reporting L past x",
      async () => {
        const report = active.heartbeatOf(await active.snapshot(), "node-1");
        return (
          (await roleOf(node1)).primaryPort === PARKED_PORT &&
          report?.role === "replica" &&
          report.repl_id === lineageL &&
          report.last_txn_id === tail
        );
      },
      WAIT_MS,
    );
    for (const id of ["node-2", "node-3"]) active.signalAgent(id, "SIGCONT");
    expect(tail, "node-1's tail past x").toBeGreaterThan(x);

    // node-2's database comes back from its RDB at x: a master on M continuing L to x.
    await node2.start({ extraArgs: FENCED_START_ARGS });
    const restarted = await replicationOf(node2);
    expect(
      { role: restarted.role, prior: restarted.prior?.replId, at: restarted.prior?.offset },
      `node-2 back from its RDB: ${describeInfo("node-2", restarted)}`,
    ).toEqual({ role: "primary", prior: lineageL, at: x });
    const lineageM = restarted.replId;
    let reports = "";
    await active
      .waitFor(
        "node-2 reported restarted without its data, node-3 on M linked to it",
        async () => {
          const snapshot = await active.snapshot();
          const target = active.heartbeatOf(snapshot, "node-2");
          const follower = active.heartbeatOf(snapshot, "node-3");
          reports = [target, follower].map(describeReport).join("; ");
          const info = await replicationOf(node3);
          return (
            target?.db_status === "down" &&
            target.db_crash?.state === "restarted" &&
            info.replId === lineageM &&
            info.primary?.port === node2.port &&
            info.primary.link === "up" &&
            follower?.repl_id === lineageM &&
            follower.prior_lineage?.repl_id === lineageL &&
            follower.primary_node_id === "node-2" &&
            follower.primary_link === "up" &&
            follower.epoch >= e1
          );
        },
        WAIT_MS,
      )
      .catch((error: unknown) => {
        throw new Error(`${error instanceof Error ? error.message : String(error)}; reports: ${reports}`);
      });

    // node-2 takes writes node-3 acknowledges, its agent stopped meanwhile.
    active.signalAgent("node-2", "SIGSTOP");
    await withClient(node2, (client) => client.config("SET", "min-replicas-to-write", "1"));
    await writeKeys(node2, `${PREFIX}:on-m`, ON_M, 1);
    expect(await countKeys(node3, `${PREFIX}:on-m`, ON_M), "node-3 holds the keys on M").toBe(ON_M);
    // Its agent goes on (heard, as in the seed), keeping the fence of the restart and its report.
    active.signalAgent("node-2", "SIGCONT");

    // Act: a controller continues the plan.
    const startedAt = performance.now();
    active.startController();

    // Assess: online on a writable primary holding every acknowledged key (before the fix: offline,
    // back on node-1, node-3 full-synced from it).
    const seen: string[] = [];
    let serving: Topology | undefined;
    let lastCheck = "";
    await active
      .waitFor(
        "an online primary past the plan's epoch taking writes",
        async () => {
          const topology = await active.topology();
          if (topology === undefined) return false;
          const state = `${topology.epoch}:${topology.status}:${topology.failover?.new_primary_node_id ?? topology.primary_node_id ?? "-"}`;
          if (seen.at(-1) !== state) seen.push(state);
          if (topology.status !== "online" || topology.epoch <= e1) return false;
          const probe = await probeWrite(active.node(topology.primary_node_id ?? ""), `${PREFIX}:probe`);
          lastCheck = `${topology.primary_node_id} ${probe.role}: ${probe.accepted ? "accepted" : probe.refusal}`;
          if (!probe.accepted) return false;
          serving = topology;
          return true;
        },
        SERVING_WITHIN_MS,
      )
      .catch(() => undefined);
    const tookMs = Math.round(performance.now() - startedAt);
    const continuations = linesWith(active.controllerLogLines(), "continuing failover").map(
      (line) => `${line.continuation}: ${line.reason}`,
    );
    const primaryId = serving?.primary_node_id ?? "";
    const kept = primaryId === "" ? -1 : await countKeys(active.node(primaryId), `${PREFIX}:on-m`, ON_M);
    const diagnostics =
      `L ${lineageL.slice(0, 6)} to ${x}, node-1's tail to ${tail}, M ${lineageM.slice(0, 6)}\n` +
      `topology: ${seen.join(" -> ")}; ${serving ? `serving on ${primaryId} ${tookMs} ms after the controller started` : `none within ${SERVING_WITHIN_MS} ms (${lastCheck || "never online"})`}\n` +
      `continuations: ${continuations.slice(0, 3).join(" | ") || "none"}\n` +
      `keys on M on the primary: ${kept} of ${ON_M}\nreports: ${(await active.snapshot()).nodes.map(describeReport).join("; ")}`;
    console.log(diagnostics);

    expect(serving, `a writable primary within ${SERVING_WITHIN_MS} ms:\n${diagnostics}`).toBeDefined();
    expect(kept, `every key node-3 acknowledged on the primary ${primaryId}:\n${diagnostics}`).toBe(ON_M);
    expect(await countKeys(active.node(primaryId), `${PREFIX}:acked`, KEYS)).toBe(KEYS);
  });
});
