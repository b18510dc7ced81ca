import { afterEach, describe, expect, it } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import { NetLab } from "../../src/dev/netlab/netlab.ts";
import {
  expectKeysEverywhere,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForSettled,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Nemesis seed 5501 (guarantee 1): the primary was isolated from its replicas in the network lab,
 * SIGKILLed and restarted empty during the partition. No connection close reached the replicas
 * (Redis counted their links up for its 60 s `repl-timeout`), so their agents never parked them,
 * and when the partition healed all three full-synced from the empty process: every acknowledged
 * write was lost. Now a replica is parked after PARK_AFTER_SILENT_PROBES probes in a row without an
 * answer, as after a close, and unparked only when the primary answers as the same process (or
 * one holding its data). The code before never parked here ("node-2 parked" timed out).
 */

const KEYS = 300;

const unavailable = NetLab.unavailableReason();
if (unavailable) console.warn(`partitioned-primary-restart test skipped: ${unavailable}`);

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe.runIf(unavailable === undefined)(
  "a primary restarted empty while partitioned from its replicas",
  () => {
    it("finds its replicas parked, holding every acknowledged write, when the partition heals", {
      timeout: 180_000,
    }, async () => {
      // Prepare: node-1 primary, node-2 and node-3 members holding every write. Redis's default
      // repl-timeout (60 s): the replicas' links stay "up" through the partition.
      cluster = await startChaosCluster({ network: "netns", readyTimeoutMs: 90_000 });
      const active = cluster;
      await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
      await waitForMembers(active, "node-1", ["node-2", "node-3"]);
      await writeKeys(active.node("node-1"), "acked", KEYS, 2);
      // The controllers are frozen: this is about what the replicas do, not about a failover.
      for (const controller of active.controllers) controller.child.kill("SIGSTOP");

      // Act: node-1 isolated from its replicas.
      await active.partition({
        cuts: [
          { from: "node-1", to: "node-2" },
          { from: "node-1", to: "node-3" },
        ],
      });

      // Assess: both replicas parked by their agents, with no close to see.
      for (const id of ["node-2", "node-3"]) {
        await active.waitFor(
          `${id} parked`,
          async () => (await roleOf(active.node(id))).primaryPort === PARKED_PORT,
          WAIT_MS,
        );
      }

      // Act: node-1's database killed and restarted empty (fenced, as a supervisor starts it) while
      // partitioned; then the partition heals and the controllers resume.
      const primary = active.node("node-1");
      primary.signal("SIGKILL");
      await primary.stop();
      primary.wipeData();
      await primary.start({ extraArgs: FENCED_START_ARGS });
      await active.heal();
      for (const controller of active.controllers) controller.child.kill("SIGCONT");

      // Assess: a failover to a replica holding everything, the shard settles on it, and every
      // acknowledged write is on every node. (The failover is waited for first: the replicas'
      // stored reports may still say "following node-1, link up" from before the partition, which
      // alone would look settled on node-1.)
      await active.waitFor(
        "a failover away from node-1",
        async () => {
          const topology = await active.topology();
          return topology?.status === "online" && topology.primary_node_id !== "node-1";
        },
        WAIT_MS,
      );
      await waitForSettled(active);
      const topology = await active.topology();
      expect(topology?.primary_node_id).not.toBe("node-1");
      await expectKeysEverywhere(active, [["acked", KEYS]]);
    });
  },
);
