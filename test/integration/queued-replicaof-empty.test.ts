import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import { CRASH_CONFIRM_MS } from "../../src/core/crash.ts";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  probeWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * REPRODUCTION OF AN OPEN HOLE (docs/open-holes/README.md, first row: simulator hunt seed 7039; analysis in
 * docs/open-holes/sim-7039-analysis.md). It FAILS ON MAIN BY DESIGN: it documents the hole for the session
 * that fixes it and is not part of the suite. No fix commit exists yet.
 *
 * Guarantee 1, with real redis-server processes, agents, controllers, DynamoDB Local and SQS. The scenario
 * is the one of promoted-restarted-empty.test.ts (simulator seed 7011, fixed by 5e0772a), with one ordering
 * changed: node-1 primary, node-2 and node-3 members, every key acknowledged by both (`WAIT 2`). node-1's
 * database is killed and stays down; both replicas' agents park them. The controller promotes node-2 at a
 * new epoch; node-3's agent is stopped (SIGSTOP) as soon as the epoch moves, so node-3 stays parked with
 * every acknowledged key and the failover's `REPLICAOF node-2` command for it waits in its SQS queue.
 * node-2's database is then killed and restarted EMPTY at the same address (fenced by its config), the
 * controllers frozen, and node-2's agent fences it ("restarted without its data"). Then node-3's agent is
 * continued BEFORE the controllers (the merged test continues it only after they moved the shard past
 * node-2's epoch, which drops the stale command): the topology still names node-2 at the queued command's
 * epoch, so `screenCommand` passes the command (and the topology read would repoint it there too), and
 * `becomeReplicaOf` (src/agent/node-control.ts) issues `REPLICAOF node-2` without judging the target's
 * lineage: node-3 full-syncs node-2's empty dataset and every acknowledged key is lost (seen last session:
 * 1,000 of 1,000). The probe's `syncWouldDestroy` guard (src/agent/primary-probe.ts) covers only processes
 * the agent never pointed.
 *
 * The fix it calls for: a replica-side `syncWouldDestroy` on the target's INFO before any `REPLICAOF` the
 * agent issues (commands and topology repoints included): a target that does not hold this replica's
 * lineage (restarted empty: offset 0, a new replid, no replid2 continuing it) is not followed; the replica
 * stays parked and reports it. With a liveness rule for the last resort's deliberate step-down (a primary
 * the controller chose knowing it is behind must still be followable when the topology says so).
 * Once fixed, node-3 stays parked with every key, the controllers move the shard past node-2's epoch and
 * bring it back on node-3, and this test passes.
 */

