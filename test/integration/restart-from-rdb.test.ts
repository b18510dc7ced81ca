import { afterEach, describe, expect, it } from "vitest";
import { LAST_COPY_GRACE } from "../../src/core/decide.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  probeWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForNewPrimary,
  waitForOffline,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * The nemesis's seed 3104 (docs/chaos.md): every node's database died; the primary's came back
 * from its own RDB, which Redis 7 loads under a new replication id (the old one as
 * `master_replid2`). Its agent rightly keeps it fenced (it does not continue the lineage the
 * replicas may hold more of), but it is the only copy left: after a grace for a node with more of
 * the lineage to return (LAST_COPY_GRACE failure timeouts), the controller must bring the shard
 * back on it, not wait for an operator for ever. Real redis-server, agents and controllers.
 */

const KEYS = 300;
/** The controller's last-resort grace at the chaos timings. */
const GRACE_MS = LAST_COPY_GRACE * CHAOS_CONFIG.failureTimeoutMs;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a primary restarted from its RDB when no other copy is left", () => {
  it("brings the offline shard back on it with the RDB's data, then resyncs a node restarted empty from it", {
    timeout: 150_000,
  }, async () => {
    // Prepare: keys on every node, and on the primary's disk.
    cluster = await startChaosCluster();
    const active = cluster;
    const primary = active.node("node-1");
    await writeKeys(primary, "acked", KEYS, 2);
    await withClient(primary, (client) => client.save());

    // Act: every database dies; the shard goes offline; node-1's is back from its RDB, fenced.
    for (const node of active.redis) node.signal("SIGKILL");
    await Promise.all(active.redis.map((node) => node.stop()));
    let offline: Topology | undefined;
    await active.waitFor(
      "the shard offline",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "offline") offline = topology;
        return offline !== undefined;
      },
      WAIT_MS,
    );
    await primary.start({ extraArgs: FENCED_START_ARGS });

    // Assess: the last resort waits its grace, then online on node-1, every key there, writable.
    let online: Topology | undefined;
    await active.waitFor(
      "the shard online again",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "online" && topology.epoch > (offline?.epoch ?? 0)) online = topology;
        return online !== undefined;
      },
      GRACE_MS + WAIT_MS,
    );
    expect(online?.primary_node_id).toBe("node-1");
    // Both stamps are the controller's (AWS-aligned) clock: the grace was kept.
    expect((online?.updated_at ?? 0) - (offline?.updated_at ?? 0)).toBeGreaterThanOrEqual(GRACE_MS);
    expect(await countKeys(primary, "acked", KEYS)).toBe(KEYS);
    await active.waitFor(
      "node-1 accepting writes",
      async () => (await probeWrite(primary, "after")).accepted,
      WAIT_MS,
    );

    // Act: node-2's database is back empty; its agent repoints it at node-1.
    const empty = active.node("node-2");
    empty.wipeData();
    await empty.start({ extraArgs: FENCED_START_ARGS });

    // Assess
    await waitForFollowers(active, "node-1", ["node-2"]);
    await active.waitFor(
      "node-2 holding every key after its full sync",
      async () => (await countKeys(empty, "acked", KEYS)) === KEYS,
      WAIT_MS,
    );
  });
});

