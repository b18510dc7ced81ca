import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { NetLab } from "../../src/dev/netlab/netlab.ts";
import {
  CHAOS_CONFIG,
  expectKeysEverywhere,
  shortenReplicationTimeout,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForHold,
  waitForMembers,
  waitForSettled,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Nemesis seed 4401 (guarantee 1), with real processes: a replica outside the primary's replica set
 * that followed the primary again after the primary's agent's last report. node-1's agent dropped
 * node-3 from its set while node-3's database was frozen for a moment (a fork stall), and was
 * killed before node-3 came back; node-3 then acknowledged node-1's writes (`WAIT 1`) while node-2,
 * the one member, was cut off from node-1 in the network lab. Redis counts node-3 in `WAIT` and in
 * `min-replicas-to-write`, and no agent was left to demand it or to record it. node-3's agent then
 * fell silent (the nemesis: its clock skewed 25 s back, so its reports looked old).
 *
 * Before the fix node-2, 1 of 1 fresh voters, was promoted once node-3's report expired, and what
 * node-3 alone acknowledged was lost at the heal (the nemesis lost 139 writes so). Now gate
 * `follower_unheard` holds the failover while node-3's agent is unheard: its last report followed
 * node-1 with its link up after node-1's agent's last one.
 */

const PREFIX = "follower";
const BEFORE = 100;
/** How long node-2 stays cut off while node-3 alone acknowledges: well inside Redis's 2 s guard lag. */
const AHEAD_FOR_MS = 700;
/** How long the controller must hold off once node-3's report expired: several failure timeouts. */
const HOLD_MS = 6 * CHAOS_CONFIG.failureTimeoutMs;

const unavailable = NetLab.unavailableReason();
if (unavailable) console.warn(`follower-unheard test skipped: ${unavailable}`);

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  for (const id of ["node-1", "node-2", "node-3"]) {
    cluster?.signalAgent(id, "SIGCONT");
    cluster?.node(id).signal("SIGCONT");
  }
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** When `id`'s agent last wrote (µs, its heartbeat's `agent_updated`), or 0. */
async function agentWrittenUs(cluster: LocalCluster, id: string): Promise<number> {
  const heartbeat = cluster.heartbeatOf(await cluster.snapshot(), id);
  return heartbeat?.agent_updated ?? heartbeat?.last_updated ?? 0;
}

describe.runIf(unavailable === undefined)(
  "a replica outside the set that followed the primary after its agent's last report",
  () => {
    it("holds the failover while the follower's agent is unheard, and keeps every write it acknowledged", {
      timeout: 240_000,
    }, async () => {
      // Prepare: node-1 primary, node-2 and node-3 members; writes every node holds.
      cluster = await startChaosCluster({ network: "netns", readyTimeoutMs: 90_000 });
      const active = cluster;
      // node-2 sees its link to node-1 down within ~2 s of the cut, not Redis's default 60 s.
      await shortenReplicationTimeout(active);
      await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
      await waitForMembers(active, "node-1", ["node-2", "node-3"]);
      await writeKeys(active.node("node-1"), `${PREFIX}:before`, BEFORE, 2);

      // The controller is frozen while the fault takes shape (on a loaded host node-1's dead agent
      // made it fail over before the cut below existed); it resumes once node-3's agent is silent.
      for (const controller of active.controllers) controller.child.kill("SIGSTOP");
      // node-3's database stalls (a fork): node-1's agent drops it from the set; then node-1's
      // agent is killed, before node-3 is back to be demanded again.
      active.node("node-3").signal("SIGSTOP");
      await active.waitFor(
        "node-3 out of node-1's replica set",
        async () => !((await active.snapshot()).replicaSets["node-1"] ?? []).includes("node-3"),
        WAIT_MS,
      );
      await active.stopAgent("node-1", "SIGKILL");
      const primaryLastUs = await agentWrittenUs(active, "node-1");
      active.node("node-3").signal("SIGCONT");
      // node-3's agent, running all along, reports it following node-1 again, after node-1's last report.
      await waitForFollowers(active, "node-1", ["node-3"]);
      await active.waitFor(
        "node-3's report after node-1's agent's last one",
        async () => (await agentWrittenUs(active, "node-3")) > primaryLastUs,
        WAIT_MS,
      );
      expect((await active.snapshot()).replicaSets["node-1"] ?? []).toEqual(["node-2"]);

      // Act: node-2 cut off from node-1; node-1 goes on taking writes node-3 alone acknowledges
      // (Redis counts it: min-replicas-to-write is 1, for node-2); node-3's agent falls silent.
      const epoch = (await active.topology())?.epoch ?? 0;
      await active.partition({ cuts: [{ from: "node-1", to: "node-2" }] });
      const cutAt = Date.now();
      let acked = 0;
      await withClient(active.node("node-1"), async (client) => {
        while (Date.now() - cutAt < AHEAD_FOR_MS) {
          await client.set(`${PREFIX}:ahead:${acked}`, String(acked));
          const replicas = Number(await client.call("WAIT", "1", "1000"));
          if (replicas < 1) throw new Error(`write ${acked} not acknowledged by node-3`);
          acked++;
        }
      });
      expect(active.signalAgent("node-3", "SIGSTOP")).toBe(true);
      for (const controller of active.controllers) controller.child.kill("SIGCONT");
      console.log(`${acked} writes acknowledged by node-3 alone while node-2 was cut off`);
      expect(acked).toBeGreaterThan(0);

      // Assess: once node-3's report expired (its keepalive plus the failure timeout; the controller
      // first asks it to report), the controller holds instead of promoting node-2, for as long as
      // node-3's agent is silent (the code before promoted node-2 here).
      const held = await waitForHold(active, "follower_unheard", "the controller holding for node-3");
      expect(String(held.reason ?? held.message)).toContain(
        "node-3, outside node-1's replica set, its agent last heard",
      );
      const holdFrom = Date.now();
      while (Date.now() - holdFrom < HOLD_MS) {
        const topology = await active.topology();
        expect(topology?.epoch, `promoted ${topology?.primary_node_id} while node-3 is unheard`).toBe(epoch);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }

      // Act: node-3's agent runs again, the cut heals and node-1's agent is restarted.
      expect(active.signalAgent("node-3", "SIGCONT")).toBe(true);
      await active.heal();
      active.startAgent("node-1");
      // The shard settles on whichever primary the controller keeps or chooses once node-1's agent
      // is back (a later failover to a node holding everything is allowed; the count below judges it).
      await waitForSettled(active);

      // Assess: every write node-3 alone acknowledged is on the primary and on every replica.
      await expectKeysEverywhere(active, [
        [`${PREFIX}:ahead`, acked],
        [`${PREFIX}:before`, BEFORE],
      ]);
    });
  },
);
