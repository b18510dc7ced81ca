import { afterEach, describe, expect, it } from "vitest";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { Heartbeat, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Simulator seed 282286 (guarantee 3, convergence (d)) with real processes: a replica parked on the
 * shard's lineage never followed the primary the offline shard was brought back on. node-1's
 * database (the primary, lineage L) died; node-2 and node-3 were parked on L, and the failover to
 * node-2 froze past its promote phase (the controller stalled, the PROMOTE never sent). node-1's
 * database came back from its RDB: Redis 7 loads it under a new replication id M, L as its earlier
 * one (`prior_lineage`), and its agent stepped the deposed node down to the target, which could
 * not serve it a sync: a replica on M. The shard went offline on L, and came back on node-1 (every
 * node answers, so the last resort at once; node-1, holding L as its earlier lineage at the same
 * offset as the others, wins the tie by its id). Its PROMOTE gave it yet another id N, prior M:
 * Redis shows one earlier lineage only, so L left its report, and the history
 * (`topology.ancestry`) recorded the promotion's link M -> N only; nothing joined L to M. node-2,
 * parked from node-1's address and repointed there, found node-1's new process neither continuing
 * its data nor superseding it: its probe parked it again, and it stayed parked for good ("slave of
 * none, link down" in the seed). Now the plan keeps the link its target's report showed when
 * decided (`failover.target_link`, L -> M) and completion records it before the promotion's own
 * (src/controller/transitions.ts, `ancestryAfter`): node-2 follows node-1 with every acknowledged
 * write. Real redis-server processes, agents, a controller process, DynamoDB Local and SQS
 * (loopback); the frozen controller's failover and offline mark are the test's own topology writes.
 */

const PREFIX = "completion-link";
const KEYS = 300;
/** The controller's last-resort grace at the chaos timings: the deadline's bound should not every node answer. */
const GRACE_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs;
/**
 * From the shard back online to node-2 following node-1 with its link up: the repoint, then a full
 * sync after Redis's default diskless delay (5 s), on two loaded cores. On the code before it
 * stays parked however long.
 */
const FOLLOWS_WITHIN_MS = 30_000;
/** node-2 keeps following node-1 (it is not parked again). */
const HOLD_MS = 3000;
/**
 * No replication PINGs (offsets move with writes only, so node-1's RDB holds every write), and
 * Redis's default diskless sync delay (5 s): a repointed replica's full sync does not start before
 * its agent's probe judges the new primary (docs/deploy.md), so the outcome is the probe's verdict.
 */
const REDIS_ARGS = ["--repl-ping-replica-period", "3600", "--repl-diskless-sync-delay", "5"];

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  cluster?.signalAgent("node-2", "SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** node-2's agent log lines about its park, as JSON (for the failure message). */
function parkLines(active: LocalCluster): string[] {
  return active
    .logLines("agent-node-2.log")
    .map((line) => JSON.stringify(line))
    .filter((line) => /parked|unparked/.test(line));
}

describe("a shard brought online on a node holding its lineage only as the prior one (sim seed 282286)", () => {
  it("a replica parked on that lineage follows the new primary past its PROMOTE, with every acknowledged write", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary on lineage L; every key acknowledged by node-2 and node-3, and on
    // node-1's disk. The controller then stops (it restarts on the offline shard).
    cluster = await startChaosCluster({ readyTimeoutMs: 90_000 });
    const active = cluster;
    const [node1, node2, node3] = ["node-1", "node-2", "node-3"].map((id) => active.node(id));
    if (!node1 || !node2 || !node3) throw new Error("three nodes expected");
    for (const node of active.redis) {
      await withClient(node, async (client) => {
        for (let index = 0; index < REDIS_ARGS.length; index += 2)
          await client.config("SET", (REDIS_ARGS[index] ?? "").slice(2), REDIS_ARGS[index + 1] ?? "");
      });
    }
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:acked`, KEYS, 2);
    const written = (await roleOf(node1)).offset ?? 0;
    await active.waitFor(
      "node-2 and node-3 holding all node-1 sent",
      async () =>
        ((await roleOf(node2)).offset ?? 0) >= written && ((await roleOf(node3)).offset ?? 0) >= written,
      WAIT_MS,
    );
    await withClient(node1, (client) => client.save());
    const lineageL = active.heartbeatOf(await active.snapshot(), "node-1")?.repl_id ?? "";
    expect(lineageL, "node-1's lineage").not.toBe("");
    for (const controller of active.controllers) await controller.stop(3000);
    const online = (await active.topology()) as Topology;

    // node-1's database dies: node-2's and node-3's agents park them on L. The frozen
    // controller's failover to node-2 is past its promote phase, the PROMOTE never sent; node-3
    // follows the target (parked: no sync). node-2's agent stalls.
    node1.signal("SIGKILL");
    await node1.stop();
    await active.waitFor(
      "node-2 parked by its agent",
      async () => {
        const role = await roleOf(node2);
        return role.role === "slave" && role.primaryPort === 1;
      },
      WAIT_MS,
    );
    const lineage = { node_id: "node-1", repl_id: lineageL, last_txn_id: written };
    const startedAt = Date.now();
    const failingOver: Topology = {
      shard: active.shard,
      epoch: online.epoch + 1,
      status: "failing_over",
      phase: "promote",
      updated_at: startedAt,
      lineage,
      failover: {
        kind: "failover",
        old_primary_node_id: "node-1",
        new_primary_node_id: "node-2",
        new_primary_address: node2.address,
        reason: "test: node-1's database died; the controller froze before PROMOTE (seed 282286)",
        started_at: startedAt,
        candidates: [],
        phase_started: { locked: startedAt, epoch_bumped: startedAt, promote: startedAt },
        lineage,
      },
      ...(online.ancestry === undefined ? {} : { ancestry: online.ancestry }),
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, online.epoch, failingOver)).toBe(true);
    await active.waitFor(
      "node-3 following the failover's target",
      async () => (await roleOf(node3)).primaryPort === node2.port,
      WAIT_MS,
    );
    expect(active.signalAgent("node-2", "SIGSTOP")).toBe(true);

    // node-1's database comes back from its RDB (lineage M, L as its earlier one), fenced; its
    // agent steps the deposed node down to the target, which cannot serve a sync (its own link
    // down): node-1 is a replica on M, L as its earlier one.
    await node1.start({ extraArgs: [...FENCED_START_ARGS, ...REDIS_ARGS] });
    let moved: Heartbeat | undefined;
    await active.waitFor(
      "node-1 a replica of node-2 on its new lineage M, L as its earlier one",
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-1");
        if (
          heartbeat?.db_status === "up" &&
          heartbeat.role === "replica" &&
          heartbeat.repl_id !== lineageL &&
          heartbeat.prior_lineage?.repl_id === lineageL
        )
          moved = heartbeat;
        return moved !== undefined;
      },
      WAIT_MS,
    );
    const lineageM = moved?.repl_id as string;
    expect(moved?.prior_lineage?.last_txn_id ?? 0, "node-1's RDB holds every write").toBeGreaterThanOrEqual(
      written,
    );
    expect(active.signalAgent("node-2", "SIGCONT")).toBe(true);

    // The frozen controller's continuation: the target not confirmed, the shard offline on L. The
    // controller restarts: every node answers, so the last resort applies at once, and node-1
    // (L as its earlier lineage, at the same offset as the others) wins the tie by its id. Its
    // PROMOTE takes N, M as its earlier one.
    const offline: Topology = {
      shard: active.shard,
      epoch: failingOver.epoch + 1,
      status: "offline",
      updated_at: Date.now(),
      lineage,
      ...(online.ancestry === undefined ? {} : { ancestry: online.ancestry }),
    };
    expect(await active.aws.store.topology.compareAndSet(active.shard, failingOver.epoch, offline)).toBe(
      true,
    );
    active.startController();
    let back: Topology | undefined;
    await active.waitFor(
      "the shard online again",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "online" && topology.epoch > offline.epoch) back = topology;
        return back !== undefined;
      },
      GRACE_MS + 2 * WAIT_MS,
    );
    expect(back?.primary_node_id).toBe("node-1");
    let promoted: Heartbeat | undefined;
    await active.waitFor(
      "node-1 reporting its PROMOTE: lineage N, M as its earlier one (L out of its report)",
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-1");
        if (
          heartbeat?.role === "primary" &&
          heartbeat.repl_id !== lineageM &&
          heartbeat.prior_lineage?.repl_id === lineageM
        )
          promoted = heartbeat;
        return promoted !== undefined;
      },
      WAIT_MS,
    );
    console.log(
      `online on node-1 at epoch ${back?.epoch}: L ${lineageL.slice(0, 8)}, M ${lineageM.slice(0, 8)}, N ${promoted?.repl_id.slice(0, 8)}; ancestry ${JSON.stringify(back?.ancestry ?? [])}`,
    );
    const onlineAt = performance.now();

    // Assess: node-2 follows node-1 with its link up, and keeps following it (on the code before,
    // its probe parked it again after the repoint and it stayed parked: link down for good).
    const follows = async () => {
      const role = await roleOf(node2);
      return role.role === "slave" && role.primaryPort === node1.port && role.state === "connected";
    };
    try {
      await active.waitFor("node-2 following node-1 with its link up", follows, FOLLOWS_WITHIN_MS);
    } catch (error) {
      throw new Error(
        `${error instanceof Error ? error.message : String(error)}\nnode-2: ${JSON.stringify(await roleOf(node2))}\n` +
          `node-2's agent: ${parkLines(active).slice(-3).join("\n")}`,
      );
    }
    console.log(
      `node-2 follows node-1 ${Math.round(performance.now() - onlineAt)} ms after the shard came back`,
    );
    await holdsFor(follows, "node-2 following node-1", HOLD_MS, 200);
    expect(await countKeys(node1, `${PREFIX}:acked`, KEYS)).toBe(KEYS);
    expect(await countKeys(node2, `${PREFIX}:acked`, KEYS)).toBe(KEYS);
  });
});
