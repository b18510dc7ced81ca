import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { NetLab } from "../../src/dev/netlab/netlab.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  historyAt,
  linesWith,
  shortenReplicationTimeout,
  startChaosCluster,
  WAIT_MS,
  waitForAgentWrite,
  waitForFollowers,
  waitForMembers,
  waitForNewPrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30, finding 6 (guarantee 1), with real processes: a replica outside the old primary's
 * replica set that acknowledged writes the member lacks. node-3 left node-1's set while its
 * database was frozen (as a fork stall does) and came back with its agent silent, so node-1's agent
 * could not name it again: Redis counts it, the guard demands it as an anonymous replica, and it
 * acknowledges writes (`WAIT 1`) while node-2, the one member, is cut off from node-1 in the
 * network lab (a frozen process would still receive the stream into its socket buffer). node-1's
 * host dies (agent and database). The member node-2 holds less than node-3.
 *
 * Before the fix the controller waited for node-3 three failure timeouts (`OUTSIDE_SET_GRACE`),
 * then promoted node-2, and node-3's resync dropped what only it had acknowledged. Now gate
 * `outside_set_ahead` waits with no time limit; when node-1's host comes back (agent, then an
 * empty database), its agent confirms the old process dead, every replica becomes a candidate,
 * and node-3 is promoted holding every acknowledged write.
 */

const PREFIX = "outside";
const BEFORE = 100;
/** How long node-2 stays cut off while node-3 alone acknowledges: well inside Redis's 2 s guard lag. */
const AHEAD_FOR_MS = 700;
/** How long the controller must hold off: several times the old 3-failure-timeout grace. */
const HOLD_MS = 6 * CHAOS_CONFIG.failureTimeoutMs;

/** A quiet replica's report window on these timings: its keepalive (20 cycles) plus the failure timeout. */
const REPORT_WINDOW_MS = 20 * CHAOS_CONFIG.heartbeatIntervalMs + CHAOS_CONFIG.failureTimeoutMs;

const unavailable = NetLab.unavailableReason();
if (unavailable) console.warn(`outside-set-ahead test skipped: ${unavailable}`);

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const id of ["node-1", "node-2", "node-3"]) {
    cluster?.signalAgent(id, "SIGCONT");
    cluster?.node(id).signal("SIGCONT");
  }
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

async function minReplicasToWrite(cluster: LocalCluster, id: string): Promise<number> {
  const [, value] = (await withClient(cluster.node(id), (client) =>
    client.config("GET", "min-replicas-to-write"),
  )) as string[];
  return Number(value);
}

