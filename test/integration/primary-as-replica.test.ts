import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  waitForWritablePrimary,
  withClient,
} from "../support/chaos-cluster.ts";
import { continuousWriter, missingKeys } from "../support/data-safety.ts";

/**
 * Issue 30, finding 4 (guarantee 3): after a failover from node-1, the new primary's redis
 * crashes and its supervisor restarts it, from its RDB, with a redis.conf saying `replicaof
 * <node-1>`, the bootstrap primary. Redis loads the RDB's replication id as a replica's, so its
 * replicas' probes find it on their lineage (not "restarted"). Every node is then a replica (it
 * and node-1 get NOMASTERLINK from each other), while the topology still names it primary and its
 * agent's heartbeat stays fresh.
 * Before the fix it was judged healthy for ever (its agent's crash report cleared when the
 * database answered again, within the failure timeout, while the cool-down held the fast path);
 * now its heartbeat's `role: replica` since `role_since` makes the controller fail over once that
 * lasts the failure timeout (gate `primary_demoted_grace`). Real redis-server, agents,
 * controller, DynamoDB Local and SQS.
 */

/**
 * The production failure timeout, so that a supervisor's restart (well under it) never makes the
 * primary's heartbeat stale; a cool-down after the first failover, as in production (5 min there),
 * so the crash fast path does not replace the dying primary before its database is back.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000, cooldownMs: 30_000 };
/** After the cool-down ends: the grace (the failure timeout) and one failover, with room for two loaded cores. */
const MARGIN_MS = 10_000;

let cluster: LocalCluster | undefined;
const stops: Array<() => Promise<unknown>> = [];

afterEach(async () => {
  for (const stop of stops.splice(0)) await stop();
  await cluster?.stop();
  cluster = undefined;
});

describe("a primary whose database comes back as a replica", () => {
  it("is replaced within the failure timeout plus the margin, without losing a replica-acknowledged write", {
    timeout: 180_000,
  }, async () => {
    // Prepare: writes acknowledged by a replica (WAIT 1), a kill -9 failover away from node-1,
    // node-1 back (empty) as a replica of the new primary.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const writer = continuousWriter(active, "node-1", { prefix: "demoted", follow: true, waitReplicas: 1 });
    stops.push(writer.stop);
    await active.waitFor("acknowledged writes on node-1", () => writer.report().acked.length > 20, WAIT_MS);
    const first = active.node("node-1");
    first.signal("SIGKILL");
    await first.stop();
    const failedOver = await waitForNewPrimary(active, 0);
    const promoted = failedOver.primary_node_id ?? "";
    const third = active.redis.find((node) => node.id !== "node-1" && node.id !== promoted)?.id ?? "";
    await first.start({ extraArgs: FENCED_START_ARGS });
    await waitForFollowers(active, promoted, ["node-1", third]);
    const before = writer.report().acked.length;
    await active.waitFor(
      `acknowledged writes on ${promoted}`,
      () => writer.report().acked.length > before + 20,
      WAIT_MS,
    );

    // Act: within the cool-down, the new primary's redis dies and its supervisor restarts it following node-1.
    const cooldownLeftMs = (failedOver.cooldown_until ?? 0) - Date.now();
    expect(cooldownLeftMs, "the second fault lands within the cool-down").toBeGreaterThan(5_000);
    const demoted = active.node(promoted);
    await withClient(demoted, (client) => client.save());
    demoted.signal("SIGKILL");
    await demoted.stop();
    await demoted.start({ replicaOf: first.address, extraArgs: FENCED_START_ARGS });
    const restartedAt = performance.now();
    const writableWithinMs = Math.max(cooldownLeftMs, CONFIG.failureTimeoutMs) + MARGIN_MS;

    // Assess: a writable primary named by the topology again within the bound, holding every write.
    const { primary: writablePrimary, afterMs: writableAfterMs } = await waitForWritablePrimary(
      active,
      failedOver.epoch,
      restartedAt,
      writableWithinMs,
    );
    console.log(
      `writable primary ${writablePrimary} ${Math.round(writableAfterMs)} ms after the restart, ` +
        `${Math.round(writableAfterMs - cooldownLeftMs)} ms after the cool-down ended`,
    );
    const report = await writer.stop();
    const missing = await missingKeys(active.node(writablePrimary), report.acked);
    expect(writablePrimary).not.toBe(promoted);
    expect(writableAfterMs).toBeLessThan(writableWithinMs);
    expect(report.acked.length).toBeGreaterThan(40);
    expect(missing).toEqual([]);
    const records = await active.aws.store.history.list(active.shard, 100);
    const reasons = records
      .filter((record) => record.epoch > failedOver.epoch)
      .map((record) => record.reason);
    // Replaced as a demoted primary, or, when the controller reads its agent's crash report before
    // the new process answers, as a crashed one (gate cooldown_online yields to a confirmed crash,
    // simulator seed 117581): either way not judged healthy, the failure of the code before.
    expect(reasons.join("\n")).toMatch(/is a replica .* it takes no writes|saw its database die/);
  });
});
