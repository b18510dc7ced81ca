import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  linesWith,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  type WriteProbe,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
} from "../support/chaos-cluster.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Stalled agents beside serving databases. Found by the soak (`npm run soak -- --stall-all-every
 * 20000 --freeze-max 4500 --seed 2`: 2 false failovers, 23 acknowledged writes lost): with every
 * agent silent the controller marked the shard offline and brought it online with another node,
 * while the old primary's agent, seeing the offline topology, had lifted its write fence and
 * taken writes that were then discarded.
 */

let cluster: LocalCluster | undefined;
let stopWriter: (() => Promise<void>) | undefined;
/** What a failed test prints, read before the cluster (and its logs) are gone. */
let evidence: (() => string) | undefined;

afterEach(async ({ task }) => {
  if (task.result?.state === "fail" && evidence) console.error(evidence());
  evidence = undefined;
  await stopWriter?.();
  // A failure keeps the agents' and controllers' logs (their directory is in the error message).
  await cluster?.stop({ keepLogs: task.result?.state === "fail" });
  stopWriter = undefined;
  cluster = undefined;
});

/**
 * A client that keeps writing to the address it first knew, as an application with a cached
 * primary address does; it remembers every key the server acknowledged.
 */
function stubbornWriter(active: LocalCluster, id: string): { acked: string[]; stop: () => Promise<void> } {
  const acked: string[] = [];
  const client = active
    .node(id)
    .client({ maxRetriesPerRequest: 0, commandTimeout: 500, enableOfflineQueue: false });
  client.on("error", () => {});
  let running = true;
  const loop = (async () => {
    for (let seq = 0; running; seq++) {
      const key = `stubborn:${seq}`;
      try {
        await client.set(key, "v");
        acked.push(key);
      } catch {
        // Refused (NOREPLICAS, READONLY) or timed out: not acknowledged.
      }
      await delay(5); // the client's pace, not a wait
    }
  })();
  return {
    acked,
    stop: async () => {
      running = false;
      await loop;
      client.disconnect();
    },
  };
}

const FENCED = "writes fenced: this primary refuses writes";

/**
 * The start of five processes and DynamoDB Local, bounded to catch a hang: 30 s was exceeded once in
 * 29 runs at load 16 (run 29 of test:repeat), before anything under test ran.
 */
const READY_MS = 90_000;

/**
 * When node-1's agent had its fence confirmed by the database, ms, on the agent's clock (the
 * line's `fencedAt`): the clock of the heartbeat's `agent_updated`. The line's own timestamp is the
 * host's wall clock, which the agent's AWS-aligned clock may clamp a few ms below: run 25 of 30 (a
 * fence confirmed before the heartbeat was stamped) was logged 2 ms after that stamp.
 */
function fencesLogged(active: LocalCluster): number[] {
  return active
    .logLines("agent-node-1.log")
    .filter((line) => line.message === FENCED)
    .map((line) => (typeof line.fencedAt === "number" ? line.fencedAt : Date.parse(String(line.timestamp))));
}

/**
 * What a failure of the fence-order check needs to be judged: node-1's agent log around its
 * resume (ms relative to it) and every probe's answer.
 */
function stallEvidence(
  active: LocalCluster,
  seen: { resumedAt: number; firstWrittenAt: number; fencedAt: number[]; probes: WriteProbe[] },
): string {
  const lines = active
    .logLines("agent-node-1.log")
    .filter((line) => Date.parse(String(line.timestamp)) >= seen.resumedAt - 3000)
    .map((line) => `  ${Date.parse(String(line.timestamp)) - seen.resumedAt} ms ${JSON.stringify(line)}`);
  return [
    `resumed at ${seen.resumedAt}; first heartbeat after at ${seen.firstWrittenAt} (+${(seen.firstWrittenAt - seen.resumedAt).toFixed(1)} ms); fences logged at ${seen.fencedAt.join(", ") || "none"}`,
    "node-1's agent log from 3 s before its resume (ms after it):",
    ...lines,
    `probes: ${JSON.stringify(seen.probes)}`,
  ].join("\n");
}

describe("chaos: stalled agents", () => {
  it("neither fails over nor marks the shard offline when every agent stalls past the failure timeout", {
    timeout: 180_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster({ readyTimeoutMs: READY_MS });
    const active = cluster;
    const before = await active.topology();
    const writer = stubbornWriter(active, "node-1");
    stopWriter = writer.stop;
    await active.waitFor("acknowledged writes", () => writer.acked.length > 20, WAIT_MS);

    // Act
    for (const node of active.redis) active.signalAgent(node.id, "SIGSTOP");
    let why: Record<string, unknown> | undefined;
    await active.waitFor(
      "the controller to hold back for want of any agent",
      () => {
        why = active.controllerLogLines().find((line) => line.code === "no_agent_heard");
        return why !== undefined;
      },
      WAIT_MS,
    );
    // Negative check, long past the failure timeout of every node (before the fix the shard went
    // offline here): the topology must not change while every agent is silent.
    await holdsFor(
      async () => {
        const topology = await active.topology();
        return (
          topology?.epoch === before?.epoch &&
          topology?.status === "online" &&
          topology.primary_node_id === "node-1"
        );
      },
      "the topology unchanged while every agent stalls",
      2 * CHAOS_CONFIG.failureTimeoutMs,
      CHAOS_CONFIG.tickIntervalMs,
    );
    for (const node of active.redis) active.signalAgent(node.id, "SIGCONT");
    await active.waitFor(
      "the controller to see the primary healthy again",
      () => {
        const lines = active.controllerLogLines();
        return lines
          .slice(lines.indexOf(why as Record<string, unknown>) + 1)
          .some((line) => line.code === "healthy");
      },
      WAIT_MS,
    );
    await writer.stop();

    // Assess
    expect(why).toMatchObject({ decision: "none", outcome: "no_action" });
    expect(String(why?.message)).toMatch(
      /no agent of the shard was heard .*; not failing over or marking it offline$/,
    );
    expect(await active.topology()).toMatchObject({
      epoch: before?.epoch,
      status: "online",
      primary_node_id: "node-1",
    });
    expect(linesWith(active.controllerLogLines(), "shard offline")).toEqual([]);
    expect(await active.aws.store.history.list(active.shard, 100)).toEqual([]);
    const present = await withClient(active.node("node-1"), (client) => client.mget(...writer.acked));
    expect(present.filter((value) => value === null)).toEqual([]);
  });

  it("keeps the old primary's writes fenced while the shard is offline, and loses no acknowledged write", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 has priority 0 (never promoted), which holds the shard offline while its
    // own agent is back, long enough to watch what it does with its write fence.
    cluster = await startChaosCluster({ priorities: [0, 100, 100], readyTimeoutMs: READY_MS });
    const active = cluster;
    const writer = stubbornWriter(active, "node-1");
    stopWriter = writer.stop;
    await active.waitFor("acknowledged writes", () => writer.acked.length > 20, WAIT_MS);

    // Act: node-1's agent stalls while both replicas' databases freeze (their agents report them
    // down): the primary is stale, nobody is eligible, the shard goes offline.
    active.signalAgent("node-1", "SIGSTOP");
    active.node("node-2").signal("SIGSTOP");
    active.node("node-3").signal("SIGSTOP");
    let offlineEpoch = 0;
    await active.waitFor(
      "the controller to mark the shard offline",
      async () => {
        const topology = await active.topology();
        offlineEpoch = topology?.epoch ?? 0;
        return topology?.status === "offline";
      },
      WAIT_MS,
    );
    active.signalAgent("node-1", "SIGCONT");
    const resumedAt = active.aws.clock.now();
    // Its agent fenced the writes (no heartbeat for longer than the fence timeout), then wrote a
    // heartbeat after reading the offline topology. The first heartbeat that says its database
    // answers is the one a client could take for "serving": a cycle whose INFO was cut by the stall
    // itself ("Command timed out" on resume) reports the database down first, and claims nothing
    // (10 runs beside a CPU hog: one wrote such a report 151 ms after the resume, before its fence).
    let firstWrittenAt = 0;
    let fencedAt: number[] = [];
    const probes: WriteProbe[] = [];
    evidence = () => stallEvidence(active, { resumedAt, firstWrittenAt, fencedAt, probes });
    await active.waitFor(
      "node-1's agent to write a heartbeat after its stall with its database answering",
      async () => {
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-1");
        firstWrittenAt = (heartbeat?.agent_updated ?? 0) / 1000;
        return firstWrittenAt > resumedAt && heartbeat?.db_status === "up";
      },
      WAIT_MS,
    );
    // When its agent fenced the database: before it wrote that heartbeat, not after (a client
    // that sees the heartbeat, as the probes below do, must find the fence up). The log line
    // reaches the file through a pipe and this process: it may land after the heartbeat is seen.
    await active
      .waitFor(
        "node-1's agent to log its fence",
        () => {
          fencedAt = fencesLogged(active);
          return fencedAt.length > 0;
        },
        5000,
      )
      .catch(() => undefined);
    // Negative check over four of its heartbeats: node-1 refuses every write while offline.
    await holdsFor(
      async () => {
        const probe = await probeWrite(active.node("node-1"), `offline-probe:${probes.length}`);
        probes.push(probe);
        return !probe.accepted;
      },
      "node-1 refusing writes while the shard is offline",
      4 * CHAOS_CONFIG.heartbeatIntervalMs,
      CHAOS_CONFIG.heartbeatIntervalMs / 2,
    ).catch(() => undefined);
    const stillOffline = await active.topology();
    active.node("node-2").signal("SIGCONT");
    active.node("node-3").signal("SIGCONT");
    const after = await waitForNewPrimary(active, offlineEpoch);
    const winner = after.primary_node_id as string;
    await waitForFollowers(
      active,
      winner,
      active.redis.map((node) => node.id).filter((id) => id !== winner),
    );
    await writer.stop();

    // Assess
    expect(stillOffline?.status).toBe("offline");
    expect(
      fencedAt.filter((at) => at >= resumedAt - 1 && at <= firstWrittenAt),
      `fenced at ${fencedAt.join(", ")}; resumed at ${resumedAt}, first heartbeat after at ${firstWrittenAt}`,
    ).toHaveLength(1);
    for (const probe of probes) {
      expect(probe).toMatchObject({ role: "master", accepted: false });
      expect(probe.refusal).toMatch(/NOREPLICAS/);
    }
    expect(["node-2", "node-3"]).toContain(winner);
    const present = await withClient(active.node(winner), (client) => client.mget(...writer.acked));
    const lost = writer.acked.filter((_, index) => present[index] === null);
    expect(lost, `${lost.length} of ${writer.acked.length} acknowledged writes lost`).toEqual([]);
  });
});
