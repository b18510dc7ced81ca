import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { TcpProxy } from "../../src/dev/nemesis/tcp-proxy.ts";
import { awsEnv } from "../support/aws.ts";
import {
  CHAOS_CONFIG,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
} from "../support/chaos-cluster.ts";
import {
  continuousWriter,
  missingKeys,
  probeAll,
  rawHeartbeat,
  splitBrainWatch,
  writable,
} from "../support/data-safety.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Issue 20, "Done when": a DynamoDB outage must not become a Redis outage, and a fenced primary
 * must be replaced (an agent cut off alone fences its primary once its replicas are seen reaching
 * the store, the replicas report it `fenced`, the controller fails over). Real redis-server, agent and controller processes; the cut is a real TCP
 * proxy (src/dev/nemesis/tcp-proxy.ts, mode `drop`: a blackhole, as a lost route or a security
 * group change looks) between the processes and DynamoDB Local. SQS and replication are never cut.
 * The test's own reads go straight to DynamoDB.
 */

/** How long the whole store is cut: the 40 s (40 failure timeouts at CHAOS_CONFIG). */
const STORE_OUTAGE_MS = 40_000;
/** Longest the primary's agent is cut: the cut ends once the failover is complete. */
const AGENT_PARTITION_MS = 12_000;
/** How long nothing may fail over once the primary's agent is killed (the 12 s). */
const NO_FAILOVER_MS = 12_000;
/** How long the writer keeps writing after a replica is killed. */
const AFTER_REPLICA_KILL_MS = 8_000;
/** Longest total time without a writable primary the issue allows (store outage, replica loss). */
const MAX_UNAVAILABLE_MS = 1_000;
/**
 * The fence window of a promotion: the old primary's writes are refused once its replicas have
 * been detached for `min-replicas-max-lag`, which the issue puts at 1–2 s; the upper bound here.
 */
const FENCE_WINDOW_MS = 2_000;
/** Slack for process scheduling on two shared cores, on top of the bounds. */
const SCHEDULING_SLACK_MS = 5_000;
/** The bound for writes to be available again after the primary's agent is cut off. */
const PARTITION_GAP_BOUND_MS = CHAOS_CONFIG.failureTimeoutMs + FENCE_WINDOW_MS + 2_000 + SCHEDULING_SLACK_MS;
const BLACKHOLE = { kind: "drop" } as const;

let cluster: LocalCluster | undefined;
let proxy: TcpProxy | undefined;
const stops: Array<() => Promise<unknown>> = [];

afterEach(async () => {
  for (const stop of stops.splice(0)) await stop().catch(() => undefined);
  await cluster?.stop();
  await proxy?.stop();
  cluster = undefined;
  proxy = undefined;
});

/** A started proxy in front of DynamoDB Local and the environment that sends a process through it. */
async function dynamoProxy(): Promise<{ proxy: TcpProxy; env: NodeJS.ProcessEnv }> {
  const direct = awsEnv().AWS_ENDPOINT_URL_DYNAMODB;
  if (!direct) throw new Error("no AWS_ENDPOINT_URL_DYNAMODB from the global setup");
  const started = TcpProxy.forUrl(direct, "dynamodb");
  await started.start();
  return { proxy: started, env: { AWS_ENDPOINT_URL_DYNAMODB: started.urlFor(direct) } };
}

/** Waits until every agent wrote a heartbeat after `sinceMs` (AWS-aligned ms): they reach the store again. */
async function waitForFreshHeartbeats(active: LocalCluster, sinceMs: number): Promise<void> {
  await active.waitFor(
    "every agent to write a heartbeat after the cut healed",
    async () => {
      for (const node of active.redis) {
        const item = await rawHeartbeat(active.shard, node.id);
        if (Number(item?.agent_updated ?? 0) / 1000 <= sinceMs) return false;
      }
      return true;
    },
    WAIT_MS,
  );
}

