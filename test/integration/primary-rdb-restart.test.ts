import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  linesWith,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Simulator seeds 7002, 7006, 7008, 7013 (guarantee 3: offline to the end with every node holding
 * every write) and 7007 (guarantee 1: a non-member behind the others brought online, 262 writes
 * lost), with real processes: the primary's redis-server is killed and restarted from an RDB saved
 * at its death, holding every acknowledged write. Redis 7 gives a master loading an RDB a new
 * replication id and keeps the RDB's as `master_replid2` (up to `second_repl_offset - 1`); the
 * replicas resync partially onto the new run. The code before 5e0772a required the same replid to
 * continue: node-1's agent fenced it ("restarted without its data"), and the controller took the
 * shard offline with both replicas "foreign" (on the new replid) to the lineage it expected. Now the
 * primary the topology names continues its lineage when its `master_replid2` is the old replid at
 * least as far as its agent's last read and no other node reports more of it (`judgeRestart`,
 * src/core/identity.ts), so the shard keeps a writable primary with every write.
 *
 * node-1 primary, node-2 and node-3 members; keys written with `WAIT 1`. The controllers are frozen
 * (SIGSTOP) from just before the kill until node-1's agent has judged the restart and every agent
 * has reported since (in the seeds a stalled failover let the restart be judged first); then they
 * resume. The shard must have an online primary taking writes and holding every acknowledged key
 * within AT_ONCE_MS (well inside the last resort's grace), and never be marked offline. On the
 * code before (5e0772a^, c0d2e64) node-1's agent fenced it and ~2 s after the controllers resumed
 * the shard went offline, node-2 and node-3 "foreign replication lineage <new id>, expected <old>"
 * (2 of 2 runs); now node-1 opens once the replicas reported since its restart and serves at once.
 */

const PREFIX = "primary-rdb-restart";
const BATCHES = 4;
const PER_BATCH = 250;
/** The replicas' keepalive: each writes its report every cycle or two instead of every 5 s. */
const REPLICA_KEEPALIVE_MS = 500;
/** The last resort's grace at the chaos timings: the code before may bring the shard back after it. */
const GRACE_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs;
/** How long after the controllers resume the shard must have a writable primary holding every key. */
const AT_ONCE_MS = 15_000;
/** Its agent's verdicts on node-1's new process: continued (at once, or once the peers reported since), or fenced. */
const CONTINUED = [
  "database restarted",
  "database restart judged on the other nodes' reports written since: it continues its lineage",
];
const FENCED = "database restarted without its data: fenced until it follows the shard's primary";

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** A database's replication as INFO gives it, with its process's run id. */
async function replicationOf(node: RedisNode) {
  return withClient(node, async (client) => {
    const info = `${String(await client.info("server"))}\n${String(await client.info("replication"))}`;
    const field = (name: string) => new RegExp(`^${name}:(\\S+)`, "m").exec(info)?.[1] ?? "";
    return {
      runId: field("run_id"),
      replId: field("master_replid"),
      offset: Number(field("master_repl_offset")),
      replId2: field("master_replid2"),
      secondOffset: Number(field("second_repl_offset")),
    };
  });
}

describe("a primary's redis-server killed and restarted from an RDB holding every acknowledged write (simulator seeds 7002, 7007)", () => {
  it("continues its lineage: the shard keeps a writable primary with every write, never offline, no replica judged foreign", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary, both members linked; every key acknowledged by a replica (WAIT 1).
    cluster = await startChaosCluster({
      readyTimeoutMs: 120_000,
      agentEnv: (id) =>
        id === "node-1" ? undefined : { [ENV.replicaKeepaliveMs]: String(REPLICA_KEEPALIVE_MS) },
    });
    const active = cluster;
    const primary = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await active.waitFor(
      "node-2 and node-3 in node-1's replica set",
      async () => {
        const stored = (await active.snapshot()).replicaSets["node-1"] ?? [];
        return ["node-2", "node-3"].every((id) => stored.includes(id));
      },
      WAIT_MS,
    );
    for (let batch = 0; batch < BATCHES; batch++)
      await writeKeys(primary, `${PREFIX}:${batch}`, PER_BATCH, 1);
    const expectEveryKey = async (id: string) => {
      for (let batch = 0; batch < BATCHES; batch++)
        expect(
          await countKeys(active.node(id), `${PREFIX}:${batch}`, PER_BATCH),
          `${id}, batch ${batch}`,
        ).toBe(PER_BATCH);
    };
    const written = await replicationOf(primary);
    // node-1's agent has read its database at least this far: the read a restart is judged against.
    await active.waitFor(
      "node-1's report at its offset past the keys",
      async () => (active.heartbeatOf(await active.snapshot(), "node-1")?.last_txn_id ?? 0) >= written.offset,
      WAIT_MS,
    );
    const before = (await active.topology()) as Topology;
    expect(before.primary_node_id).toBe("node-1");

    // Act: the controllers frozen; node-1's database saves its RDB and dies at once (an RDB at its
    // death), and is started again from it as a supervisor starts it (fenced by its config).
    for (const controller of active.controllers) controller.child.kill("SIGSTOP");
    const agentLinesBefore = active.logLines("agent-node-1.log").length;
    await withClient(primary, async (client) => {
      await client.save();
      primary.signal("SIGKILL");
    });
    await primary.stop();
    const restartedAt = Date.now();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    const restarted = await replicationOf(primary);
    // The premise (Redis 7): a new replid, the old one kept as replid2 up to the RDB's offset,
    // which holds every acknowledged write.
    expect(restarted.runId).not.toBe(written.runId);
    expect(restarted.replId).not.toBe(written.replId);
    expect(restarted.replId2).toBe(written.replId);
    expect(restarted.secondOffset - 1).toBeGreaterThanOrEqual(written.offset);
    await expectEveryKey("node-1");

    // node-1's agent judges the new process; every agent reports after that.
    const heardSince = (agentUpdated: number | undefined) => (agentUpdated ?? 0) / 1000 > restartedAt;
    let verdict: Record<string, unknown> | undefined;
    let reported = "";
    await active.waitFor(
      "node-1's agent's verdict on its restarted database, every agent reporting since",
      async () => {
        const lines = active.logLines("agent-node-1.log").slice(agentLinesBefore);
        verdict = lines.find(
          (line) =>
            line.runId === restarted.runId &&
            (line.message === FENCED || CONTINUED.includes(String(line.message))),
        );
        const snapshot = await active.snapshot();
        const nodes = ["node-1", "node-2", "node-3"].map((id) => active.heartbeatOf(snapshot, id));
        reported = nodes
          .map(
            (node) =>
              `${node?.node_id}: ${node?.role} db ${node?.db_status}, link ${node?.primary_link}, ${node?.repl_id?.slice(0, 6)}@${node?.last_txn_id}`,
          )
          .join("; ");
        return verdict !== undefined && nodes.every((node) => heardSince(node?.agent_updated));
      },
      WAIT_MS,
    );
    for (const controller of active.controllers) controller.child.kill("SIGCONT");
    const resumedAt = performance.now();

    // Assess: within AT_ONCE_MS an online primary that takes writes and holds every acknowledged
    // key; the shard never offline meanwhile.
    const seen: string[] = [];
    let offline: Topology | undefined;
    let serving: Topology | undefined;
    await active
      .waitFor(
        "an online primary taking writes, holding every acknowledged key",
        async () => {
          const topology = await active.topology();
          if (topology === undefined) return false;
          const state = `${topology.epoch}:${topology.status}:${topology.primary_node_id ?? "-"}`;
          if (seen.at(-1) !== state) seen.push(state);
          if (topology.status === "offline") offline ??= topology;
          if (topology.status !== "online" || topology.primary_node_id === undefined) return false;
          const node = active.node(topology.primary_node_id);
          if (!(await probeWrite(node, `${PREFIX}:probe`)).accepted) return false;
          for (let batch = 0; batch < BATCHES; batch++)
            if ((await countKeys(node, `${PREFIX}:${batch}`, PER_BATCH)) !== PER_BATCH) return false;
          serving = topology;
          return true;
        },
        AT_ONCE_MS,
      )
      .catch(() => undefined);
    const tookMs = Math.round(performance.now() - resumedAt);
    const history = (await active.aws.store.history.list(active.shard, 100)).filter(
      (record) => record.epoch > before.epoch,
    );
    const foreign = linesWith(active.controllerLogLines(), /foreign replication lineage/).concat(
      history.flatMap((record) =>
        record.candidates
          .filter((candidate) => /foreign replication lineage/.test(candidate.reason))
          .map((candidate) => ({ epoch: record.epoch, ...candidate })),
      ),
    );
    console.log(
      `saved at ${written.replId.slice(0, 6)}@${written.offset}; ` +
        `restarted ${restarted.replId.slice(0, 6)}, replid2 ${restarted.replId2.slice(0, 6)}@${restarted.secondOffset - 1}\n` +
        `node-1's agent: ${String(verdict?.message)} (${String(verdict?.why ?? "")})\n${reported}\n` +
        `topology after resuming: ${seen.join(" -> ")}; ${serving ? `serving on ${serving.primary_node_id} ${tookMs} ms after` : `no writable primary with every key within ${AT_ONCE_MS} ms`} (grace ${GRACE_MS} ms)\n` +
        `history since: ${history.map((record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`).join(" | ") || "none"}`,
    );
    expect(offline, "the shard marked offline").toBeUndefined();
    expect(
      history
        .filter((record) => record.kind === "offline")
        .map((record) => `${record.epoch}: ${record.reason}`),
      "offline decisions",
    ).toEqual([]);
    expect(foreign, "replicas judged foreign to the shard's lineage").toEqual([]);
    expect(serving, "a writable primary holding every acknowledged key").toBeDefined();

    // Then: a write acknowledged by a replica on that primary, and every node holding every key.
    const named = active.node(serving?.primary_node_id ?? "node-1");
    await writeKeys(named, `${PREFIX}:after`, PER_BATCH, 1);
    for (const id of ["node-1", "node-2", "node-3"].filter((id) => id !== named.id)) {
      await active.waitFor(
        `${id} holding every key`,
        async () => {
          for (let batch = 0; batch < BATCHES; batch++)
            if ((await countKeys(active.node(id), `${PREFIX}:${batch}`, PER_BATCH)) !== PER_BATCH)
              return false;
          return (await countKeys(active.node(id), `${PREFIX}:after`, PER_BATCH)) === PER_BATCH;
        },
        WAIT_MS,
      );
    }
  });
});
