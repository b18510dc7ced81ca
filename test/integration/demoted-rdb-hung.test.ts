import { afterEach, describe, expect, it } from "vitest";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  countKeys,
  describeReport,
  probeWrite,
  replicationOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Simulator seed 193077 (guarantee 1), fixed in 40fdaca, with real redis-server processes, agents,
 * controllers, DynamoDB Local and SQS.
 *
 * Scenario: a first failover from node-1 records the shard's history (`ancestry`: node-1's lineage
 * continued by P's, P the promoted node). P's redis SAVEs; more keys are acknowledged by both
 * replicas (`WAIT 2`). The shard paused (holding the controller, as restart-from-rdb.test.ts's seed
 * 45033 case does), P's redis is SIGKILLed and restarted from that older RDB: Redis 7 gives it a new
 * replication id X continuing P's lineage L at the RDB's offset, behind both replicas (their agents
 * park them; P's agent fences it). A topology naming a replica R at the next epoch (written as a
 * controller writes a failover that deposes P, still paused) makes P's real agent step it down as
 * R's replica: its report says role replica, repl_id X, prior L at the RDB offset. Then P's redis
 * hangs (SIGSTOP: its report's database down) and the topology names P again, online, at the epoch
 * after (an abandoned failover returning the shard to its old primary).
 *
 * Guarantee 1: the controller judges P, whose last report is a replica's with its database down, as
 * a demoted primary: its replacement must hold the newest lineage of the shard's history (L), not
 * X. It fails over to a replica holding every acknowledged key; the shard is never offline on X;
 * the final writable primary holds every `WAIT 2` key.
 *
 * Fail-before evidence (online-view.ts from 40fdaca^): 3 of 3 runs failed, each taking the shard
 * offline at epoch 4 on X ("no node is eligible (node-1: foreign replication lineage L, expected X;
 * node-3: foreign replication lineage L, expected X)"), both replicas holding the 200 keys
 * acknowledged after the RDB (about 30,700 bytes of replication stream past its offset). On
 * 40fdaca: 3 of 3 passed, a failover to node-1 at epoch 4 (last_txn_id 61477, every key), about
 * 22 s of test time.
 *
 * Limits: the deposing topology (R named, paused) and the one naming P again are written by
 * compare-and-set, as no operator command makes a controller depose a restarted primary and then
 * abandon the failover on demand; the agents' step-down, parks and fences and the controller's
 * decision are real.
 */

const PREFIX = "demoted-rdb-hung";
/** Keys in P's RDB (acknowledged by both replicas), and keys after its SAVE (both replicas too). */
const SAVED_KEYS = 200;
const LATER_KEYS = 200;

let cluster: LocalCluster | undefined;
let hung: RedisNode | undefined;

afterEach(async (context) => {
  hung?.signal("SIGCONT");
  hung = undefined;
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a named primary back from an older RDB, stepped down as a replica, then hung (simulator seed 193077)", () => {
  it("is replaced by a replica holding every acknowledged key, never offline on the restarted process's lineage", {
    timeout: 150_000,
  }, async () => {
    // Arrange: a first failover from node-1 (the shard's history: ancestry), node-1 back as a replica.
    cluster = await startChaosCluster({ readyTimeoutMs: 60_000 });
    const active = cluster;
    const first = active.node("node-1");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    first.signal("SIGKILL");
    await first.stop();
    const failedOver = await waitForNewPrimary(active, 0);
    const pId = failedOver.primary_node_id ?? "";
    const primary = active.node(pId);
    const [rId, sId] = ["node-1", "node-2", "node-3"].filter((id) => id !== pId) as [string, string];
    await first.start({ extraArgs: FENCED_START_ARGS });
    await waitForFollowers(active, pId, [rId, sId]);
    const history = (await active.topology()) as Topology;
    const tip = history.ancestry?.at(-1);
    expect(tip, "the shard's history records P's promotion").toBeDefined();

    // P saves its RDB; more keys are acknowledged by both replicas after it.
    await writeKeys(primary, `${PREFIX}:saved`, SAVED_KEYS, 2);
    await withClient(primary, (client) => client.save());
    await writeKeys(primary, `${PREFIX}:later`, LATER_KEYS, 2);
    const written = await replicationOf(primary);
    expect(written.replId).toBe(tip?.by);
    await active.waitFor(
      "both replicas' reports past the keys",
      async () => {
        const snapshot = await active.snapshot();
        return [rId, sId].every(
          (id) => (active.heartbeatOf(snapshot, id)?.last_txn_id ?? 0) >= written.offset,
        );
      },
      WAIT_MS,
    );

    // The shard paused: the controller holds while P's redis dies and comes back.
    const online = (await active.topology()) as Topology;
    expect(
      await active.aws.store.topology.compareAndSet(active.shard, online.epoch, {
        ...online,
        status: "paused",
        paused_reason: "held by the test while P's redis restarts from its RDB",
      }),
    ).toBe(true);

    // Act: P's redis SIGKILLed, restarted from the older RDB (a new id X continuing L at its offset).
    primary.signal("SIGKILL");
    await primary.stop();
    const restartedAt = Date.now();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    const restarted = await replicationOf(primary);
    expect(restarted.replId).not.toBe(written.replId);
    expect(restarted.offset).toBeLessThan(written.offset);

    // A topology naming R at the next epoch, still paused: P's agent steps P down as R's replica.
    const paused = (await active.topology()) as Topology;
    const rAddress = active.node(rId).address;
    expect(
      await active.aws.store.topology.compareAndSet(active.shard, paused.epoch, {
        ...paused,
        epoch: paused.epoch + 1,
        primary_node_id: rId,
        primary_address: rAddress,
        updated_at: Date.now(),
      }),
    ).toBe(true);
    let reported = "";
    await active.waitFor(
      "P's report: a replica on X, prior L at the RDB offset; both replicas heard since",
      async () => {
        const snapshot = await active.snapshot();
        const nodes = [pId, rId, sId].map((id) => active.heartbeatOf(snapshot, id));
        reported = nodes.map(describeReport).join("; ");
        const p = nodes[0];
        return (
          p?.role === "replica" &&
          p.db_status === "up" &&
          p.repl_id === restarted.replId &&
          p.prior_lineage?.repl_id === written.replId &&
          p.prior_lineage.last_txn_id < written.offset &&
          nodes.every((node) => (node?.agent_updated ?? 0) / 1000 > restartedAt)
        );
      },
      WAIT_MS,
    );
    const steppedDown = reported;

    // P's redis hangs: its agent reports the database down, its last answer a replica's.
    primary.signal("SIGSTOP");
    hung = primary;
    await active.waitFor(
      "P's report: its database down, its role a replica's",
      async () => {
        const p = active.heartbeatOf(await active.snapshot(), pId);
        reported = describeReport(p);
        return p?.db_status === "down" && p.role === "replica" && p.repl_id === restarted.replId;
      },
      WAIT_MS,
    );
    const hungReport = reported;

    // The topology names P again, online, at the epoch after (the failover abandoned).
    const { paused_reason: _reason, ...deposing } = (await active.topology()) as Topology;
    expect(
      await active.aws.store.topology.compareAndSet(active.shard, deposing.epoch, {
        ...deposing,
        epoch: deposing.epoch + 1,
        status: "online",
        primary_node_id: pId,
        primary_address: primary.address,
        updated_at: Date.now(),
      }),
    ).toBe(true);
    const resumedEpoch = deposing.epoch + 1;

    // Assess: a failover to a replica holding every acknowledged key; never offline on X.
    const seen: string[] = [];
    let offline: Topology | undefined;
    let serving: Topology | undefined;
    await active
      .waitFor(
        "an online primary other than P taking writes, or the shard offline",
        async () => {
          const topology = await active.topology();
          if (topology === undefined) return false;
          const state = `${topology.epoch}:${topology.status}:${topology.primary_node_id ?? "-"}:${topology.lineage?.repl_id.slice(0, 6) ?? "-"}`;
          if (seen.at(-1) !== state) seen.push(state);
          if (topology.status === "offline") {
            offline ??= topology;
            return true;
          }
          if (topology.status !== "online" || topology.epoch <= resumedEpoch) return false;
          const id = topology.primary_node_id ?? "";
          if (id === pId || !(await probeWrite(active.node(id), `${PREFIX}:probe`)).accepted) return false;
          serving = topology;
          return true;
        },
        WAIT_MS,
      )
      .catch(() => undefined);
    const records = (await active.aws.store.history.list(active.shard, 100)).filter(
      (record) => record.epoch > resumedEpoch,
    );
    console.log(
      `P=${pId} saved L=${written.replId.slice(0, 6)}@${written.offset}, restarted X=${restarted.replId.slice(0, 6)}@${restarted.offset}\n` +
        `stepped down: ${steppedDown}\nhung: ${hungReport}\n` +
        `topology after resuming: ${seen.join(" -> ")}\n` +
        `history since: ${records.map((record) => `${record.epoch} ${record.kind} ${record.new_primary_node_id ?? "-"}: ${record.reason}`).join(" | ") || "none"}`,
    );
    expect(offline?.lineage?.repl_id, "offline on the restarted process's lineage").not.toBe(
      restarted.replId,
    );
    expect(offline, "the shard marked offline").toBeUndefined();
    expect(records.filter((record) => record.kind === "offline").map((record) => record.reason)).toEqual([]);
    expect(serving, "a failover to a writable replica").toBeDefined();
    expect(records.find((record) => record.epoch === serving?.epoch)?.kind).toBe("failover");
    const named = active.node(serving?.primary_node_id ?? pId);
    expect(await countKeys(named, `${PREFIX}:saved`, SAVED_KEYS)).toBe(SAVED_KEYS);
    expect(await countKeys(named, `${PREFIX}:later`, LATER_KEYS)).toBe(LATER_KEYS);
  });
});