describe("failsafe fencing (issue 20)", () => {
  it("keeps the primary writable, without a failover, while every agent and the controller are cut from DynamoDB", {
    timeout: 90_000,
  }, async () => {
    // Prepare
    const cut = await dynamoProxy();
    proxy = cut.proxy;
    cluster = await startChaosCluster({ agentEnv: () => cut.env, controllerEnv: () => cut.env });
    const active = cluster;
    const before = await active.topology();
    const writer = continuousWriter(active, "node-1", { prefix: "outage", follow: true });
    stops.push(writer.stop);
    await active.waitFor("acknowledged writes", () => writer.report().acked.length > 20, WAIT_MS);
    const watch = splitBrainWatch(active);
    stops.push(watch.stop);
    const atCut = writer.report();

    // Act
    cut.proxy.setMode(BLACKHOLE);
    // Negative check over the whole 40 s outage: no failover, and the primary keeps taking
    // writes; it stops at the first break, the assessments below say which.
    await holdsFor(
      async () => {
        const topology = await active.topology();
        const unavailable = writer.report().unavailableMs - atCut.unavailableMs;
        return topology?.epoch === before?.epoch && unavailable <= MAX_UNAVAILABLE_MS;
      },
      "no failover and writes taken during the store outage",
      STORE_OUTAGE_MS,
      1000,
    ).catch(() => undefined);
    const duringCut = writer.report();
    cut.proxy.heal();
    const healedAt = active.aws.clock.now();
    await waitForFreshHeartbeats(active, healedAt);
    // Each agent says it came back from the outage: the controller waits for the others meanwhile.
    const resumedAt = await Promise.all(
      active.redis.map(
        async (node) => Number((await rawHeartbeat(active.shard, node.id))?.store_resumed_at) / 1000,
      ),
    );
    await active.waitFor(
      "the shard online with node-1 primary after the heal",
      async () => {
        const topology = await active.topology();
        return topology?.status === "online" && topology.primary_node_id !== undefined;
      },
      WAIT_MS,
    );
    const after = await active.topology();
    const primaryId = after?.primary_node_id as string;
    await waitForFollowers(
      active,
      primaryId,
      active.redis.map((node) => node.id).filter((id) => id !== primaryId),
    );
    const final = await writer.stop();
    const { samples, split } = await watch.stop();

    // Assess
    const unavailableInCut = duringCut.unavailableMs - atCut.unavailableMs;
    console.log(
      `store outage ${STORE_OUTAGE_MS} ms: ${duringCut.acked.length - atCut.acked.length} writes acknowledged during the cut, ` +
        `${Math.round(unavailableInCut)} ms without a writable primary (longest gap ${Math.round(duringCut.longestGapMs)} ms); ` +
        `whole run ${Math.round(final.unavailableMs)} ms; ${split.length} of ${samples} probe rounds with two writable primaries; ` +
        `epoch ${before?.epoch} -> ${after?.epoch}, primary ${after?.primary_node_id}`,
    );
    expect
      .soft(Math.round(unavailableInCut), "ms without a writable primary during the cut")
      .toBeLessThanOrEqual(MAX_UNAVAILABLE_MS);
    expect
      .soft(Math.round(final.unavailableMs), "ms without a writable primary, whole run")
      .toBeLessThanOrEqual(MAX_UNAVAILABLE_MS);
    expect.soft(after, "no failover").toMatchObject({ epoch: before?.epoch, primary_node_id: "node-1" });
    expect.soft(await active.aws.store.history.list(active.shard, 100), "history records").toEqual([]);
    expect.soft(split, "probe rounds with two writable primaries").toEqual([]);
    for (const at of resumedAt) {
      expect.soft(at, "store_resumed_at of each agent, ms").toBeGreaterThanOrEqual(healedAt - 1000);
    }
    expect(writable(await probeAll(active, "after-heal")), "writable primaries after the heal").toEqual([
      primaryId,
    ]);
    expect(await missingKeys(active.node(primaryId), final.acked), "acknowledged writes lost").toEqual([]);
  });

  it("replaces the primary whose agent alone is cut from DynamoDB: writable again within the bound, no two writable primaries, no WAIT 1 write lost, the old primary rejoins", {
    timeout: 90_000,
  }, async () => {
    // Prepare
    const cut = await dynamoProxy();
    proxy = cut.proxy;
    cluster = await startChaosCluster({ agentEnv: (id) => (id === "node-1" ? cut.env : undefined) });
    const active = cluster;
    const before = await active.topology();
    const writer = continuousWriter(active, "node-1", { prefix: "partition", follow: true, waitReplicas: 1 });
    stops.push(writer.stop);
    await active.waitFor("acknowledged writes", () => writer.report().acked.length > 20, WAIT_MS);
    const watch = splitBrainWatch(active);
    stops.push(watch.stop);

    // Act
    const cutAt = performance.now();
    cut.proxy.setMode(BLACKHOLE);
    // The cut lasts until the failover is complete (a new primary online and taking WAIT 1
    // writes), at most AGENT_PARTITION_MS; the assessments below say what was missing.
    await active
      .waitFor(
        "a new primary online and taking writes while node-1's agent is cut",
        async () => {
          const topology = await active.topology();
          const primary = topology?.primary_node_id;
          if (topology?.status !== "online" || primary === undefined || primary === "node-1") return false;
          return [...writer.report().ackedBy.values()].includes(primary);
        },
        AGENT_PARTITION_MS,
      )
      .catch(() => undefined);
    const duringCut = writer.report();
    const duringCutTopology = await active.topology();
    cut.proxy.heal();
    let settled: { primary: string; epoch: number } | undefined;
    await active.waitFor(
      "node-1 to be the primary again or a linked replica of the topology's primary",
      async () => {
        const topology = await active.topology();
        if (topology?.status !== "online" || topology.primary_node_id === undefined) return false;
        const primary = active.node(topology.primary_node_id);
        settled = { primary: primary.id, epoch: topology.epoch };
        if (primary.id === "node-1") return (await roleOf(primary)).role === "master";
        const role = await roleOf(active.node("node-1"));
        return role.role === "slave" && role.primaryPort === primary.port && role.state === "connected";
      },
      WAIT_MS,
    );
    const final = await writer.stop();
    const { samples, split } = await watch.stop();

    // Assess
    const byNode = new Map<string, number>();
    for (const node of final.ackedBy.values()) byNode.set(node, (byNode.get(node) ?? 0) + 1);
    console.log(
      `agent partition ${AGENT_PARTITION_MS} ms: longest gap without a WAIT 1 write ${Math.round(duringCut.longestGapMs)} ms ` +
        `(bound ${PARTITION_GAP_BOUND_MS} ms), ${Math.round(duringCut.unavailableMs)} ms in all; acked by ${JSON.stringify(Object.fromEntries(byNode))}; ` +
        `topology at the end of the cut ${JSON.stringify({ epoch: duringCutTopology?.epoch, status: duringCutTopology?.status, primary: duringCutTopology?.primary_node_id })}; ` +
        `after heal primary ${settled?.primary} at epoch ${settled?.epoch} (was ${before?.epoch}); ` +
        `${split.length} of ${samples} probe rounds with two writable primaries; ${Math.round(performance.now() - cutAt)} ms from cut to settled`,
    );
    expect
      .soft(
        Math.round(duringCut.longestGapMs),
        "longest time without a writable primary (WAIT 1) during the cut",
      )
      .toBeLessThanOrEqual(PARTITION_GAP_BOUND_MS);
    expect.soft(split, "probe rounds with two writable primaries").toEqual([]);
    expect
      .soft(duringCutTopology, "failed over during the cut")
      .toMatchObject({ status: "online", epoch: (before?.epoch ?? 0) + 1 });
    expect.soft(duringCutTopology?.primary_node_id, "the new primary").not.toBe("node-1");
    expect
      .soft(byNode.get(duringCutTopology?.primary_node_id ?? "") ?? 0, "writes on the new primary")
      .toBeGreaterThan(0);
    const primary = active.node(settled?.primary as string);
    expect(primary.id, "the old primary rejoined as a replica").not.toBe("node-1");
    // The new primary may still be inside its promotion's fence window when the topology settles
    // (a fresh-clone CI run at load 20 probed it there): wait for it, with a deadline.
    let afterHeal: string[] = [];
    await active
      .waitFor(
        "the new primary, alone, writable after the heal",
        async () => {
          afterHeal = writable(await probeAll(active, "after-heal"));
          return afterHeal.length === 1 && afterHeal[0] === primary.id;
        },
        WAIT_MS,
      )
      .catch(() => undefined);
    expect(afterHeal, "writable primaries after the heal").toEqual([primary.id]);
    expect(await missingKeys(primary, final.acked), "WAIT 1 acknowledged writes lost").toEqual([]);
  });

  it("does not fail over for 12 s when the primary's agent is killed while its database serves", {
    timeout: 60_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const before = await active.topology();

    // Act
    await active.stopAgent("node-1", "SIGKILL");
    const killedAt = performance.now();
    const seen = new Set<string>();
    const unchanged = `${before?.epoch}:online:node-1`;
    // Negative check: the 12 s in which nothing may fail over, watched every controller tick.
    await holdsFor(
      async () => {
        const topology = await active.topology();
        const state = `${topology?.epoch}:${topology?.status}:${topology?.primary_node_id}`;
        seen.add(state);
        return state === unchanged;
      },
      "the topology unchanged",
      NO_FAILOVER_MS,
      CHAOS_CONFIG.tickIntervalMs,
    ).catch(() => undefined);

    // Assess
    console.log(
      `agent killed: topology states seen in ${Math.round(performance.now() - killedAt)} ms: ${[...seen].join(", ")}`,
    );
    expect([...seen]).toEqual([unchanged]);
    expect(await active.aws.store.history.list(active.shard, 100)).toEqual([]);
    expect(writable(await probeAll(active, "agent-killed"))).toEqual(["node-1"]);
  });

  it("keeps taking writes with at most 1 s interruption when a replica's redis-server is SIGKILLed", {
    timeout: 60_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const before = await active.topology();
    const writer = continuousWriter(active, "node-1", { prefix: "replica-loss" });
    stops.push(writer.stop);
    await active.waitFor("acknowledged writes", () => writer.report().acked.length > 20, WAIT_MS);
    const atKill = writer.report();

    // Act
    active.node("node-3").signal("SIGKILL");
    // Negative check: for AFTER_REPLICA_KILL_MS the writes must go on (at most 1 s without one).
    await holdsFor(
      () => writer.report().unavailableMs - atKill.unavailableMs <= MAX_UNAVAILABLE_MS,
      "writes acknowledged after the replica's loss",
      AFTER_REPLICA_KILL_MS,
      200,
    ).catch(() => undefined);
    const final = await writer.stop();

    // Assess
    const unavailable = final.unavailableMs - atKill.unavailableMs;
    console.log(
      `replica killed: ${final.acked.length - atKill.acked.length} writes acknowledged in ${AFTER_REPLICA_KILL_MS} ms, ` +
        `${Math.round(unavailable)} ms without an acknowledged write (longest gap ${Math.round(final.longestGapMs)} ms)`,
    );
    expect(Math.round(unavailable), "ms without an acknowledged write").toBeLessThanOrEqual(
      MAX_UNAVAILABLE_MS,
    );
    expect(await active.topology()).toMatchObject({ epoch: before?.epoch, primary_node_id: "node-1" });
    expect(await missingKeys(active.node("node-1"), final.acked)).toEqual([]);
  });
});
