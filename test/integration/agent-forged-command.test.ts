import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SendMessageCommand } from "@aws-sdk/client-sqs";
import { afterEach, describe, expect, it } from "vitest";
import { requestSwitchover } from "../../src/controller/orchestrator.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, FAST_TIMINGS, redisRole, type TestAgent } from "../support/agent-harness.ts";
import { sqsClient } from "../support/aws.ts";
import { cycleUntil } from "../support/controller-cycles.ts";
import { controllerOverAgents } from "../support/controller-fakes.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Issue 38, finding 3: anyone who can send to a node's queue sent a PAUSE_WRITES at epoch
 * 2^53 - 1 for 1,000 days; the agent paused its database's writes and raised its applied epoch
 * past every epoch the controller would ever send. Here the same message goes straight to a real
 * agent's queue (not through the bus, which validates what it sends), next to the real controller.
 */

/**
 * The agents' fast timings, with a failure timeout of 3 s rather than 1 s: the switchover at the
 * end re-plans under its lock on fresh heartbeats, and on a loaded 2-core host a replica's 1 s is
 * too tight (seen: "heartbeat stale (1004 ms old)"). Nothing here waits for the timeout.
 */
const TIMINGS = { ...FAST_TIMINGS, failureTimeoutMs: 3000, replicaKeepaliveMs: 1000 } as const;

let fixture: AgentFixture;

afterEach(async () => {
  await fixture.close();
});

/** Sends `body` to the node's queue as any principal with sqs:SendMessage could. */
async function sendRaw(nodeId: string, body: unknown): Promise<void> {
  const queueUrl = await fixture.aws.bus.ensureQueue(fixture.shard, nodeId);
  const sqs = sqsClient();
  try {
    await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: JSON.stringify(body) }));
  } finally {
    sqs.destroy();
  }
}

/** How long one SET takes on the node, and its reply (a paused database holds it). */
async function timedWrite(node: RedisNode, key: string): Promise<{ reply: string; ms: number }> {
  const client = node.client({ maxRetriesPerRequest: 0, commandTimeout: 3000 });
  const started = Date.now();
  try {
    const reply = await client.set(key, "v").catch((error: unknown) => String(error));
    return { reply, ms: Date.now() - started };
  } finally {
    client.disconnect();
  }
}

function highestEpochOf(agent: TestAgent): number {
  return JSON.parse(readFileSync(join(agent.stateDir, "state.json"), "utf8")).highest_epoch;
}

/** The first log line that says what became of the message carrying `commandId`. */
function fateOf(agent: TestAgent, commandId: string) {
  return agent.logger.lines.find(
    (line) =>
      line.attributes.commandId === commandId ||
      (line.message.startsWith("command rejected") && String(line.attributes.body).includes(commandId)),
  );
}

describe("a forged command sent straight to a node's queue", () => {
  it("does not pause writes or raise the node's epoch, and the controller's next command is obeyed", async () => {
    // Prepare: a two-node shard the real controller adopted.
    fixture = new AgentFixture();
    const [primaryNode, replicaNode] = await fixture.startRedis(2);
    if (!primaryNode || !replicaNode) throw new Error("redis nodes missing");
    const primary = await fixture.startAgent(primaryNode, { nodeId: "n1", ...TIMINGS });
    await fixture.startAgent(replicaNode, { nodeId: "n2", ...TIMINGS });
    await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "n2 linked");
    const deps = controllerOverAgents(fixture.aws, TIMINGS);
    await cycleUntil(deps, fixture.shard, (result) => result.outcome === "initialized", 20_000);
    const epochBefore = highestEpochOf(primary);
    const topologyEpoch = (await fixture.aws.store.topology.read(fixture.shard))?.epoch;
    const forged = {
      type: "PAUSE_WRITES",
      shard: fixture.shard,
      epoch: Number.MAX_SAFE_INTEGER,
      command_id: "forged-pause-1000-days",
      issued_at: Date.now(),
      timeout_ms: 86_400_000_000,
    };
    // The same attack within the schema's bounds: only the topology can tell it from a real one.
    const forgedWithinBounds = { ...forged, command_id: "forged-pause-max-epoch", timeout_ms: 600_000 };

    // Act
    await sendRaw("n1", forged);
    await sendRaw("n1", forgedWithinBounds);
    const fates = await waitFor(() => {
      const both = [fateOf(primary, forged.command_id), fateOf(primary, forgedWithinBounds.command_id)];
      return both.every((line) => line !== undefined) && both;
    }, "both forged commands handled");
    const write = await timedWrite(primaryNode, "written-after-the-forged-pause");
    const epochAfter = highestEpochOf(primary);
    const switchover = await requestSwitchover(deps, fixture.shard, { to: "n2", reason: "after the attack" });
    const pauseApplied = primary.logger.lines.find(
      (line) => line.message === "command applied" && line.attributes.commandType === "PAUSE_WRITES",
    );

    // Assess
    expect(fates.map((line) => line?.message)).toEqual([
      "command rejected; left for the dead-letter queue",
      "command refused; deleted",
    ]);
    expect(String(fates[0]?.attributes.reason)).toMatch(/timeout_ms/);
    expect(String(fates[1]?.attributes.reason)).toBe(
      `command forged-pause-max-epoch has epoch ${Number.MAX_SAFE_INTEGER}, the topology is at epoch ${topologyEpoch}`,
    );
    expect(write.reply).toBe("OK");
    expect(write.ms).toBeLessThan(1000);
    expect(epochAfter).toBe(epochBefore);
    expect(switchover, switchover.reason).toMatchObject({ outcome: "completed", primary: "n2" });
    expect(pauseApplied?.attributes.commandEpoch).toBe(switchover.epoch);
    expect(await redisRole(replicaNode)).toBe("master");
    await fixture.waitForHeartbeat(
      "n1",
      (hb) => hb.role === "replica" && hb.epoch === switchover.epoch,
      "n1 a replica at the switchover's epoch",
    );
    expect(highestEpochOf(primary)).toBe(switchover.epoch);
  });
});