describe("a primary restarted from its RDB while every node answers", () => {
  it("brings the offline shard back at once, not after the last resort's grace (simulator seed 45033)", {
    timeout: 150_000,
  }, async () => {
    // Prepare: keys on every node; the shard paused, holding the controller as the cool-down of seed
    // 45033 did (the primary died inside it). A cool-down no longer holds it here: a crash the
    // primary's own agent confirms is failed over at once (gate cooldown_online, seed 117581).
    cluster = await startChaosCluster();
    const active = cluster;
    const primary = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(primary, "acked", KEYS, 2);
    const online = (await active.topology()) as Topology;
    expect(
      await active.aws.store.topology.compareAndSet(active.shard, online.epoch, {
        ...online,
        status: "paused",
        paused_reason: "held by the test, as the cool-down of seed 45033 held it",
      }),
    ).toBe(true);
    const before = active.heartbeatOf(await active.snapshot(), "node-1");
    const lineage = {
      node_id: "node-1",
      repl_id: before?.repl_id ?? "",
      last_txn_id: before?.last_txn_id ?? 0,
    };

    // Act: node-1's database dies and comes back from its RDB (a new replication id, the old one as
    // replid2); its replicas unpark and resync onto the new run. Then the shard is marked offline,
    // as the controller did in seed 45033 when its read caught node-1's heartbeat before its agent
    // reported the restart.
    await withClient(primary, (client) => client.save());
    primary.signal("SIGKILL");
    await primary.stop();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    await active.waitFor(
      "node-2 and node-3 following node-1's new run, every agent heard",
      async () => {
        const snapshot = await active.snapshot();
        const restarted = active.heartbeatOf(snapshot, "node-1");
        if (restarted?.repl_id === undefined || restarted.repl_id === lineage.repl_id) return false;
        return ["node-2", "node-3"].every((id) => {
          const node = active.heartbeatOf(snapshot, id);
          return node?.primary_link === "up" && node.repl_id === restarted.repl_id;
        });
      },
      WAIT_MS,
    );
    const current = (await active.topology()) as Topology;
    const offlineAt = Date.now();
    expect(
      await active.aws.store.topology.compareAndSet(active.shard, current.epoch, {
        shard: active.shard,
        epoch: current.epoch + 1,
        status: "offline",
        updated_at: offlineAt,
        lineage,
      }),
    ).toBe(true);

    // Assess: every node alive and heard, none can return with more: online well inside the grace
    // (the code before waited all of it), with every key.
    let back: Topology | undefined;
    await active.waitFor(
      "the shard online again",
      async () => {
        const topology = await active.topology();
        if (topology?.status === "online" && topology.epoch > current.epoch + 1) back = topology;
        return back !== undefined;
      },
      GRACE_MS + WAIT_MS,
    );
    const tookMs = (back?.updated_at ?? 0) - offlineAt;
    console.log(`offline -> online on ${back?.primary_node_id} in ${tookMs} ms (grace ${GRACE_MS} ms)`);
    expect(tookMs).toBeLessThan(GRACE_MS / 3);
    expect(await countKeys(active.node(back?.primary_node_id ?? "node-1"), "acked", KEYS)).toBe(KEYS);
  });
});

/** A failure timeout of 3 s: the last resort's grace (90 s) is far past the deadline below. */
const SLOW_CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
const SLOW_GRACE_MS = LAST_COPY_GRACE * SLOW_CONFIG.failureTimeoutMs;
/** How long after every node answers the shard must be online (the code before waited the grace). */
const AT_ONCE_MS = 15_000;
const FENCED = "database restarted without its data: fenced until it follows the shard's primary";

/**
 * Simulator seed 71251 (guarantee 3): the old primary's database restarted empty, its agent fencing
 * it (restarted without its data) and heard; the only node holding the shard's lineage held it as
 * its earlier one (a replica's database restarted from its RDB); every other node alive. The last
 * resort's "every node answers" (\`everyNodeAnswers\`, src/core/decide/offline-view.ts) did not count
 * the fenced old primary, so the shard waited out the whole grace (LAST_COPY_GRACE failure
 * timeouts); its writes died with the old process, and now it counts. The controllers are frozen
 * while the databases come back, so the deadline runs from every node answering.
 */
