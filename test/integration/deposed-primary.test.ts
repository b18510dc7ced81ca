import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  linesWith,
  probeWrite,
  startChaosCluster,
  tryAcknowledgedWrite,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30, nemesis seed 3401 (guarantees 1 and 2): Redis's guard on a primary counts every replica
 * that acknowledges, member of its replica set or not. node-2's host freezes (redis and agent);
 * primary node-1's agent drops it from the set (guard: 1 of {node-3}) and then dies; node-1's
 * database hangs and the controller promotes node-3, so node-1, when it wakes, has no good replica
 * and refuses writes. Then node-2's redis resumes on its old link to node-1 before its agent does:
 * node-1 counts it and takes writes again, which `WAIT 1` acknowledges (node-2 applied them) while
 * node-3 is the primary: two writable primaries, and every such write is lost when node-2 follows
 * node-3. Now the promoted node fences the old primary's database itself, again every cycle while
 * it does not answer (src/core/depose.ts, src/agent/depose.ts).
 * Real redis-server, agent and controller processes, DynamoDB Local and SQS (loopback).
 */

const PREFIX = "deposed";
/** How long node-2's agent stays frozen after its database resumed: the window writes are tried in. */
const AGENT_LATE_MS = 4_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  cluster?.node("node-1").signal("SIGCONT");
  cluster?.node("node-2").signal("SIGCONT");
  cluster?.signalAgent("node-2", "SIGCONT");
  // A failure keeps the processes' logs (the error names the directory).
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a deposed primary whose agent is dead", () => {
  it("takes no write once promoted past, even when a replica outside its set re-attaches to it", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary, node-2 and node-3 linked members of its set.
    cluster = await startChaosCluster({ config: CHAOS_CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    const epoch = (await active.topology())?.epoch ?? 0;

    // Act: node-2's host freezes; node-1's agent drops it from the set, then dies.
    active.node("node-2").signal("SIGSTOP");
    active.signalAgent("node-2", "SIGSTOP");
    await active.waitFor(
      "node-2 dropped from node-1's replica set",
      async () => {
        const snapshot = await active.snapshot();
        const members = snapshot.replicaSets["node-1"] ?? [];
        return members.includes("node-3") && !members.includes("node-2");
      },
      WAIT_MS,
    );
    await active.stopAgent("node-1", "SIGKILL");
    active.node("node-1").signal("SIGSTOP");
    try {
      const after = await waitForNewPrimary(active, epoch);
      expect(after.primary_node_id).toBe("node-3");
      // node-3 opens once its promotion window ends.
      await active.waitFor(
        "node-3 writable",
        async () => (await probeWrite(active.node("node-3"), `${PREFIX}:probe`)).accepted,
        WAIT_MS,
      );
    } finally {
      active.node("node-1").signal("SIGCONT");
    }
    // Up to a few cycles for node-3 to reach the woken node-1 (absent on the code before: then the
    // writes below tell).
    await active
      .waitFor(
        "node-3 fencing node-1",
        () =>
          linesWith(active.logLines("agent-node-3.log"), /^old primary fenced by its successor/).length > 0,
        5_000,
      )
      .catch(() => undefined);

    // node-2's database resumes on its old link to node-1; its agent only AGENT_LATE_MS later.
    active.node("node-2").signal("SIGCONT");
    const outcomes: string[] = [];
    const acked: string[] = [];
    await withClient(active.node("node-1"), async (client) => {
      const until = Date.now() + AGENT_LATE_MS;
      for (let index = 0; Date.now() < until; index++) {
        const key = `${PREFIX}:${index}`;
        const outcome = await tryAcknowledgedWrite(client, key);
        outcomes.push(outcome);
        if (outcome === "acked") acked.push(key);
        await new Promise((resolve) => setTimeout(resolve, 20)); // pacing of the writer, not a wait for a condition
      }
    });
    active.signalAgent("node-2", "SIGCONT");
    await waitForFollowers(active, "node-3", ["node-2"]);

    // Assess: node-1 refused every write (no replica acknowledged one there), the successor said
    // so, and nothing a replica acknowledged is missing from the primary.
    const tally = Object.fromEntries(
      [...new Set(outcomes)].map((o) => [o, outcomes.filter((x) => x === o).length]),
    );
    expect(acked, `writes on deposed node-1 after node-2 resumed: ${JSON.stringify(tally)}`).toEqual([]);
    expect(outcomes.length).toBeGreaterThan(10);
    expect(
      linesWith(active.logLines("agent-node-3.log"), /^old primary fenced by its successor/),
    ).toHaveLength(1);
    const kept = await withClient(active.node("node-3"), async (client) =>
      acked.length === 0 ? 0 : (await client.mget(...acked)).filter((value) => value !== null).length,
    );
    expect(kept).toBe(acked.length);
  });
});
