import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  startChaosCluster,
  WAIT_MS,
  waitForWritablePrimary,
  withClient,
} from "../support/chaos-cluster.ts";
import { continuousWriter, missingKeys } from "../support/data-safety.ts";

/**
 * Simulator seeds 221327, 280161 and 280669 (guarantee 3): the named primary's database follows a
 * node that follows it back, a replication cycle (in the simulator: its step-down to a failover's
 * target that was never promoted, while the target followed it; here: an operator's `REPLICAOF`
 * on the primary, naming its own replica). Redis 7 keeps every link of the cycle up (the replica
 * serves the PSYNC with +CONTINUE, and nobody sends, so nothing times out), and each replica's
 * probe finds the primary answering, so no fresh replica voted it down and the controller answered
 * `quorum_not_met` for as long as it lasted (60-138 s in the simulator), with no node taking
 * writes. Now a replica whose link leads into the cycle votes it down (`replicationCycle`,
 * src/core/decide/online-view.ts). Real redis-server, agents, controller, DynamoDB Local and SQS.
 */

/** The production failure timeout: the primary's heartbeat stays fresh throughout. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
/** The demoted grace (the failure timeout) and one failover, with room for two loaded cores. */
const WRITABLE_WITHIN_MS = CONFIG.failureTimeoutMs + 15_000;

let cluster: LocalCluster | undefined;
const stops: Array<() => Promise<unknown>> = [];

afterEach(async (context) => {
  for (const stop of stops.splice(0)) await stop();
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a named primary in a replication cycle with its own replica", () => {
  it("is replaced within the failure timeout plus the margin, without losing a replica-acknowledged write", {
    timeout: 180_000,
  }, async () => {
    // Prepare: writes acknowledged by a replica (WAIT 1) on node-1, the primary.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const writer = continuousWriter(active, "node-1", { prefix: "cycle", follow: true, waitReplicas: 1 });
    stops.push(writer.stop);
    await active.waitFor("acknowledged writes on node-1", () => writer.report().acked.length > 20, WAIT_MS);
    const start = await active.topology();

    // Act: the primary is made a replica of its own replica node-2.
    const [host, port] = active.node("node-2").address.split(":");
    await withClient(active.node("node-1"), (client) => client.call("REPLICAOF", host ?? "", port ?? ""));
    const cycledAt = performance.now();
    await active.waitFor(
      "node-1 follows node-2 with its link up, and node-2 follows node-1 with its link up",
      async () => {
        const links = await Promise.all(
          ["node-1", "node-2"].map((id) =>
            withClient(active.node(id), async (client) => client.info("replication")),
          ),
        );
        return links.every((info) => info.includes("role:slave") && info.includes("master_link_status:up"));
      },
      WAIT_MS,
    );

    // Assess: a writable primary named by the topology again within the bound, holding every write.
    const { primary: writablePrimary, afterMs } = await waitForWritablePrimary(
      active,
      start?.epoch ?? 0,
      cycledAt,
      WRITABLE_WITHIN_MS,
    );
    console.log(`writable primary ${writablePrimary} ${Math.round(afterMs)} ms after the cycle formed`);
    const report = await writer.stop();
    const missing = await missingKeys(active.node(writablePrimary), report.acked);
    expect(writablePrimary).not.toBe("node-1");
    expect(report.acked.length).toBeGreaterThan(20);
    expect(missing).toEqual([]);
    const records = await active.aws.store.history.list(active.shard, 100);
    const reasons = records
      .filter((record) => record.epoch > (start?.epoch ?? 0))
      .map((record) => record.reason);
    expect(reasons.join("\n")).toMatch(/in a replication cycle/);
  });
});
