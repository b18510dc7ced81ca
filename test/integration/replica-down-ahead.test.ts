import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { NetLab } from "../../src/dev/netlab/netlab.ts";
import {
  CHAOS_CONFIG,
  expectKeysEverywhere,
  roleOf,
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
 * Nemesis seed 5301 (guarantee 1), with real processes: a replica that acknowledged writes the
 * candidate lacks goes down while the primary is unheard. node-3 is cut off from node-1 (the
 * primary) in the network lab; node-1 takes writes node-2 alone acknowledges (`WAIT 1`; Redis still
 * counts node-3 good for its 2 s lag); node-1's agent is killed and node-2's database SIGKILLed. node-3,
 * 1 of 1 fresh voters, reports the primary down.
 *
 * Before the fix node-3 was promoted as soon as node-1's report went stale: node-2's agent reported
 * its database down with the offset of its last written report (a quiet replica writes on a change
 * and at its keepalive), no gate looked at a down replica, and node-1, the only copy left of what
 * node-2 acknowledged, resynced from node-3 at the heal (the nemesis lost 205 writes so). Now node-2's
 * agent reports the dead process's last offset and gate `replica_down_ahead` holds the failover until
 * node-2's database answers again (restarted from its RDB, it holds them) or the grace ends.
 */

const PREFIX = "downahead";
const BEFORE = 100;
/** How long node-3 stays cut off while node-2 alone acknowledges: well inside Redis's 2 s guard lag. */
const AHEAD_FOR_MS = 700;
/** How long the controller must hold off once it held: several failure timeouts. */
const HOLD_MS = 6 * CHAOS_CONFIG.failureTimeoutMs;

const unavailable = NetLab.unavailableReason();
if (unavailable) console.warn(`replica-down-ahead test skipped: ${unavailable}`);

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** The times any client ran INFO on `node` (its \`cmdstat_info\`), this read included. */
async function infoCalls(node: RedisNode): Promise<number> {
  const text = await withClient(node, (client) => client.info("commandstats"));
  return Number(/cmdstat_info:calls=(\d+)/.exec(text)?.[1] ?? 0) + 1;
}

describe.runIf(unavailable === undefined)(
  "a replica that acknowledged more than the candidate goes down while the primary is unheard",
  () => {
    it("holds the failover while the replica that acknowledged more is down, and keeps every write it acknowledged", {
      timeout: 240_000,
    }, async () => {
      // Prepare: node-1 primary, node-2 and node-3 members; writes every node holds.
      cluster = await startChaosCluster({ network: "netns", readyTimeoutMs: 90_000 });
      const active = cluster;
      await shortenReplicationTimeout(active);
      await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
      await waitForMembers(active, "node-1", ["node-2", "node-3"]);
      await writeKeys(active.node("node-1"), `${PREFIX}:before`, BEFORE, 2);
      // The controllers are frozen while the fault takes shape; they resume once node-2 is down.
      for (const controller of active.controllers) controller.child.kill("SIGSTOP");
      const epoch = (await active.topology())?.epoch ?? 0;

      // Act: node-3 cut off from node-1; node-1 takes writes node-2 alone acknowledges; node-1's
      // agent is killed at once (nothing drops node-2 from the set or records what it holds).
      await active.partition({ cuts: [{ from: "node-1", to: "node-3" }] });
      const cutAt = Date.now();
      let acked = 0;
      await withClient(active.node("node-1"), async (client) => {
        while (Date.now() - cutAt < AHEAD_FOR_MS) {
          await client.set(`${PREFIX}:ahead:${acked}`, String(acked));
          const replicas = Number(await client.call("WAIT", "1", "1000"));
          if (replicas < 1) throw new Error(`write ${acked} not acknowledged by node-2`);
          acked++;
        }
      });
      await active.stopAgent("node-1", "SIGKILL");
      console.log(`${acked} writes acknowledged by node-2 alone while node-3 was cut off`);
      expect(acked).toBeGreaterThan(0);
      const primaryOffset = (await roleOf(active.node("node-1"))).offset ?? 0;
      const node3Offset = (await roleOf(active.node("node-3"))).offset ?? 0;
      expect(node3Offset, "node-3 lacks what node-2 acknowledged").toBeLessThan(primaryOffset);

      // node-2's agent reads its database at least twice after node-2 holds those writes (its
      // report of the dead process carries the last read); its RDB holds them too (SAVE); then
      // its database is killed.
      const node2 = active.node("node-2");
      await active.waitFor(
        "node-2 holding the primary's offset",
        async () => ((await roleOf(node2)).offset ?? 0) >= primaryOffset,
        WAIT_MS,
      );
      const before = await infoCalls(node2);
      let ours = 1;
      await active.waitFor(
        "node-2's agent reading its database twice more",
        async () => {
          ours++;
          return (await infoCalls(node2)) - before - ours >= 2;
        },
        WAIT_MS,
      );
      await withClient(node2, (client) => client.call("SAVE"));
      node2.signal("SIGKILL");
      for (const controller of active.controllers) controller.child.kill("SIGCONT");

      // Assess: the controller holds for node-2 instead of promoting node-3 (the code before promoted
      // node-3 once node-1's report went stale), for as long as node-2's database is down.
      const held = await waitForHold(active, "waiting_for_replica", "the controller holding for node-2");
      expect(String(held.reason ?? held.message)).toContain("node-2 (database down");
      const holdFrom = Date.now();
      while (Date.now() - holdFrom < HOLD_MS) {
        const topology = await active.topology();
        expect(topology?.epoch, `promoted ${topology?.primary_node_id} while node-2 is down`).toBe(epoch);
        await new Promise((resolve) => setTimeout(resolve, 200));
      }

      // Act: node-2's database restarts from its RDB (fenced, as docs/deploy.md starts databases),
      // the cut heals and node-1's agent is restarted.
      await node2.start({ extraArgs: FENCED_START_ARGS });
      await active.heal();
      active.startAgent("node-1");
      await waitForSettled(active);

      // Assess: every write node-2 alone acknowledged is on the primary and on every replica.
      await expectKeysEverywhere(active, [
        [`${PREFIX}:ahead`, acked],
        [`${PREFIX}:before`, BEFORE],
      ]);
    });
  },
);
