import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForHold,
  waitForNewPrimary,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30, finding 1 (guarantee 1): a member of the primary's replica set whose agent is dead
 * keeps replicating and acknowledging `WAIT`. Once its report is past its keepalive plus the
 * failure timeout, it used to count as a lost copy: only the fresh replica voted and was ranked,
 * and was promoted without the writes only the silent member held. Now the controller holds the
 * failover (`member_unheard`) until the member's agent reports again, then promotes by offset.
 * Real redis-server, agent and controller processes, DynamoDB Local and SQS (loopback).
 */

const PREFIX = "unheard";
const COUNT = 200;

let cluster: LocalCluster | undefined;

afterEach(async () => {
  cluster?.node("node-2").signal("SIGCONT");
  await cluster?.stop();
  cluster = undefined;
});

describe("a member of the replica set whose agent is dead", () => {
  it("does not promote while a member's agent is dead, then fails over without losing an acknowledged write once it is back", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary, node-2 and node-3 linked members of its set.
    cluster = await startChaosCluster({ config: CHAOS_CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await active.waitFor(
      "node-2 and node-3 in node-1's replica set",
      async () => {
        const snapshot = await active.snapshot();
        const members = snapshot.replicaSets["node-1"] ?? [];
        return (
          snapshot.replicaSetVersions["node-1"] !== undefined &&
          members.includes("node-2") &&
          members.includes("node-3")
        );
      },
      WAIT_MS,
    );
    const epoch = (await active.topology())?.epoch ?? 0;
    // node-3's agent dies (its database keeps replicating); wait until its report is neither fresh
    // nor current (past its keepalive plus the failure timeout).
    await active.stopAgent("node-3", "SIGKILL");
    await active.waitFor(
      "node-3's last report past its keepalive plus the failure timeout",
      async () => {
        const node = active.heartbeatOf(await active.snapshot(), "node-3");
        if (node === undefined) return false;
        const ageMs = active.aws.clock.now() - (node.agent_updated ?? node.last_updated) / 1000;
        return ageMs > (node.keepalive_ms ?? 0) + CHAOS_CONFIG.failureTimeoutMs + 500;
      },
      WAIT_MS,
    );

    // Act: node-2 stalls while writes go on, acknowledged by node-3 alone (WAIT 1); the primary's
    // database is killed before node-2 catches up, then node-2 resumes.
    const node2 = active.node("node-2");
    node2.signal("SIGSTOP");
    try {
      await writeKeys(active.node("node-1"), PREFIX, COUNT, 1);
      active.node("node-1").signal("SIGKILL");
      await delay(100); // node-2 stays stalled past the kill: the fault's shape, not a wait for a condition
    } finally {
      node2.signal("SIGCONT");
    }
    const held = await waitForHold(
      active,
      "member_unheard",
      "the controller holding the failover for node-3",
    );
    // Several failure timeouts more: the hold lasts while node-3's agent is dead.
    await delay(5 * CHAOS_CONFIG.failureTimeoutMs); // the observation window, not a wait for a condition
    const during = await active.topology();

    // Assess: no promotion while node-3 is unheard, and the reason names it.
    expect({ epoch: during?.epoch, primary: during?.primary_node_id }).toEqual({ epoch, primary: "node-1" });
    expect(String(held.reason ?? held.message)).toMatch(
      /member node-3 of node-1's replica set unheard for \d+ s/,
    );

    // Act: node-3's agent comes back.
    active.startAgent("node-3");
    const after = await waitForNewPrimary(active, epoch);

    // Assess: the new primary holds every write a replica acknowledged. (node-2's kernel buffered
    // the replication stream while it was stopped, so it may tie with node-3: then either may win.)
    expect(["node-2", "node-3"]).toContain(after.primary_node_id);
    expect(await countKeys(active.node(after.primary_node_id ?? "node-3"), PREFIX, COUNT)).toBe(COUNT);
  });
});
