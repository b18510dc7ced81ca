import { afterEach, describe, expect, it } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Command, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  describeInfo,
  describeReport,
  linesWith,
  replicationOf,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { cycleUntilFrozen, Gate, type TestController, testController } from "../support/frozen-controller.ts";
import { hangPrimaryParkReplicas, planOnto } from "../support/hung-primary.ts";

/**
 * Simulator seed 325407 (guarantee 3, liveness: a database parked for good), with real
 * redis-server processes and agents, DynamoDB Local and SQS.
 *
 * node-1 primary on lineage L; node-2 and node-3 its replicas, every key acknowledged by both. node-1
 * hangs whole (agent and database SIGSTOPped); the replicas' probes park them. A failover to node-2
 * is planned (epoch e+1, phase promote) and node-3 points at its target. node-1 wakes for a moment and
 * takes a tail of writes nobody acknowledges (the replicas' agents stopped meanwhile) (in the seed, SETs queued on the hung primary that ran
 * on waking), then hangs again. node-2 applies its PROMOTE (a new id P continuing L at the
 * promotion point x) and node-3, chained behind it, takes P; node-2's agent reports it and then
 * stops (SIGSTOP: its report stays). The retarget to node-3 (epoch e+2) was decided on node-3's
 * report before node-3 took P: it names no link (\`target_link\`), as in the seed, where node-2
 * applied its PROMOTE 33 ms before the replan's write. These two topology writes are the test's own,
 * as the controllers that made them leave them (the real controller's interleaving is a race the
 * test cannot time; docs/simulation.md Findings 325407).
 *
 * Then a real controller (in-process, behind a gate) continues the plan: PROMOTE to node-3 (a new
 * id B continuing P at x), confirm, repoint, and it stops right before the topology write that
 * completes the change. There node-1 wakes: its agent steps it down to node-3, judged against the
 * topology of a change under way (no lineage history, only L recorded): node-3 holds none of node-1's
 * tail, on a lineage the record does not name, so node-1 is parked (\`judgeFollow\`). The gate
 * opens and the change completes.
 *
 * Before the fix the completion recorded only the final promotion's link (P -> B): nothing said P
 * continued L, so node-1's probe found node-3 neither holding node-1's data nor superseding it and
 * node-1 stayed parked for good. Now the completion also records the link from the plan's lineage
 * to the one the promoted database continues, as a peer's report shows it (node-2's: P continues L
 * to x; \`bridgingLink\`, src/core/identity.ts), and node-1's probe follows node-3 (its tail, never
 * acknowledged, is dropped as any failover drops it).
 * No fixed sleeps: every wait is on a condition with a deadline.
 */

const PREFIX = "retarget-late-promote";
const KEYS = 200;
/** Writes node-1 takes on waking that nobody acknowledges: the tail past the promotion point. */
const TAIL = 20;
/** A failure timeout of 3 s: agents slowed by a loaded machine do not look dead mid-failover. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
const CONTROLLER_CONFIG = parseFailoverConfig({ ...CONFIG, lockLeaseMs: 60_000 });
/** From the completion: node-1's probe sees node-3 superseding its lineage and follows it. */
const FOLLOWS_WITHIN_MS = 30_000;

let cluster: LocalCluster | undefined;
const controllers: TestController[] = [];

