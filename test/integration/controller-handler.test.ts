import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { ensureTable } from "../../src/local-stack/table.ts";
import { awsEnv, dynamoClient, uniqueName } from "../support/aws.ts";

/**
 * The Lambda entry point as Lambda loads it: module-scope configuration from the environment,
 * a scheduled event running the loop until shortly before the invocation's end, and operator
 * requests answered with JSON. Its own table keeps the loop away from other tests' shards.
 */

const table = uniqueName("handler").slice(0, 40);
const saved = { ...process.env };

function setEnv(overrides: Record<string, string | undefined>) {
  for (const [key, value] of Object.entries({ ...awsEnv(), ...overrides })) {
    if (value === undefined) delete process.env[key];
    else process.env[key] = value;
  }
}

async function loadHandler() {
  vi.resetModules();
  return (await import("../../functions/controller/handler.ts")).handler;
}

function contextWith(ms: number) {
  const end = Date.now() + ms;
  return { getRemainingTimeInMillis: () => end - Date.now(), awsRequestId: "req-1", end };
}

beforeAll(async () => {
  const client = dynamoClient();
  await ensureTable(client, table);
  client.destroy();
});

afterEach(() => {
  process.env = { ...saved };
});

afterAll(() => {
  process.env = saved;
});

const BASE = {
  SHARDGUARD_TABLE: table,
  SHARDGUARD_EVENT_BUS: "shardguard-test",
  // No EventBridge runs here: a closed local port makes any publish fail fast (and be logged).
  AWS_ENDPOINT_URL_EVENTBRIDGE: "http://127.0.0.1:9",
  POWERTOOLS_LOG_LEVEL: "ERROR",
};

describe("controller Lambda handler", () => {
  it("fails the cold start with the name of a bad variable", async () => {
    setEnv({ ...BASE, SHARDGUARD_FAILURE_TIMEOUT_MS: "3s" });
    await expect(loadHandler()).rejects.toThrowError(
      /SHARDGUARD_FAILURE_TIMEOUT_MS must be an integer, got "3s"/,
    );
  });

  it("fails the cold start when the event bus is not configured", async () => {
    setEnv({ ...BASE, SHARDGUARD_EVENT_BUS: undefined });
    await expect(loadHandler()).rejects.toThrowError(/SHARDGUARD_EVENT_BUS must name the EventBridge bus/);
  });

  it("loops over the shards on a scheduled event and returns shortly before the invocation ends", async () => {
    // Prepare: one healthy shard in the handler's own table.
    setEnv(BASE);
    const aws = createAwsAdapters({ env: { ...awsEnv(), SHARDGUARD_TABLE: table } });
    const shard = uniqueName("h").slice(0, 24);
    const now = aws.clock.now();
    await aws.store.heartbeats.put({
      shard,
      node_id: "p1",
      node_address: "p1.local:6379",
      role: "primary",
      last_updated: now * 1000,
      last_txn_id: 10,
      repl_id: "a",
    });
    await aws.store.topology.compareAndSet(shard, undefined, {
      shard,
      epoch: 1,
      primary_node_id: "p1",
      primary_address: "p1.local:6379",
      status: "online",
      updated_at: now,
    });
    await aws.store.shards.register(shard);
    aws.destroy();
    const handler = await loadHandler();
    const context = contextWith(4500);

    // Act
    const summary = await handler({ source: "aws.events", "detail-type": "Scheduled Event" }, context);

    // Assess
    expect(summary).toMatchObject({ errors: 0, actions: 0 });
    expect((summary as { passes: number }).passes).toBeGreaterThanOrEqual(1);
    expect(Date.now()).toBeLessThan(context.end);
  });

  it("runs one cycle per shard named by the wake queue's SQS event and drops a malformed message", async () => {
    // Prepare
    setEnv(BASE);
    const handler = await loadHandler();
    const record = (body: string) => ({ eventSource: "aws:sqs", body, messageId: "m1" });
    const wake = (shard: string) =>
      JSON.stringify({ shard, node: "n1", reason: "crash", sent_at: Date.now() });

    // Act
    const summary = await handler(
      {
        Records: [record(wake("woken-a")), record(wake("woken-a")), record(wake("woken-b")), record("{nope")],
      },
      contextWith(10_000),
    );

    // Assess
    expect(summary).toMatchObject({ cycles: 2, errors: 0, actions: 0 });
  });

  it("answers an operator request with a JSON result", async () => {
    // Prepare
    setEnv(BASE);
    const handler = await loadHandler();

    // Act
    const refused = await handler({ action: "pause", shard: "never-seen" }, contextWith(10_000));
    const invalid = await handler({ action: "pause" }, contextWith(10_000));

    // Assess
    expect(refused).toEqual({
      ok: false,
      action: "pause",
      shard: "never-seen",
      outcome: "refused",
      epoch: undefined,
      primary: undefined,
      reason: "the shard has no topology yet",
    });
    expect(invalid).toMatchObject({ ok: false, reason: expect.stringMatching(/^invalid request: shard: /) });
  });
});
