import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import type { Heartbeat } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { TcpProxy } from "../../src/dev/nemesis/tcp-proxy.ts";
import { NetLab } from "../../src/dev/netlab/netlab.ts";
import { awsEnv } from "../support/aws.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  expectKeysEverywhere,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForSettled,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Nemesis seed 7335, incident B (guarantee 1), with real processes: a member of the old primary's
 * replica set whose agent was heard, but whose report carried a database answer older than the
 * failure timeout (its cycle's store calls came late after its INFO read), was neither a voter, nor
 * quiet (waited for), nor unheard (held for): the controller promoted another replica on its vote
 * alone while that member still acknowledged the old primary's writes (`WAIT 1`), and they were lost.
 *
 * node-3's agent reaches DynamoDB through a TCP proxy that delays every chunk STORE_DELAY_MS each
 * way (the nemesis's `store-slow`; its store timeout raised so the calls succeed, slowly): its INFO
 * read is ~3 delays old when its report lands, its write ~1 delay old, so each report is heard, on
 * a database answer older than the failure timeout, for about FAILURE_TIMEOUT_MS - STORE_DELAY_MS.
 * Then, with the controller frozen and node-1's agent dead: once node-3's agent is inside a store
 * read (its INFO read done), node-2 is cut off from node-1 in the network lab and node-1 takes
 * writes node-3 alone acknowledges; the controller resumes. node-3's report lands with the offset of
 * its INFO read, before the writes and no further than node-2's, so no `replica_ahead` either. The
 * code before promoted node-2 (1 of 1 fresh replicas report the primary down) and lost the writes;
 * now node-3 is asked to report and waited for as a quiet replica (gate `quiet_replicas`).
 */

const PREFIX = "heard-not-fresh";
const COUNT = 100;
/**
 * The failure timeout: a report is heard this long after its agent wrote it. Bounded by the delay:
 * heard-not-fresh needs 3 delays above it (INFO read to arrival) and one below it (write to arrival).
 */
const FAILURE_TIMEOUT_MS = 2200;
/**
 * The delay of each chunk through node-3's store proxy, each way. A store call takes two of them,
 * and the SDK's own request timeout (2 s, src/adapters/aws-clients.ts) bounds it: hence 850 ms, and
 * a failure timeout under 3 delays. Measured on arrival: written ~0.9 s ago, answered ~2.7 s ago
 * (~4.5 s for a keepalive write, whose snapshot read takes two round trips).
 */
const STORE_DELAY_MS = 850;
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: FAILURE_TIMEOUT_MS } as const;

const unavailable = NetLab.unavailableReason();
if (unavailable) console.warn(`heard-not-fresh test skipped: ${unavailable}`);

let cluster: LocalCluster | undefined;
let proxy: TcpProxy | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  await proxy?.stop();
  cluster = undefined;
  proxy = undefined;
});

/** Ages (ms, now) of a report's write by its agent and of its database's answer. */
function agesOf(heartbeat: Heartbeat, nowMs: number): { agentMs: number; databaseMs: number } {
  return {
    agentMs: Math.round(nowMs - (heartbeat.agent_updated ?? heartbeat.last_updated) / 1000),
    databaseMs: Math.round(nowMs - heartbeat.last_updated / 1000),
  };
}

/** Waits for a report of `id` written after `afterUs` (its `agent_updated`) and returns it with its ages on arrival. */
async function nextReport(
  cluster: LocalCluster,
  id: string,
  afterUs: number,
): Promise<{ heartbeat: Heartbeat; agentMs: number; databaseMs: number }> {
  let found: { heartbeat: Heartbeat; agentMs: number; databaseMs: number } | undefined;
  await cluster.waitFor(
    `a report of ${id} after ${afterUs}`,
    async () => {
      const heartbeat = cluster.heartbeatOf(await cluster.snapshot(), id);
      if (heartbeat === undefined || (heartbeat.agent_updated ?? 0) <= afterUs) return false;
      found = { heartbeat, ...agesOf(heartbeat, cluster.aws.clock.now()) };
      return true;
    },
    WAIT_MS,
  );
  return found as { heartbeat: Heartbeat; agentMs: number; databaseMs: number };
}

