import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  hangAfterUnsentWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForNewPrimary,
  waitForWritablePrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Nemesis seed 6808 (guarantee 3), with real processes: a deposed primary whose agent was dead
 * comes back and becomes the only follower of a demoted primary. node-1, primary on lineage A with
 * its agent dead, hangs holding one write its replicas never received; the controller promotes
 * node-2 (lineage B, the link leaving A at node-2's offset), node-3 follows it and acknowledges its
 * writes. node-2's database then dies and its supervisor restarts it from its RDB with
 * `replicaof <node-1>` in its config: a primary answering as a replica (demoted), behind what it
 * acknowledged, parked by its agent; node-3, the member holding every write, parks too. node-1
 * wakes and its agent, back, steps it down to follow node-2, the topology's primary: node-2, a
 * replica with its link down, refuses the sync (NOMASTERLINK), so node-1 stays on lineage A past
 * the point the shard's history left it.
 *
 * Before the fix the controller took the lineage node-2's replacement must hold from its one
 * follower, node-1: judged on A, node-3 counted only up to the link, node-1 looked ahead, and gate
 * `outside_set_ahead` held for ever (`waiting_for_replica`): no writable primary. Now followers on
 * a lineage the history continued later do not count (src/core/decide/online-view.ts,
 * `demotedLineage`): node-3 is promoted once the cool-down and the demoted grace are over, with
 * every acknowledged write. Real redis-server, agents, controller, DynamoDB Local and SQS.
 */

const PREFIX = "demoted-deposed";
const BEFORE = 50;
const ACKED = 100;
const AFTER_SAVE = 50;
/**
 * As in primary-as-replica.test.ts: the production failure timeout, so that the supervisor's restart
 * never makes node-2's heartbeat stale; a cool-down after the first failover, so the crash fast path
 * does not replace node-2 before its database is back and node-1 has stepped down to follow it.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000, cooldownMs: 30_000 };
/** After the cool-down ends: the demoted grace (the failure timeout) and one failover, on two loaded cores. */
const MARGIN_MS = 10_000;
/** How long node-1 stays busy after its last write: long enough to be SIGSTOPped before it sends it. */
const BUSY_MS = 2000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  cluster?.node("node-1").signal("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a demoted primary whose only follower is a primary deposed before it (nemesis seed 6808)", () => {
  it("is replaced by the member holding every write, within the failure timeout plus the margin after the cool-down", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary, node-2 and node-3 members holding every key; node-2 preferred over
    // node-3 at equal offsets. No replication PINGs: offsets move with writes only.
    cluster = await startChaosCluster({ config: CONFIG, priorities: [100, 50, 100], readyTimeoutMs: 90_000 });
    const active = cluster;
    const [node1, node2, node3] = ["node-1", "node-2", "node-3"].map((id) => active.node(id));
    if (!node1 || !node2 || !node3) throw new Error("three nodes expected");
    for (const node of active.redis) {
      await withClient(node, (client) => client.config("SET", "repl-ping-replica-period", "3600"));
    }
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:before`, BEFORE, 2);

    // node-1's agent dies; node-1 takes one more write (no WAIT) and hangs before sending it to
    // its replicas (busy in a script, then SIGSTOP): its offset is past theirs. The link's offset
    // below tells it (node-1's heartbeat past it), not this pause.
    await active.stopAgent("node-1", "SIGKILL");
    await hangAfterUnsentWrite(active, node1, `${PREFIX}:unsent`, BUSY_MS);

    // The controller promotes node-2 (lineage B continues A at node-2's offset); node-3 follows it
    // and acknowledges writes; node-2's RDB, saved, lacks the last of them.
    const failedOver = await waitForNewPrimary(active, 0);
    expect(failedOver.primary_node_id).toBe("node-2");
    const link = failedOver.ancestry?.at(-1);
    expect(link, "the promotion's lineage link").toBeDefined();
    await waitForFollowers(active, "node-2", ["node-3"]);
    await waitForMembers(active, "node-2", ["node-3"]);
    await active.waitFor(
      "node-2 taking writes node-3 acknowledges",
      async () =>
        writeKeys(node2, `${PREFIX}:acked`, ACKED, 1).then(
          () => true,
          () => false,
        ),
      WAIT_MS,
    );
    await withClient(node2, (client) => client.save());
    await writeKeys(node2, `${PREFIX}:after-save`, AFTER_SAVE, 1);
    const acknowledged = (await roleOf(node2)).offset ?? 0;
    await active.waitFor(
      "node-3 holding all node-2 sent",
      async () => ((await roleOf(node3)).offset ?? 0) >= acknowledged,
      WAIT_MS,
    );

    // Act: within the cool-down, node-2's database dies and comes back from its RDB following
    // node-1 (hung: no sync), and its agent parks it; then node-1 wakes and its agent starts.
    const cooldownLeftMs = (failedOver.cooldown_until ?? 0) - Date.now();
    expect(cooldownLeftMs, "the faults land within the cool-down").toBeGreaterThan(15_000);
    node2.signal("SIGKILL");
    await node2.stop();
    await node2.start({ replicaOf: node1.address, extraArgs: FENCED_START_ARGS });
    await active.waitFor(
      "node-2 a replica parked by its agent",
      async () => {
        const role = await roleOf(node2);
        return role.role === "slave" && role.primaryPort === 1;
      },
      WAIT_MS,
    );
    expect((await roleOf(node2)).offset ?? 0, "node-2 back behind what it acknowledged").toBeLessThan(
      acknowledged,
    );
    node1.signal("SIGCONT");
    active.startAgent("node-1");
    const lastFaultAt = performance.now();
    const cooldownLeftAtLastFaultMs = (failedOver.cooldown_until ?? 0) - Date.now();

    // node-1 steps down to follow node-2, which refuses its sync: node-1 stays on lineage A, past
    // the link, node-2's one follower.
    await active.waitFor(
      "node-1 following node-2 on lineage A, past the link",
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-1");
        return (
          heartbeat?.role === "replica" &&
          heartbeat.primary_node_id === "node-2" &&
          heartbeat.repl_id === link?.repl_id &&
          heartbeat.last_txn_id > (link?.until ?? Number.POSITIVE_INFINITY)
        );
      },
      WAIT_MS,
    );
    console.log(
      `node-1 following node-2 on lineage A ${Math.round(performance.now() - lastFaultAt)} ms after its ` +
        `agent started, ${Math.round((failedOver.cooldown_until ?? 0) - Date.now())} ms before the cool-down ends`,
    );

    // Assess: a writable primary named by the topology within the bound (before the fix: none, the
    // controller held on gate outside_set_ahead for ever), holding every acknowledged write.
    const writableWithinMs = Math.max(cooldownLeftAtLastFaultMs, CONFIG.failureTimeoutMs) + MARGIN_MS;
    let writable: { primary: string; afterMs: number };
    try {
      writable = await waitForWritablePrimary(active, failedOver.epoch, lastFaultAt, writableWithinMs);
    } catch (error) {
      const held = active
        .controllerLogLines()
        .filter((line) => line.code === "waiting_for_replica")
        .at(-1);
      throw new Error(
        `${error instanceof Error ? error.message : String(error)}\nlast hold: ${String(
          held?.reason ?? held?.message ?? "none",
        )}`,
      );
    }
    console.log(
      `writable primary ${writable.primary} ${Math.round(writable.afterMs)} ms after node-1's agent started, ` +
        `${Math.round(writable.afterMs - cooldownLeftAtLastFaultMs)} ms after the cool-down ended`,
    );
    expect(writable.primary).toBe("node-3");
    expect(writable.afterMs).toBeLessThan(writableWithinMs);
    const primary = active.node(writable.primary);
    expect(await countKeys(primary, `${PREFIX}:before`, BEFORE)).toBe(BEFORE);
    expect(await countKeys(primary, `${PREFIX}:acked`, ACKED)).toBe(ACKED);
    expect(await countKeys(primary, `${PREFIX}:after-save`, AFTER_SAVE)).toBe(AFTER_SAVE);
    const records = await active.aws.store.history.list(active.shard, 100);
    const reasons = records
      .filter((record) => record.epoch > failedOver.epoch)
      .map((record) => record.reason);
    expect(reasons.join("\n")).toMatch(/is a replica .* it takes no writes/);
  });
});
