import { setTimeout as pause } from "node:timers/promises";
import type { Redis } from "ioredis";
import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import type { Heartbeat } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { TcpProxy } from "../../src/dev/nemesis/tcp-proxy.ts";
import { awsEnv } from "../support/aws.ts";
import {
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForSettled,
  withClient,
} from "../support/chaos-cluster.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Nemesis seed 7336 (guarantees 5 then 1, ~236 acknowledged writes lost), with real processes: an
 * agent restarted with a wiped state dir judges the live database against its node's own stored
 * report (`judgeAgainstOwnReport`). node-169a's primary was on that report's replication id and
 * 21 KB ahead of it, yet its agent fenced it as "restarted without its data": a replica's report,
 * written after the agent's INFO read while writes kept flowing, was further on that id. The
 * controller promoted another node at the report's offset. Now a primary on the id of its last
 * read as a primary, at least as far, is the same master lifetime whatever the peers report.
 *
 * node-1 primary, a writer on it all along (`WAIT 1` each), the replicas reporting every cycle or
 * two (a short replica keepalive). node-1's agent is killed, and restarted with a wiped state dir,
 * its DynamoDB traffic through a proxy that delays every chunk STORE_DELAY_MS each way (the
 * nemesis's `store-slow`): its first cycle reads INFO and the shard snapshot together, and the
 * snapshot's query reaches the store STORE_DELAY_MS after the INFO read, by when the replicas have
 * reported offsets past it on the same id. The code before fenced node-1 (its writes refused, its
 * database reported down) and the controller failed over; now node-1 keeps serving.
 */

const PREFIX = "restart-same-lifetime";
/**
 * The delay of each chunk through node-1's store proxy, each way: the first snapshot's query lands
 * this long after the INFO read it is judged with. Under the SDK's own request timeout (2 s) for a
 * call's two delays.
 */
const STORE_DELAY_MS = 850;
/** The replicas' keepalive: each writes its report every cycle or two (250 ms) instead of every 5 s. */
const REPLICA_KEEPALIVE_MS = 500;
/** Pause between two writes of the writer: ~100 writes/s, ~10 KB/s of replication stream. */
const WRITE_GAP_MS = 5;
/**
 * How long node-1 must keep serving after its restarted agent's first report: the code before
 * fenced it at that report and the controller failed over within a couple of seconds.
 */
const HOLD_MS = 5000;
const LOST_DATA = "does not continue this node's last report";

let cluster: LocalCluster | undefined;
let proxy: TcpProxy | undefined;
let writer: Writer | undefined;

afterEach(async (context) => {
  await writer?.stop();
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  await proxy?.stop();
  writer = undefined;
  cluster = undefined;
  proxy = undefined;
});

/** A client writing `<prefix>:<n>` to one node, each write followed by `WAIT 1`, until stopped. */
interface Writer {
  /** Indexes of the writes a replica acknowledged. */
  readonly acked: number[];
  /** Writes refused (an error reply: NOREPLICAS, READONLY, ...), with when (ms since epoch) and why. */
  readonly refused: Array<{ index: number; at: number; why: string }>;
  /** Writes taken that no replica acknowledged within WAIT's timeout (a slow host, not a refusal). */
  readonly unacknowledged: number[];
  stop(): Promise<void>;
}

function startWriter(node: RedisNode, prefix: string): Writer {
  const client: Redis = node.client({ maxRetriesPerRequest: 0 });
  const acked: number[] = [];
  const refused: Array<{ index: number; at: number; why: string }> = [];
  const unacknowledged: number[] = [];
  let running = true;
  const loop = (async () => {
    for (let index = 0; running; index++) {
      try {
        await client.set(`${prefix}:${index}`, `${prefix}-value-${index}`.padEnd(100, "."));
        const replicas = Number(await client.call("WAIT", "1", "500"));
        if (replicas >= 1) acked.push(index);
        else unacknowledged.push(index);
      } catch (error) {
        refused.push({ index, at: Date.now(), why: error instanceof Error ? error.message : String(error) });
      }
      await pause(WRITE_GAP_MS);
    }
  })();
  return {
    acked,
    refused,
    unacknowledged,
    async stop() {
      running = false;
      await loop;
      client.disconnect();
    },
  };
}

/** Every report each node wrote, as seen by polling the shard every 50 ms until stopped. */
function recordReports(active: LocalCluster): { reports: Heartbeat[]; stop(): Promise<void> } {
  const reports: Heartbeat[] = [];
  const seen = new Set<string>();
  let running = true;
  const loop = (async () => {
    while (running) {
      try {
        for (const node of (await active.snapshot()).nodes) {
          const key = `${node.node_id}@${node.agent_updated ?? node.last_updated}`;
          if (seen.has(key)) continue;
          seen.add(key);
          reports.push(node);
        }
      } catch {
        // A read that failed: the next one sees the report if it still stands.
      }
      await pause(50);
    }
  })();
  return {
    reports,
    async stop() {
      running = false;
      await loop;
    },
  };
}

const writtenUs = (heartbeat: Heartbeat): number => heartbeat.agent_updated ?? heartbeat.last_updated;

describe("an agent restarted without its state beside its live primary (nemesis seed 7336)", () => {
  it("keeps serving the primary, ahead of its node's report on the same id, though replicas reported further on since its INFO read", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary, node-2 and node-3 linked members reporting often, a writer on node-1.
    const direct = awsEnv().AWS_ENDPOINT_URL_DYNAMODB;
    if (!direct) throw new Error("no AWS_ENDPOINT_URL_DYNAMODB from the global setup");
    const slow = TcpProxy.forUrl(direct, "node-1 -> DynamoDB");
    proxy = slow;
    await slow.start();
    slow.setMode({ kind: "delay", delayMs: STORE_DELAY_MS });
    cluster = await startChaosCluster({
      readyTimeoutMs: 120_000,
      agentEnv: (id) =>
        id === "node-1" ? undefined : { [ENV.replicaKeepaliveMs]: String(REPLICA_KEEPALIVE_MS) },
    });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    const primary = active.node("node-1");
    const writing = startWriter(primary, PREFIX);
    writer = writing;
    await active.waitFor("the writer's writes acknowledged", () => writing.acked.length >= 50, WAIT_MS);
    const epoch = (await active.topology())?.epoch;

    // node-1's agent dies; the replicas report past its last report while the writes go on.
    await active.stopAgent("node-1", "SIGKILL");
    const lastReport = active.heartbeatOf(await active.snapshot(), "node-1");
    if (lastReport === undefined) throw new Error("node-1 has no stored report");
    await active.waitFor(
      "both replicas reporting past node-1's last report",
      async () => {
        const snapshot = await active.snapshot();
        return ["node-2", "node-3"].every(
          (id) =>
            (active.heartbeatOf(snapshot, id)?.last_txn_id ?? 0) > lastReport.last_txn_id &&
            active.heartbeatOf(snapshot, id)?.repl_id === lastReport.repl_id,
        );
      },
      WAIT_MS,
    );

    // Act: node-1's agent restarts with a wiped state dir, its store calls slow.
    const recorder = recordReports(active);
    const linesBefore = active.logLines("agent-node-1.log").length;
    const restartedUs = active.aws.clock.now() * 1000;
    active.startAgent("node-1", {
      wipeStateDir: true,
      env: {
        AWS_ENDPOINT_URL_DYNAMODB: slow.urlFor(direct),
        [ENV.storeTimeoutMs]: String(8 * STORE_DELAY_MS),
      },
    });
    const newLines = () => active.logLines("agent-node-1.log").slice(linesBefore);
    const judgedLost = () => newLines().find((line) => String(line.message).includes(LOST_DATA));
    // Its first snapshot judges its database: the code before fenced it there (logged, and no
    // report up until it follows a primary); now its first report goes out, up.
    const landed: { first?: Heartbeat } = {};
    await active.waitFor(
      "the restarted agent's first report, or its verdict that the database lost its data",
      async () => {
        if (judgedLost() !== undefined) return true;
        const report = active.heartbeatOf(await active.snapshot(), "node-1");
        if (report !== undefined && writtenUs(report) > restartedUs) landed.first = report;
        return landed.first !== undefined;
      },
      WAIT_MS,
    );
    const verdict = judgedLost();
    expect(verdict, `node-1's agent fenced its live primary: ${JSON.stringify(verdict)}`).toBeUndefined();
    const first = landed.first;
    if (first === undefined) throw new Error("no report of the restarted agent");
    const firstAck = writing.acked.length;

    // Assess: node-1 keeps serving as primary at the same epoch, reported up, never judged
    // "restarted without its data", and the writes keep being acknowledged.
    await holdsFor(
      async () => {
        const topology = await active.topology();
        const node1 = active.heartbeatOf(await active.snapshot(), "node-1");
        return (
          topology?.epoch === epoch &&
          topology?.primary_node_id === "node-1" &&
          node1?.db_status === "up" &&
          node1.role === "primary" &&
          judgedLost() === undefined
        );
      },
      "node-1 serving as primary at the same epoch, never judged restarted without its data",
      HOLD_MS,
    );
    await recorder.stop();

    // The fault's shape, checked: the restarted agent's first report carries the INFO read of the
    // cycle that judged its database (on the id of node-1's last report, at least as far), and a
    // replica reported further on that id after that read and over a store delay before the report
    // was built: the cycle's snapshot, answered through the proxy before then, had read it. (Its
    // first snapshot queries the shard's members, then their partitions: those land ~3 delays
    // after the INFO read.)
    const readUs = first.last_updated;
    const seenBy = writtenUs(first) - STORE_DELAY_MS * 1000;
    const relative = (report: Heartbeat) =>
      `${report.node_id} at ${report.last_txn_id} (+${Math.round((writtenUs(report) - readUs) / 1000)} ms)`;
    const peers = recorder.reports.filter(
      (report) => report.node_id !== "node-1" && writtenUs(report) > readUs - 1_000_000,
    );
    const overtaking = peers.filter(
      (report) =>
        report.repl_id === first.repl_id &&
        report.last_txn_id > first.last_txn_id &&
        writtenUs(report) > readUs &&
        writtenUs(report) < seenBy,
    );
    console.log(
      `node-1's last report before the restart: ${lastReport.repl_id} at ${lastReport.last_txn_id}; ` +
        `the restarted agent's first report: INFO read ${first.repl_id} at ${first.last_txn_id}, built ` +
        `${Math.round((writtenUs(first) - readUs) / 1000)} ms after it; replicas' reports further on, ` +
        `written after the read and over ${STORE_DELAY_MS} ms before the build: ${overtaking.map(relative).join(", ")}` +
        (overtaking.length > 0 ? "" : `; the replicas' reports around: ${peers.map(relative).join(", ")}`),
    );
    expect(first.repl_id).toBe(lastReport.repl_id);
    expect(first.last_txn_id).toBeGreaterThanOrEqual(lastReport.last_txn_id);
    expect(overtaking.length).toBeGreaterThan(0);

    const acknowledgedSince = writing.acked.length - firstAck;
    const refusedSinceRestart = writing.refused.filter((write) => write.at * 1000 > restartedUs);
    const messages = [...new Set(newLines().map((line) => String(line.message)))];
    console.log(
      `writes acknowledged during the hold: ${acknowledgedSince}; refused since the restart: ${refusedSinceRestart.length}${refusedSinceRestart
        .slice(0, 3)
        .map((write) => ` [${write.why}]`)
        .join("")}; taken but not acknowledged within 500 ms, all run: ${writing.unacknowledged.length}\n` +
        `the restarted agent logged: ${messages.join(" | ")}`,
    );
    expect(acknowledgedSince).toBeGreaterThan(HOLD_MS / 100);
    expect(refusedSinceRestart).toEqual([]);

    // Assess: every acknowledged write is on every node once the writer stops and they settle.
    slow.heal();
    await writing.stop();
    await waitForSettled(active);
    expect((await active.topology())?.epoch).toBe(epoch);
    const acked = writing.acked;
    const missingOn = (id: string) =>
      withClient(active.node(id), async (client) => {
        let count = 0;
        for (let start = 0; start < acked.length; start += 500) {
          const slice = acked.slice(start, start + 500);
          const values = await client.mget(...slice.map((index) => `${PREFIX}:${index}`));
          count += values.filter((value) => value === null).length;
        }
        return count;
      });
    // The replica that did not acknowledge the last writes may be a moment behind.
    await active.waitFor(
      `every one of ${acked.length} acknowledged writes on every node`,
      async () => (await Promise.all(["node-1", "node-2", "node-3"].map(missingOn))).every((n) => n === 0),
      10_000,
    );
  });
});