const PREFIX = "queued-replicaof-empty";
const BATCHES = 4;
const PER_BATCH = 250;
/** The replicas' keepalive: each writes its report every cycle or two instead of every 5 s. */
const REPLICA_KEEPALIVE_MS = "500";
/** The offline path may wait the last resort's grace for node-1 (dead) before bringing the shard back. */
const RECOVER_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs + 2 * WAIT_MS;
const FENCED = "database restarted without its data: fenced until it follows the shard's primary";

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  cluster?.signalAgent("node-3", "SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** A database's process and replication as INFO gives them. */
async function replicationOf(node: RedisNode) {
  return withClient(node, async (client) => {
    const info = `${String(await client.info("server"))}\n${String(await client.info("replication"))}`;
    const field = (name: string) => new RegExp(`^${name}:(\\S+)`, "m").exec(info)?.[1] ?? "";
    return {
      runId: field("run_id"),
      role: field("role"),
      replId: field("master_replid"),
      offset: Number(field("master_repl_offset")),
      replId2: field("master_replid2"),
    };
  });
}

function freezeControllers(active: LocalCluster, signal: "SIGSTOP" | "SIGCONT"): void {
  for (const controller of active.controllers) controller.child.kill(signal);
}

describe("a parked replica holding every acknowledged key, its queued REPLICAOF naming a primary since restarted empty and fenced (open hole 7039; fails on main by design)", () => {
  it("does not follow the empty process when its agent runs before the controllers, and the shard comes back with every acknowledged key", {
    timeout: 360_000,
  }, async () => {
    // Prepare: node-1 primary, node-2 and node-3 linked members; every key acknowledged by both.
    cluster = await startChaosCluster({
      readyTimeoutMs: 120_000,
      agentEnv: (id) => (id === "node-1" ? undefined : { [ENV.replicaKeepaliveMs]: REPLICA_KEEPALIVE_MS }),
    });
    const active = cluster;
    const [n1, n2, n3] = ["node-1", "node-2", "node-3"].map((id) => active.node(id)) as [
      RedisNode,
      RedisNode,
      RedisNode,
    ];
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await active.waitFor(
      "node-2 and node-3 in node-1's replica set",
      async () => {
        const stored = (await active.snapshot()).replicaSets["node-1"] ?? [];
        return stored.includes("node-2") && stored.includes("node-3");
      },
      WAIT_MS,
    );
    for (let batch = 0; batch < BATCHES; batch++) await writeKeys(n1, `${PREFIX}:${batch}`, PER_BATCH, 2);
    const missingOn = async (node: RedisNode) => {
      let missing = 0;
      for (let batch = 0; batch < BATCHES; batch++)
        missing += PER_BATCH - (await countKeys(node, `${PREFIX}:${batch}`, PER_BATCH));
      return missing;
    };
    expect(await missingOn(n2)).toBe(0);
    expect(await missingOn(n3)).toBe(0);
    const lineage = await replicationOf(n1);
    const start = (await active.topology()) as Topology;
    expect(start.primary_node_id).toBe("node-1");

    // Act: the controllers frozen, node-1's database dies and stays down; its agent confirms the
    // crash, both replicas' agents park them and report so.
    freezeControllers(active, "SIGSTOP");
    n1.signal("SIGKILL");
    await n1.stop();
    const killedAt = Date.now();
    await active.waitFor(
      "node-1's crash confirmed by its agent, node-2 and node-3 parked and reporting since",
      async () => {
        const snapshot = await active.snapshot();
        const crash = active.heartbeatOf(snapshot, "node-1")?.db_crash;
        if (crash === undefined || crash.last_seen - crash.first_seen < CRASH_CONFIRM_MS * 1000) return false;
        for (const node of [n2, n3]) {
          const heartbeat = active.heartbeatOf(snapshot, node.id);
          if ((heartbeat?.agent_updated ?? 0) / 1000 <= killedAt || heartbeat?.primary_link !== "down")
            return false;
          if ((await roleOf(node)).primaryPort !== PARKED_PORT) return false;
        }
        return true;
      },
      WAIT_MS,
    );

    // The controllers resume and fail over; node-3's agent is frozen as soon as the epoch moves
    // (node-3 stays parked, its repoint waits in its queue), before node-2's PROMOTE is confirmed.
    freezeControllers(active, "SIGCONT");
    let bumped: Topology | undefined;
    const deadline = performance.now() + WAIT_MS;
    while (bumped === undefined && performance.now() < deadline) {
      const topology = await active.topology().catch(() => undefined);
      if (topology !== undefined && topology.epoch > start.epoch) bumped = topology;
    }
    active.signalAgent("node-3", "SIGSTOP");
    expect(bumped, "a failover decided").toBeDefined();
    const n3Role = await roleOf(n3);
    expect(
      { role: n3Role.role, port: n3Role.primaryPort },
      "node-3 still parked when its agent froze (else the scenario's premise is lost)",
    ).toEqual({ role: "slave", port: PARKED_PORT });

    // node-2 promoted at the new epoch, confirmed, its writes open with no replica in its set.
    let promoted: Topology | undefined;
    await active.waitFor(
      "node-2 the online primary at the new epoch, its writes open, its replica set empty",
      async () => {
        const topology = await active.topology();
        if (topology?.status !== "online" || topology.epoch <= start.epoch) return false;
        promoted = topology;
        if (topology.primary_node_id !== "node-2") return true;
        const snapshot = await active.snapshot();
        const heartbeat = active.heartbeatOf(snapshot, "node-2");
        if (heartbeat?.role !== "primary" || heartbeat.epoch !== topology.epoch) return false;
        if ((snapshot.replicaSets["node-2"] ?? []).length > 0) return true;
        const guard = await withClient(n2, (client) => client.config("GET", "min-replicas-to-write"));
        return Number((guard as string[])[1]) === 0;
      },
      WAIT_MS,
    );
    expect(promoted?.primary_node_id, "the controller promoted node-2").toBe("node-2");
    const epoch = promoted?.epoch ?? 0;
    const promotedAs = await replicationOf(n2);
    const setAtPromotion = (await active.snapshot()).replicaSets["node-2"] ?? [];
    expect(setAtPromotion, "node-2's replica set at the new epoch").toEqual([]);
    expect(promotedAs.replId2, "node-2 promoted from node-1's lineage").toBe(lineage.replId);
    expect((await roleOf(n3)).primaryPort, "node-3 still parked").toBe(PARKED_PORT);

    // Act: the controllers frozen, node-2's database dies right after its promotion and comes back
    // EMPTY at the same address, fenced by its config as a supervisor starts it.
    freezeControllers(active, "SIGSTOP");
    const linesBefore = active.logLines("agent-node-2.log").length;
    n2.signal("SIGKILL");
    await n2.stop();
    n2.wipeData();
    await n2.start({ extraArgs: FENCED_START_ARGS });
    const empty = await replicationOf(n2);
    expect(await missingOn(n2), "node-2 restarted empty").toBe(BATCHES * PER_BATCH);
    let verdict: Record<string, unknown> | undefined;
    await active.waitFor(
      "node-2's agent's verdict on its restarted database",
      () => {
        verdict = active
          .logLines("agent-node-2.log")
          .slice(linesBefore)
          .find(
            (line) => line.runId === empty.runId && String(line.message).startsWith("database restarted"),
          );
        return verdict !== undefined;
      },
      WAIT_MS,
    );

    // Act: node-3's agent runs again BEFORE the controllers (still frozen: the topology names node-2
    // at the queued command's epoch). Its queued `REPLICAOF node-2` passes the epoch screen (and its
    // topology read names node-2 too): it points node-3 at node-2's empty, fenced process. Wait until
    // node-3 is linked to it (the full sync done) or that wait is over (a fixed agent refuses).
    const node3LinesBefore = active.logLines("agent-node-3.log").length;
    active.signalAgent("node-3", "SIGCONT");
    const followedEmpty = await active
      .waitFor(
        "node-3 linked to node-2's restarted empty process",
        async () => {
          const role = await roleOf(n3);
          return role.role === "slave" && role.primaryPort === n2.port && role.state === "connected";
        },
        WAIT_MS,
      )
      .then(
        () => true,
        () => false,
      );
    const node3Said = active
      .logLines("agent-node-3.log")
      .slice(node3LinesBefore)
      .map(
        (line) =>
          `${String(line.message)}${line.commandType === undefined ? "" : ` ${String(line.commandType)} ${String(line.primary)} at epoch ${String(line.commandEpoch)}`}` +
          `${line.reason === undefined ? "" : ` (${String(line.reason)})`}`,
      )
      .filter((message, index, all) => all.indexOf(message) === index)
      .slice(0, 8);
    const n3Missing = await missingOn(n3);

    // Act: the controllers run again.
    freezeControllers(active, "SIGCONT");

    // Assess: an online primary past node-2's epoch that takes writes and holds every acknowledged
    // key, node-2 following it with every key too.
    let serving: Topology | undefined;
    const seen: string[] = [];
    const recovered =
      n3Missing === BATCHES * PER_BATCH && (await missingOn(n2)) === BATCHES * PER_BATCH
        ? "not waited for: node-1 is down for good and node-2 and node-3 hold none of the acknowledged keys"
        : await active
            .waitFor(
              "an online primary holding every acknowledged key, taking writes, node-2 following it with every key",
              async () => {
                const topology = await active.topology();
                if (topology === undefined) return false;
                const state = `${topology.epoch}:${topology.status}:${topology.primary_node_id ?? "-"}`;
                if (seen.at(-1) !== state) seen.push(state);
                if (topology.status !== "online" || topology.primary_node_id === undefined) return false;
                const primary = active.node(topology.primary_node_id);
                if ((await missingOn(primary)) !== 0) return false;
                if (!(await probeWrite(primary, `${PREFIX}:after`)).accepted) return false;
                serving = topology;
                if (primary.id === "node-2") return true;
                const role = await roleOf(n2);
                return (
                  role.role === "slave" &&
                  role.primaryPort === primary.port &&
                  role.state === "connected" &&
                  (await missingOn(n2)) === 0
                );
              },
              RECOVER_MS,
            )
            .then(
              () => "",
              (error: unknown) => (error instanceof Error ? error.message : String(error)),
            );
    const history = (await active.aws.store.history.list(active.shard, 100)).filter(
      (record) => record.epoch > start.epoch,
    );
    const missing: Record<string, number> = {};
    for (const node of [n2, n3]) missing[node.id] = await missingOn(node).catch(() => -1);
    console.log(
      `node-1's lineage ${lineage.replId.slice(0, 6)}@${lineage.offset}; node-2 promoted at epoch ${epoch} ` +
        `(${promotedAs.replId.slice(0, 6)}, replid2 ${promotedAs.replId2.slice(0, 6)}), its set [${setAtPromotion.join(", ")}]; ` +
        `node-3 frozen at topology ${bumped?.status}/${bumped?.phase ?? "-"}\n` +
        `node-2's agent on its empty process: ${String(verdict?.message)} (${String(verdict?.why ?? "")})\n` +
        `node-3's agent resumed before the controllers: linked to node-2's empty process: ${followedEmpty}; ` +
        `acknowledged keys missing on node-3 then: ${n3Missing}; its agent said: ${node3Said.join(" | ")}\n` +
        `topology since: ${seen.join(" -> ")}; ${serving ? `serving on ${serving.primary_node_id} at epoch ${serving.epoch}` : "no primary with every key"}\n` +
        `acknowledged keys missing: ${JSON.stringify(missing)}\n` +
        `history since: ${history.map((record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`).join(" | ")}`,
    );
    expect(verdict?.message, "node-2's agent fenced its empty process (the scenario's premise)").toBe(FENCED);
    expect(
      { missingAcknowledged: missing, recovered },
      "every WAIT 2-acknowledged key survives on node-3 and on the shard's final primary",
    ).toEqual({ missingAcknowledged: { "node-2": 0, "node-3": 0 }, recovered: "" });
  });
});
