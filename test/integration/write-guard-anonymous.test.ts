import { afterEach, describe, expect, it } from "vitest";
import { GUARD_MAX_LAG_S, PROMOTION_FENCE_WINDOW_MS } from "../../src/core/write-guard.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  linesWith,
  startChaosCluster,
  WAIT_MS,
  waitForAgentWrite,
  withClient,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30, finding 3 (guarantee 2): Redis counts every replica acknowledging within
 * `min-replicas-max-lag`, the agent's own or not. The guard used to demand only the members of
 * the replica set, so two replicas without an agent (a database attached before its agent, a
 * scale-out, an agent without its IAM grant) satisfied "2" for two members that had stopped
 * acknowledging: the primary took writes no member held, while a failover could promote a member.
 * Now the guard demands every acknowledging replica outside the set as well.
 *
 * Real processes: node-1 primary, node-2 and node-3 members (agents, controller, DynamoDB Local,
 * the SQS emulator) and two more redis-server processes following node-1 with no agent. node-1's
 * agent is paused before the members freeze: it stands for a primary's agent cut off from the
 * store, where the database's own count is the only fence (docs/agent.md#the-replica-set-guard).
 * With a live agent reaching the store the members would leave the set through the store, which
 * is the documented path, not the fence under test.
 */

/** The production failure timeout: node-1's heartbeat stays fresh on loaded cores while the test prepares. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };

/**
 * When a frozen member stops counting: the guard's lag in whole seconds, plus the once-a-second
 * replication cron that refreshes Redis's count of good replicas (issue 30, finding 5), plus a
 * margin for the loaded machine.
 */
const REFUSED_WITHIN_MS = PROMOTION_FENCE_WINDOW_MS + 1000 + 1500;

/** How long the writer goes on after the stop: past the bound, to see writes stay refused. */
const WRITE_FOR_MS = REFUSED_WITHIN_MS + 2000;

let cluster: LocalCluster | undefined;
const anonymous: RedisNode[] = [];

afterEach(async () => {
  for (const id of ["node-2", "node-3"]) cluster?.node(id).signal("SIGCONT");
  cluster?.signalAgent("node-1", "SIGCONT");
  await Promise.all(anonymous.splice(0).map((node) => node.destroy()));
  await cluster?.stop();
  cluster = undefined;
});

/** The `state` and `lag` of each replica node-1 lists, by port. */
async function listedReplicas(primary: RedisNode): Promise<Map<number, { state: string; lag: number }>> {
  const info = await withClient(primary, (client) => client.info("replication"));
  const listed = new Map<number, { state: string; lag: number }>();
  for (const match of info.matchAll(/^slave\d+:.*port=(\d+),state=(\w+),.*lag=(\d+)/gm)) {
    listed.set(Number(match[1]), { state: String(match[2]), lag: Number(match[3]) });
  }
  return listed;
}

describe("the write guard and replicas without an agent", () => {
  it("two replicas without an agent cannot stand in for two frozen members: node-1 refuses writes", {
    timeout: 180_000,
  }, async () => {
    // Prepare: the shard online, node-2 and node-3 in node-1's set, D and E attached with no agent.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const primary = active.node("node-1");
    await active.waitFor(
      "node-2 and node-3 in node-1's replica set",
      async () => {
        const members = (await active.snapshot()).replicaSets["node-1"] ?? [];
        return members.includes("node-2") && members.includes("node-3");
      },
      WAIT_MS,
    );
    for (const id of ["anon-d", "anon-e"]) {
      const node = new RedisNode(await freePort(), id);
      anonymous.push(node);
      await node.start({ replicaOf: primary.address });
    }
    await active.waitFor(
      "D and E online at node-1, acknowledging",
      async () => {
        const listed = await listedReplicas(primary);
        return anonymous.every((node) => {
          const entry = listed.get(node.port);
          return entry?.state === "online" && entry.lag <= 1;
        });
      },
      WAIT_MS,
    );
    // A few of node-1's agent cycles after D and E came online: its guard has seen them.
    await waitForAgentWrite(active, "node-1", Date.now(), 4 * CONFIG.heartbeatIntervalMs);
    const [, guard] = (await withClient(primary, (client) =>
      client.config("GET", "min-replicas-to-write"),
    )) as string[];
    expect(active.signalAgent("node-1", "SIGSTOP")).toBe(true);

    // Act: the members freeze; a writer keeps writing to node-1.
    for (const id of ["node-2", "node-3"]) active.node(id).signal("SIGSTOP");
    const stoppedAt = Date.now();
    const accepted: Array<{ key: string; atMs: number }> = [];
    const refused: Array<{ atMs: number; error: string }> = [];
    await withClient(primary, async (client) => {
      for (let serial = 0; Date.now() - stoppedAt < WRITE_FOR_MS; serial++) {
        const key = `after-stop-${serial}`;
        try {
          await client.set(key, String(serial));
          accepted.push({ key, atMs: Date.now() - stoppedAt });
        } catch (error) {
          refused.push({ atMs: Date.now() - stoppedAt, error: String(error) });
        }
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    });

    // Assess: the guard counted D and E beside the members, so the count fell short once the
    // members stopped acknowledging (on the old code "2" was met by D and E, and every write passed).
    const lastAccepted = accepted.at(-1)?.atMs;
    const firstRefused = refused[0];
    console.log(
      `write guard with 2 anonymous replicas: min-replicas-to-write ${guard} (lag ${GUARD_MAX_LAG_S} s); ` +
        `${accepted.length} writes accepted after the stop, the last at ${lastAccepted ?? "-"} ms; ` +
        `${refused.length} refused, the first at ${firstRefused?.atMs ?? "-"} ms (${firstRefused?.error ?? "-"})`,
    );
    expect(guard).toBe("4");
    // The primary's agent said which replicas it cannot name (guarantee 1's assumption, docs/safety.md).
    const named = linesWith(
      active.logLines("agent-node-1.log"),
      /^replicas no node id names acknowledge writes/,
    );
    expect(named.length).toBeGreaterThanOrEqual(1);
    expect(named.flatMap((line) => line.replicas as string[])).toEqual(
      expect.arrayContaining(anonymous.map((node) => node.address)),
    );
    expect(firstRefused?.error).toMatch(/NOREPLICAS/);
    expect(firstRefused?.atMs).toBeLessThanOrEqual(REFUSED_WITHIN_MS);
    // No write acknowledged once the members could have been gone for good: every write node-1
    // took after the stop fell in the window its frozen members still counted, none later
    // exists only on D and E.
    expect(accepted.every((write) => write.atMs <= (firstRefused?.atMs ?? 0))).toBe(true);
    expect(refused.every((refusal) => /NOREPLICAS/.test(refusal.error))).toBe(true);
  });
});