describe.runIf(unavailable === undefined)(
  "a replica outside the replica set that holds more than the member",
  () => {
    it("is waited for, not dropped: promoted once the old primary's crash is confirmed, with every acknowledged write", {
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

      // node-3's agent falls silent past its report window: node-1's agent no longer names it.
      expect(active.signalAgent("node-3", "SIGSTOP")).toBe(true);
      await active.waitFor(
        "node-3's last report past its keepalive and the failure timeout",
        async () => {
          const heartbeat = active.heartbeatOf(await active.snapshot(), "node-3");
          const writtenMs = (heartbeat?.agent_updated ?? heartbeat?.last_updated ?? 0) / 1000;
          return Date.now() - writtenMs > REPORT_WINDOW_MS + CHAOS_CONFIG.failureTimeoutMs;
        },
        WAIT_MS,
      );
      // node-3's database stalls (a fork): node-1's agent drops it from the set.
      active.node("node-3").signal("SIGSTOP");
      await active.waitFor(
        "node-3 out of node-1's replica set",
        async () => !((await active.snapshot()).replicaSets["node-1"] ?? []).includes("node-3"),
        WAIT_MS,
      );
      // node-1's agent names the replicas it lists from its last read of the store, where node-3
      // was still a member (kept however silent): node-3 back before the agent read again rejoins.
      await waitForAgentWrite(active, "node-1", Date.now(), 4 * CHAOS_CONFIG.heartbeatIntervalMs);
      active.node("node-3").signal("SIGCONT");
      // It catches up, and the guard demands it as a replica no member stands for.
      await active.waitFor(
        "node-1 demanding node-2 and the anonymous node-3",
        async () => (await minReplicasToWrite(active, "node-1")) === 2,
        WAIT_MS,
      );
      await writeKeys(active.node("node-1"), `${PREFIX}:both`, BEFORE, 2);
      expect((await active.snapshot()).replicaSets["node-1"] ?? []).toEqual(["node-2"]);

      // Act: node-2 cut off from node-1; node-1 goes on taking writes node-3 alone acknowledges;
      // node-1's host dies. The cut stays: nothing node-1 sent reaches node-2 late.
      const epoch = (await active.topology())?.epoch ?? 0;
      await active.partition({ cuts: [{ from: "node-1", to: "node-2" }] });
      const frozenAt = Date.now();
      let acked = 0;
      await withClient(active.node("node-1"), async (client) => {
        while (Date.now() - frozenAt < AHEAD_FOR_MS) {
          await client.set(`${PREFIX}:ahead:${acked}`, String(acked));
          const replicas = Number(await client.call("WAIT", "1", "1000"));
          if (replicas < 1) throw new Error(`write ${acked} not acknowledged by node-3`);
          acked++;
        }
      });
      await active.stopAgent("node-1", "SIGKILL");
      active.node("node-1").signal("SIGKILL");
      expect(active.signalAgent("node-3", "SIGCONT")).toBe(true);
      console.log(`${acked} writes acknowledged by node-3 alone while node-2 was cut off`);
      expect(acked).toBeGreaterThan(0);

      // Assess: no promotion of node-2 while node-3, outside the set, holds more (the old code
      // promoted node-2 after three failure timeouts). The controller holds for node-3 online
      // (gate outside_set_ahead) or, when node-2's report was stale at its first look (a loaded
      // host: the CI run of stop 44 saw node-2's heartbeat 1,044 ms old at a 1 s failure timeout),
      // it marks the shard offline and holds there (gate unfenced_old_primary) until node-1's
      // crash is confirmed. Either way node-3 is waited for.
      const holdFrom = Date.now();
      await active.waitFor(
        "the controller holding for node-3",
        async () =>
          linesWith(
            active.logLines("controller-1.log"),
            /outside node-1's replica set, holds more|node-3 is eligible but not in node-1's replica set/,
          ).length > 0,
        WAIT_MS,
      );
      while (Date.now() - holdFrom < HOLD_MS) {
        const topology = await active.topology();
        // No other node named primary (an offline mark under a loaded host's stale reports is no
        // promotion: a fresh-clone CI run beside two nemesis runs saw one).
        expect(
          topology?.primary_node_id === undefined || topology.primary_node_id === "node-1",
          `promoted ${topology?.primary_node_id} at epoch ${topology?.epoch} while node-3 holds more`,
        ).toBe(true);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }

      // Act: node-1's host reboots: its agent, then its database (empty: the process held the data
      // in memory). The agent fences the new process and reports the old one dead (\`restarted\`).
      active.startAgent("node-1");
      await active.node("node-1").start();
      const after = await waitForNewPrimary(active, epoch);

      // Assess: node-3, holding every acknowledged write, took over; node-2 follows and holds them too.
      expect(after.primary_node_id).toBe("node-3");
      console.log(`failover reason: ${(await historyAt(active, after.epoch)).reason}`);
      expect(await countKeys(active.node("node-3"), `${PREFIX}:ahead`, acked)).toBe(acked);
      await active.heal();
      await waitForFollowers(active, "node-3", ["node-2"]);
      expect(await countKeys(active.node("node-2"), `${PREFIX}:ahead`, acked)).toBe(acked);
      expect(await countKeys(active.node("node-2"), `${PREFIX}:before`, BEFORE)).toBe(BEFORE);
    });
  },
);