describe.runIf(unavailable === undefined)(
  "a member heard on a database answer older than the failure timeout",
  () => {
    it("is waited for, not passed over, while it acknowledges the old primary's writes cut off from the other replica", {
      timeout: 300_000,
    }, async () => {
      // Prepare: node-3's agent behind a slow store proxy; node-1 primary, node-2 and node-3 members.
      const direct = awsEnv().AWS_ENDPOINT_URL_DYNAMODB;
      if (!direct) throw new Error("no AWS_ENDPOINT_URL_DYNAMODB from the global setup");
      const slow = TcpProxy.forUrl(direct, "node-3 -> DynamoDB");
      proxy = slow;
      await slow.start();
      slow.setMode({ kind: "delay", delayMs: STORE_DELAY_MS });
      let lab: NetLab | undefined;
      cluster = await startChaosCluster({
        config: CONFIG,
        network: "netns",
        readyTimeoutMs: 120_000,
        onNetlab: async (created) => {
          lab = created;
          await slow.listenAlso(created.awsAddress);
        },
        agentEnv: (id) =>
          id === "node-3" && lab
            ? {
                AWS_ENDPOINT_URL_DYNAMODB: lab.hostUrl(slow.urlFor(direct)),
                [ENV.storeTimeoutMs]: String(8 * STORE_DELAY_MS),
              }
            : undefined,
      });
      const active = cluster;
      await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
      await waitForMembers(active, "node-1", ["node-2", "node-3"]);
      await writeKeys(active.node("node-1"), `${PREFIX}:before`, COUNT, 2);

      // The fault's shape, checked before relying on it: a report of node-3 lands heard (written
      // within the failure timeout) on a database answer older than the failure timeout.
      const sample = await nextReport(
        active,
        "node-3",
        active.heartbeatOf(await active.snapshot(), "node-3")?.agent_updated ?? 0,
      );
      console.log(
        `node-3's report on arrival: written ${sample.agentMs} ms ago, database answered ${sample.databaseMs} ms ago (failure timeout ${FAILURE_TIMEOUT_MS} ms)`,
      );
      expect(sample.agentMs).toBeLessThan(FAILURE_TIMEOUT_MS);
      expect(sample.databaseMs).toBeGreaterThan(FAILURE_TIMEOUT_MS);

      // The controller is frozen while the fault takes shape; node-1's agent dies, and its report
      // goes stale.
      for (const controller of active.controllers) controller.child.kill("SIGSTOP");
      const epoch = (await active.topology())?.epoch ?? 0;
      await active.stopAgent("node-1", "SIGKILL");
      await active.waitFor(
        "node-1's last report older than the failure timeout",
        async () => {
          const node = active.heartbeatOf(await active.snapshot(), "node-1");
          return node !== undefined && agesOf(node, active.aws.clock.now()).agentMs > FAILURE_TIMEOUT_MS;
        },
        WAIT_MS,
      );
      const lastUs = active.heartbeatOf(await active.snapshot(), "node-3")?.agent_updated ?? 0;

      // Act: node-3's agent inside a store read (an answer with items comes back through its proxy,
      // delayed): its INFO read is done. node-2 is cut off from node-1, node-1 takes writes node-3
      // alone acknowledges, and the controller resumes.
      let inRead = false;
      slow.tap = (chunk) => {
        inRead ||= chunk.includes('"Items"');
      };
      await active.waitFor("node-3's agent inside a store read", () => inRead, WAIT_MS);
      slow.tap = undefined;
      await active.partition({ cuts: [{ from: "node-1", to: "node-2" }] });
      await writeKeys(active.node("node-1"), `${PREFIX}:ahead`, COUNT, 1);
      for (const controller of active.controllers) controller.child.kill("SIGCONT");

      // Assess: while node-3's reports land heard on old answers, node-2 is not promoted (the code
      // before promoted it on its own vote). Observed until node-3 wrote three reports after the cut.
      let promoted: string | undefined;
      let after = lastUs;
      for (let report = 0; report < 3; report++) {
        const landed = await nextReport(active, "node-3", after);
        after = landed.heartbeat.agent_updated ?? after;
        console.log(
          `node-3's report ${report}: written ${landed.agentMs} ms ago, database answered ${landed.databaseMs} ms ago, offset ${landed.heartbeat.last_txn_id}`,
        );
        const topology = await active.topology();
        if (topology !== undefined && topology.epoch !== epoch) promoted ??= topology.primary_node_id;
      }
      const decisions = active
        .controllerLogLines()
        .map((line) => `${String(line.code ?? "")}: ${String(line.reason ?? line.message)}`)
        .filter((line) => /awaiting_reports|promoting/.test(line));
      console.log(`controller decisions:\n${[...new Set(decisions)].slice(0, 8).join("\n")}`);

      // Act: node-3's store is fast again, the cut heals and node-1's agent is restarted.
      slow.heal();
      await active.heal();
      active.startAgent("node-1");
      await waitForSettled(active);

      // Assess: every write node-3 alone acknowledged is on the primary and on every replica.
      const primary = (await active.topology())?.primary_node_id ?? "node-1";
      const held = await countKeys(active.node(primary), `${PREFIX}:ahead`, COUNT);
      console.log(`${held} of ${COUNT} writes node-3 alone acknowledged on ${primary}, the primary`);
      expect({ promoted, held }).toEqual({ promoted: undefined, held: COUNT });
      await expectKeysEverywhere(active, [
        [`${PREFIX}:ahead`, COUNT],
        [`${PREFIX}:before`, COUNT],
      ]);
    });
  },
);