describe("an old primary restarted empty while the only copy left is a replica's RDB", () => {
  it("brings the offline shard back on the RDB's node at once, not after the last resort's grace (simulator seed 71251)", {
    timeout: 150_000,
  }, async () => {
    // Prepare: every key on both replicas; node-2 saves its RDB.
    cluster = await startChaosCluster({ config: SLOW_CONFIG, readyTimeoutMs: 60_000 });
    const active = cluster;
    const primary = active.node("node-1");
    const keeper = active.node("node-2");
    const spare = active.node("node-3");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(primary, "acked", KEYS, 2);
    // node-1's stored report carries the keys: the lineage the shard goes offline on holds them.
    const written = (await roleOf(primary)).offset ?? 0;
    await active.waitFor(
      "node-1's report at its offset past the keys",
      async () => (active.heartbeatOf(await active.snapshot(), "node-1")?.last_txn_id ?? 0) >= written,
      WAIT_MS,
    );
    await withClient(keeper, (client) => client.save());

    // Act: every database dies; the shard goes offline on node-1's lineage.
    for (const node of active.redis) node.signal("SIGKILL");
    await Promise.all(active.redis.map((node) => node.stop()));
    const offline = await waitForOffline(active);
    const lineage = offline.lineage;
    expect(lineage?.node_id, "offline on the old primary's lineage").toBe("node-1");
    expect(lineage?.last_txn_id ?? 0).toBeGreaterThanOrEqual(written);

    // The controllers frozen while the databases come back, as a supervisor starts them: node-3's
    // and node-1's empty (node-1's agent fences it: restarted without its data), node-2's from its
    // RDB (Redis 7 loads it under a new replication id, the lineage's as its earlier one).
    for (const controller of active.controllers) controller.child.kill("SIGSTOP");
    const restartedAt = Date.now();
    spare.wipeData();
    await spare.start({ extraArgs: FENCED_START_ARGS });
    await keeper.start({ extraArgs: FENCED_START_ARGS });
    primary.wipeData();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    const heardSince = (agentUpdated: number | undefined) => (agentUpdated ?? 0) / 1000 > restartedAt;
    let reported = "";
    await active.waitFor(
      "node-1 fenced as restarted empty, node-2 holding the lineage as its earlier one, node-3 up on a new one, every agent writing since",
      async () => {
        const snapshot = await active.snapshot();
        const [old, holder, other] = ["node-1", "node-2", "node-3"].map((id) =>
          active.heartbeatOf(snapshot, id),
        );
        reported = [old, holder, other]
          .map(
            (node) =>
              `${node?.node_id}: db ${node?.db_status}, crash ${node?.db_crash?.state}, ${node?.repl_id}@${node?.last_txn_id}, prior ${node?.prior_lineage?.repl_id}@${node?.prior_lineage?.last_txn_id}`,
          )
          .join("; ");
        return (
          active.logLines("agent-node-1.log").some((line) => line.message === FENCED) &&
          old?.db_status === "down" &&
          old.db_crash?.state === "restarted" &&
          old.prior_lineage === undefined &&
          heardSince(old.agent_updated) &&
          holder?.prior_lineage?.repl_id === lineage?.repl_id &&
          heardSince(holder?.agent_updated) &&
          other?.db_status === "up" &&
          other.repl_id !== lineage?.repl_id &&
          heardSince(other.agent_updated)
        );
      },
      WAIT_MS,
    );
    for (const controller of active.controllers) controller.child.kill("SIGCONT");
    const answeredAt = Date.now();

    // Assess: every node answers, none can return with more: online on node-2 within AT_ONCE_MS
    // (the code before waited out the grace), with every key the RDB held, taking writes.
    const back = await waitForNewPrimary(active, offline.epoch, AT_ONCE_MS);
    const tookMs = back.updated_at - offline.updated_at;
    console.log(
      `offline on ${JSON.stringify(lineage)}; ${reported}\noffline -> online on ${back.primary_node_id} in ${tookMs} ms, ${Date.now() - answeredAt} ms after every node answered (grace ${SLOW_GRACE_MS} ms)`,
    );
    expect(back.primary_node_id).toBe("node-2");
    expect(tookMs).toBeLessThan(SLOW_GRACE_MS / 3);
    expect(await countKeys(keeper, "acked", KEYS)).toBe(KEYS);
    await active.waitFor(
      "node-2 accepting writes",
      async () => (await probeWrite(keeper, "after")).accepted,
      WAIT_MS,
    );
  });
});
