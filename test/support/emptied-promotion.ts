import { expect } from "vitest";
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
} from "./chaos-cluster.ts";

/**
 * The scene of simulator seed 7011 with real processes, shared by promoted-restarted-empty.test.ts
 * and queued-replicaof-empty.test.ts (open hole 7039): node-1 primary, node-2 and node-3 members,
 * every key acknowledged by both (\`WAIT 2\`); node-1's database killed for good, both replicas
 * parked; node-2 promoted with node-3's agent frozen from the epoch bump on (node-3 stays parked
 * with every key, its repoint waiting in its queue); node-2's database then killed and restarted
 * EMPTY at the same address (fenced by its config), the controllers frozen, until its agent's
 * verdict on the new process. The tests differ in what runs next.
 */

export const BATCHES = 4;
export const PER_BATCH = 250;
/** The replicas' keepalive: each writes its report every cycle or two instead of every 5 s. */
const REPLICA_KEEPALIVE_MS = "500";
/** The offline path may wait the last resort's grace for node-1 (dead) before bringing the shard back. */
export const RECOVER_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs + 2 * WAIT_MS;
export const FENCED = "database restarted without its data: fenced until it follows the shard's primary";

/** The cluster of the scene: the replicas report every cycle or two. */
export async function startEmptiedCluster(): Promise<LocalCluster> {
  return await startChaosCluster({
    readyTimeoutMs: 120_000,
    agentEnv: (id) => (id === "node-1" ? undefined : { [ENV.replicaKeepaliveMs]: REPLICA_KEEPALIVE_MS }),
  });
}

/** Stops the scene's cluster, thawing what it froze first. */
export async function stopEmptiedCluster(cluster: LocalCluster | undefined, failed: boolean): Promise<void> {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  cluster?.signalAgent("node-3", "SIGCONT");
  await cluster?.stop({ keepLogs: failed });
}

/** A database's process and replication as INFO gives them. */
export async function replicationOf(node: RedisNode) {
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

export function freezeControllers(active: LocalCluster, signal: "SIGSTOP" | "SIGCONT"): void {
  for (const controller of active.controllers) controller.child.kill(signal);
}

/** Runs the scene up to node-2's agent's verdict on its empty process (the controllers frozen). */
export async function promoteThenEmpty(active: LocalCluster, prefix: string) {
  // Prepare: node-1 primary, node-2 and node-3 linked members; every key acknowledged by both.
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
  for (let batch = 0; batch < BATCHES; batch++) await writeKeys(n1, `${prefix}:${batch}`, PER_BATCH, 2);
  const missingOn = async (node: RedisNode) => {
    let missing = 0;
    for (let batch = 0; batch < BATCHES; batch++)
      missing += PER_BATCH - (await countKeys(node, `${prefix}:${batch}`, PER_BATCH));
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
        .find((line) => line.runId === empty.runId && String(line.message).startsWith("database restarted"));
      return verdict !== undefined;
    },
    WAIT_MS,
  );

  return { n1, n2, n3, missingOn, lineage, start, bumped, epoch, promotedAs, setAtPromotion, verdict };
}

export type EmptiedScene = Awaited<ReturnType<typeof promoteThenEmpty>>;

/**
 * Waits for an online primary that takes writes and holds every acknowledged key, node-2 following
 * it with every key too; \`recovered\` is "" then, else why not.
 */
export async function awaitRecovery(active: LocalCluster, scene: EmptiedScene, prefix: string) {
  const { n2, missingOn } = scene;
  let serving: Topology | undefined;
  const seen: string[] = [];
  const recovered = await active
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
        if (!(await probeWrite(primary, `${prefix}:after`)).accepted) return false;
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
  return { recovered, serving: serving as Topology | undefined, seen };
}

/** The keys node-2 and node-3 miss at the end, and the lines that tell the run. */
export async function sceneReport(
  active: LocalCluster,
  scene: EmptiedScene,
  recovery: { readonly serving: Topology | undefined; readonly seen: readonly string[] },
  middle: readonly string[],
) {
  const { lineage, epoch, promotedAs, setAtPromotion, bumped, verdict, n2, n3, missingOn, start } = scene;
  const history = (await active.aws.store.history.list(active.shard, 100)).filter(
    (record) => record.epoch > start.epoch,
  );
  const missing: Record<string, number> = {};
  for (const node of [n2, n3]) missing[node.id] = await missingOn(node).catch(() => -1);
  const { serving, seen } = recovery;
  const lines = [
    `node-1's lineage ${lineage.replId.slice(0, 6)}@${lineage.offset}; node-2 promoted at epoch ${epoch} ` +
      `(${promotedAs.replId.slice(0, 6)}, replid2 ${promotedAs.replId2.slice(0, 6)}), its set [${setAtPromotion.join(", ")}]; ` +
      `node-3 frozen at topology ${bumped?.status}/${bumped?.phase ?? "-"}`,
    `node-2's agent on its empty process: ${String(verdict?.message)} (${String(verdict?.why ?? "")})`,
    ...middle,
    `topology since: ${seen.join(" -> ")}; ${serving ? `serving on ${serving.primary_node_id} at epoch ${serving.epoch}` : "no primary with every key"}`,
    `acknowledged keys missing: ${JSON.stringify(missing)}`,
    `history since: ${history.map((record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`).join(" | ")}`,
  ];
  return { missing, report: lines.join("\n") };
}
