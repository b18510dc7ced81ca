import { afterEach, describe, expect, it } from "vitest";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, FAST_TIMINGS, tryWrite } from "../support/agent-harness.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Simulator seeds 220263 and 220883 (guarantees 1 and 5): a controller froze for 40-51 s right
 * after its plan ranked n2 the failover's target on n2's offset; meanwhile n2's database restarted
 * empty (its agent fenced it: "database restarted without its data"), and the PROMOTE the controller
 * sent when it woke made the empty database the primary: the replicas that held the acknowledged
 * writes full-synced from it. The agent obeyed any PROMOTE that fit the topology whatever its
 * database held; now it refuses one whose database holds less than the offset the plan's `candidates`
 * row ranked it on (src/agent/node-control.ts `rankedShortfall`, `PromotionRefused`).
 * Real redis-server processes and agent, DynamoDB Local and SQS (loopback).
 */

let fixture: AgentFixture | undefined;

afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

async function replicationOffset(node: RedisNode): Promise<number> {
  const client = node.client();
  try {
    return Number(/master_repl_offset:(\d+)/.exec(await client.info("replication"))?.[1] ?? "0");
  } finally {
    client.disconnect();
  }
}

describe("a PROMOTE sent to a target whose database restarted empty after the plan ranked it", () => {
  it("is refused: the empty database never becomes the writable primary, nor is reported primary at the plan's epoch", async () => {
    // Prepare: n1 primary with 200 keys, n2 its replica caught up; both with agents.
    fixture = new AgentFixture();
    const active = fixture;
    const { n1, n2, n1Agent: oldAgent, n2Agent: agent } = await active.linkedPair();
    const first = await tryWrite(n1, "key-0");
    if (first !== "OK") throw new Error(`n1 refused the first write: ${first}`);
    const writer = n1.client();
    for (let index = 1; index < 200; index++) await writer.set(`key-${index}`, "v".repeat(100));
    writer.disconnect();
    const written = await replicationOffset(n1);
    const ranked = await active.waitForHeartbeat(
      "n2",
      (hb) => hb.role === "replica" && hb.last_txn_id >= written,
      "n2 reports every write",
    );
    // n1 dies (agent first, then its database): the controller plans the failover to n2, ranked on
    // the offset n2 reported.
    await active.primaryDiesForN2({ n1, n2, n1Agent: oldAgent }, [
      {
        node_id: "n2",
        node_address: n2.address,
        last_txn_id: ranked.last_txn_id,
        priority: 100,
        eligible: true,
        reason: "eligible",
      },
    ]);
    // The plan's REPORT: n2's agent reads the plan that names it. The controller freezes here.
    await active.send("n2", active.command("REPORT", 1, { timeout_ms: 2000 }));
    await waitFor(() => agent.logger.find("command applied"), "n2's agent applies the REPORT");
    // n2's database restarts empty (a host that lost its disk, the process started without
    // `replicaof`); its agent, seeing the new process, fences it as in the simulator.
    await n2.stop();
    n2.wipeData();
    await n2.start();
    await waitFor(
      () =>
        agent.logger.find("database restarted without its data: fenced until it follows the shard's primary"),
      "n2's agent fences its database restarted without its data",
    );
    expect(await replicationOffset(n2)).toBeLessThan(ranked.last_txn_id);

    // Act: the controller wakes and sends the PROMOTE of its plan.
    await active.send("n2", active.command("PROMOTE", 1));
    const REFUSED = "not promoted: the database no longer holds what the failover ranked it on";
    await waitFor(
      () =>
        agent.logger.find(REFUSED) ??
        agent.logger.lines.find(
          (line) => line.message === "command applied" && line.attributes.commandType === "PROMOTE",
        ),
      "n2's agent handles the PROMOTE",
    );

    // Assess: for 3 s after it handled the PROMOTE (15 heartbeat intervals, past the command's
    // redeliveries on the back-off) the empty database takes no write and n2 is never reported
    // primary at epoch 1.
    const promotedReport = (hb: { role: string; epoch?: number; db_status?: string }) =>
      hb.role === "primary" && hb.epoch === 1 && hb.db_status === "up";
    await holdsFor(
      async () => {
        const hb = await active.heartbeatOf("n2");
        return (hb === undefined || !promotedReport(hb)) && (await tryWrite(n2)) !== "OK";
      },
      "n2 neither writable nor reported primary at epoch 1",
      15 * FAST_TIMINGS.heartbeatIntervalMs,
    );
    expect(agent.heartbeats.written.some(promotedReport)).toBe(false);
    const refused = agent.logger.find(REFUSED);
    expect(refused?.attributes).toMatchObject({ rankedOffset: ranked.last_txn_id });
    expect(Number(refused?.attributes.offset)).toBeLessThan(ranked.last_txn_id);
    expect(agent.logger.find("command failed; left for redelivery")?.attributes.error).toMatch(
      /ranked n2 on offset \d+, its database holds \d+/,
    );
  });
});