afterEach(async (context) => {
  for (const controller of controllers) controller.gate?.release();
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  for (const id of ["node-1", "node-2", "node-3"]) cluster?.signalAgent(id, "SIGCONT");
  for (const node of cluster?.redis ?? []) node.signal("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** The topology write that completes a change (status online): the gate's freeze point. */
const beforeCompletion = {
  name: "the completion's topology write",
  matches: (call: { op: string; args: readonly unknown[] }) =>
    call.op === "topology.compareAndSet" && (call.args[2] as Topology | undefined)?.status === "online",
};

describe("a retarget whose target continued the earlier target's late promotion (simulator seed 325407)", () => {
  it("records the earlier target's link, so the old primary parked with an unacknowledged tail follows the new primary", {
    timeout: 300_000,
  }, async () => {
    // Prepare: node-1 primary on L, every key acknowledged by node-2 and node-3; node-1 hangs whole
    // and the replicas' probes park them.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const scene = await hangPrimaryParkReplicas(active, PREFIX, KEYS);
    const { node1, node2, node3, x, online } = scene;
    const lineageL = scene.lineage.repl_id;

    // The first plan: fail over to node-2 (epoch e+1, phase promote); node-3 follows its target.
    const firstAt = Date.now();
    const first = planOnto(active, scene, "node-2", firstAt, "test: primary node-1 is stale (seed 325407)");
    const e1 = online.epoch + 1;
    const planned: Topology = {
      ...online,
      epoch: e1,
      status: "failing_over",
      phase: "promote",
      updated_at: firstAt,
      failover: first,
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, online.epoch, planned)).toBe(true);
    // (Its link stays down: a replica whose own link is down refuses syncs, NOMASTERLINK; node-3
    // links once node-2 is promoted, continuing onto its new id.)
    await active.waitFor(
      "node-3 pointed at node-2",
      async () => (await replicationOf(node3)).primary?.port === node2.port,
      WAIT_MS,
    );

    // node-1 wakes for a moment: a tail nobody acknowledges, then it hangs again. The replicas'
    // agents are stopped meanwhile: a parked replica's probe follows the very process it was parked
    // from once it answers (in the seed node-1's agent stepped it down 13 ms after it woke).
    for (const id of ["node-2", "node-3"]) active.signalAgent(id, "SIGSTOP");
    node1.signal("SIGCONT");
    await withClient(node1, (client) => client.config("SET", "min-replicas-to-write", "0"));
    await writeKeys(node1, `${PREFIX}:tail`, TAIL, 0);
    const tail = await replicationOf(node1);
    node1.signal("SIGSTOP");
    for (const id of ["node-2", "node-3"]) active.signalAgent(id, "SIGCONT");
    expect(tail.replId).toBe(lineageL);
    expect(tail.offset, "node-1's tail past the replicas").toBeGreaterThan(x);
    expect((await replicationOf(node2)).offset, "node-2 never took the tail").toBe(x);

    // node-2 applies its PROMOTE (P continuing L at x); node-3 takes P; node-2's agent reports it, then stops.
    const promote: Command = {
      type: "PROMOTE",
      shard: active.shard,
      epoch: e1,
      command_id: `${active.shard}:${e1}:PROMOTE:node-2`,
      issued_at: Date.now(),
    };
    await active.aws.bus.send(active.shard, "node-2", promote);
    let lineageP = "";
    await active.waitFor(
      "node-2 promoted on P continuing L, reported; node-3 on P",
      async () => {
        const promoted = await replicationOf(node2);
        const followed = await replicationOf(node3);
        const report = active.heartbeatOf(await active.snapshot(), "node-2");
        lineageP = promoted.replId;
        return (
          promoted.role === "primary" &&
          promoted.prior?.replId === lineageL &&
          report?.repl_id === lineageP &&
          report.prior_lineage?.repl_id === lineageL &&
          followed.replId === lineageP &&
          followed.primary?.link === "up"
        );
      },
      WAIT_MS,
    );
    active.signalAgent("node-2", "SIGSTOP");
    const promotionPoint = (await replicationOf(node2)).prior?.offset ?? -1;
    expect(promotionPoint).toBe(x);

    // The retarget to node-3 (epoch e+2), decided on its report before it took P: no target_link;
    // node-2, past its PROMOTE, deposed.
    const replanAt = Date.now();
    const e2 = e1 + 1;
    const replanned: Topology = {
      ...planned,
      epoch: e2,
      updated_at: replanAt,
      deposed: [{ node_id: "node-2", address: node2.address, epoch: e2 }],
      failover: {
        ...first,
        new_primary_node_id: "node-3",
        new_primary_address: node3.address,
        candidates: first.candidates.filter((candidate) => candidate.node_id === "node-3"),
        reason: "test: target node-2 did not confirm in time after PROMOTE; promoting node-3 instead",
        phase_started: { locked: replanAt, epoch_bumped: replanAt, promote: replanAt },
      },
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, e1, replanned)).toBe(true);

    // Act 1: a controller continues the plan and stops right before the completion's write.
    const gate = new Gate(beforeCompletion);
    const controller = testController(active.env, CONTROLLER_CONFIG, gate);
    controllers.push(controller);
    const frozenRun = (
      await cycleUntilFrozen(controller, active.shard, "the controller to reach the completion", 4 * WAIT_MS)
    ).run;
    const promoted3 = await replicationOf(node3);
    expect(
      { role: promoted3.role, prior: promoted3.prior?.replId },
      `node-3 promoted continuing P: ${describeInfo("node-3", promoted3)}`,
    ).toEqual({ role: "primary", prior: lineageP });

    // node-1 wakes and is stepped down to node-3 against the change's topology: parked.
    node1.signal("SIGCONT");
    active.signalAgent("node-1", "SIGCONT");
    const refusedLines = () =>
      linesWith(
        active.logLines("agent-node-1.log"),
        /^not following the named primary: its database holds none/,
      );
    await active.waitFor(
      "node-1 parked by its agent instead of following node-3 (the log line written)",
      async () => (await roleOf(node1)).primaryPort === PARKED_PORT && refusedLines().length > 0,
      WAIT_MS,
    );
    const refusals = refusedLines().length;

    // Act 2: the change completes.
    gate.release();
    const completion = (await frozenRun) as { outcome?: string; reason?: string } | undefined;
    const completedAt = performance.now();
    const done = (await active.topology()) as Topology;

    // Assess: node-1 follows node-3 within FOLLOWS_WITHIN_MS (before the fix: parked to the end).
    let last = "";
    const followed = await active
      .waitFor(
        "node-1 following node-3 with its link up",
        async () => {
          const info = await replicationOf(node1);
          last = describeInfo("node-1", info);
          return info.role === "replica" && info.primary?.port === node3.port && info.primary.link === "up";
        },
        FOLLOWS_WITHIN_MS,
      )
      .then(
        () => true,
        () => false,
      );
    const tookMs = Math.round(performance.now() - completedAt);
    const diagnostics =
      `L ${lineageL.slice(0, 6)} to ${x}, node-1's tail to ${tail.offset}; P ${lineageP.slice(0, 6)}, ` +
      `B ${promoted3.replId.slice(0, 6)}\ncompletion: ${completion?.outcome}: ${completion?.reason}\n` +
      `ancestry: ${JSON.stringify(done.ancestry?.map((link) => `${link.repl_id.slice(0, 6)}->${link.by.slice(0, 6)}@${link.until}`))}\n` +
      `node-1's agent refused node-3 ${refusals} time(s); node-1 now: ${last}\n` +
      `unparked: ${linesWith(active.logLines("agent-node-1.log"), "replica unparked")
        .map((line) => String(line.why))
        .join(" | ")}\nreports: ${(await active.snapshot()).nodes.map(describeReport).join("; ")}`;
    console.log(
      `${diagnostics}\nnode-1 following node-3 ${followed ? `${tookMs} ms after the completion` : "never"}`,
    );

    expect(completion?.outcome, diagnostics).toBe("completed");
    expect(done).toMatchObject({ status: "online", primary_node_id: "node-3", epoch: e2 });
    expect(refusals, `node-1 parked by judgeFollow:\n${diagnostics}`).toBeGreaterThan(0);
    expect(done.ancestry, diagnostics).toContainEqual({ repl_id: lineageL, until: x, by: lineageP });
    expect(followed, `node-1 follows node-3 within ${FOLLOWS_WITHIN_MS} ms:\n${diagnostics}`).toBe(true);
    expect(await countKeys(node3, `${PREFIX}:acked`, KEYS)).toBe(KEYS);
    await active.waitFor(
      "node-1 holding every acknowledged key",
      async () => (await countKeys(node1, `${PREFIX}:acked`, KEYS)) === KEYS,
      WAIT_MS,
    );
  });
});
