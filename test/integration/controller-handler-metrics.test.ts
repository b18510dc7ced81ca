import { ListQueuesCommand, SQSClient } from "@aws-sdk/client-sqs";
import { afterEach, describe, expect, it, vi } from "vitest";
import { awsEnv } from "../support/aws.ts";
import { aScriptedShard, CONFIG } from "../support/scripted-shard.ts";

/**
 * The controller Lambda's metrics on the operator-request path: the EMF line Powertools prints
 * is what CloudWatch turns into the metrics the alarms watch, so a switchover run by an operator
 * must print one as a failover run by the loop does (issue 17, item 7).
 */

const saved = { ...process.env };
afterEach(() => {
  process.env = { ...saved };
  vi.restoreAllMocks();
});

/** The scripted shard names its queues `<prefix>_<shard>_<node>`; the handler must use that prefix. */
async function queuePrefixOf(shard: string): Promise<string> {
  const env = awsEnv();
  const sqs = new SQSClient({
    region: env.AWS_REGION,
    endpoint: env.AWS_ENDPOINT_URL_SQS ?? env.AWS_ENDPOINT_URL,
    credentials: {
      accessKeyId: env.AWS_ACCESS_KEY_ID ?? "",
      secretAccessKey: env.AWS_SECRET_ACCESS_KEY ?? "",
    },
  });
  try {
    const { QueueUrls = [] } = await sqs.send(new ListQueuesCommand({ MaxResults: 1000 }));
    const name = QueueUrls.map((url) => url.split("/").pop() ?? "").find((queue) =>
      queue.endsWith(`_${shard}_p1`),
    );
    if (!name) throw new Error(`no queue of shard ${shard}`);
    return name.slice(0, name.length - `_${shard}_p1`.length);
  } finally {
    sqs.destroy();
  }
}

/** The EMF documents among console lines (Powertools prints them with console.log under POWERTOOLS_DEV). */
function emfDocuments(lines: unknown[][]): Record<string, unknown>[] {
  return lines
    .map((args) => String(args[0]))
    .filter((line) => line.includes('"CloudWatchMetrics"'))
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

describe("controller Lambda handler metrics", () => {
  it("publishes the metrics an operator's switchover counted (an EMF line before the invocation returns)", async () => {
    // Prepare: a scripted shard whose nodes answer commands, the handler configured for it.
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined, txn: 1000 });
    shard.node("r1", { txn: 990 });
    await shard.start();
    Object.assign(process.env, awsEnv(), {
      SHARDGUARD_QUEUE_PREFIX: await queuePrefixOf(shard.shard),
      SHARDGUARD_EVENT_BUS: "shardguard-test",
      // No EventBridge runs here: a closed local port makes any publish fail fast (and be logged).
      AWS_ENDPOINT_URL_EVENTBRIDGE: "http://127.0.0.1:9",
      SHARDGUARD_HEARTBEAT_INTERVAL_MS: String(CONFIG.heartbeatIntervalMs),
      // Not the scripted shard's 600 ms: this test is about the metrics of a switchover that
      // completes, and a heartbeat 600 ms late on a loaded machine made r1 "stale" and the
      // switchover refused (a fresh-clone CI run).
      SHARDGUARD_FAILURE_TIMEOUT_MS: String(3000),
      SHARDGUARD_FENCE_TIMEOUT_MS: String(CONFIG.fenceTimeoutMs),
      SHARDGUARD_TICK_INTERVAL_MS: String(CONFIG.tickIntervalMs),
      SHARDGUARD_LOCK_LEASE_MS: String(CONFIG.lockLeaseMs),
      SHARDGUARD_MAX_LAG_ON_FAILOVER: String(CONFIG.maxLagOnFailover),
      SHARDGUARD_COOLDOWN_MS: String(CONFIG.cooldownMs),
      POWERTOOLS_DEV: "true",
      // Dev mode turns metrics off unless told otherwise.
      POWERTOOLS_METRICS_DISABLED: "false",
      POWERTOOLS_LOG_LEVEL: "ERROR",
    });
    const printed = vi.spyOn(console, "log").mockImplementation(() => {});
    vi.resetModules();
    const { handler } = await import("../../functions/controller/handler.ts");
    const end = Date.now() + 30_000;

    // Act
    const response = await handler(
      { action: "switchover", shard: shard.shard, to: "r1" },
      { getRemainingTimeInMillis: () => end - Date.now(), awsRequestId: "req-metrics" },
    );

    // Assess
    expect(response, JSON.stringify(response)).toMatchObject({
      ok: true,
      action: "switchover",
      outcome: "completed",
      primary: "r1",
    });
    const documents = emfDocuments(printed.mock.calls);
    expect(documents).toHaveLength(1);
    expect(documents[0]).toMatchObject({
      _aws: { CloudWatchMetrics: [{ Namespace: "Shardguard" }] },
      failoverStarted: 1,
      failoverCompleted: 1,
    });
  }, 60_000);
});
