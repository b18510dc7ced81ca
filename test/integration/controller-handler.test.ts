import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { ensureTable } from "../../src/dev/local-stack/table.ts";
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

/**
 * Registers a shard in the handler's table with one primary whose heartbeat is `ageMs` old: fresh
 * (healthy) at 0, stale with no agent heard at a minute.
 */
async function registerShard(prefix: string, ageMs: number): Promise<string> {
  const aws = createAwsAdapters({ env: { ...awsEnv(), SHARDGUARD_TABLE: table } });
  try {
    const shard = uniqueName(prefix).slice(0, 24);
    const now = aws.clock.now();
    await aws.store.heartbeats.put({
      shard,
      node_id: "p1",
      node_address: "p1.local:6379",
      role: "primary",
      last_updated: (now - ageMs) * 1000,
      agent_updated: (now - ageMs) * 1000,
      last_txn_id: 10,
      repl_id: "a",
    });
    await aws.store.topology.compareAndSet(shard, undefined, {
      shard,
      epoch: 1,
      primary_node_id: "p1",
      primary_address: "p1.local:6379",
      status: "online",
      updated_at: now - ageMs,
    });
    await aws.store.shards.register(shard);
    return shard;
  } finally {
    aws.destroy();
  }
}

/** Agent-test timings (failure timeout 1 s), valid together. */
const FAST_CONTROLLER = {
  SHARDGUARD_FAILURE_TIMEOUT_MS: "1000",
  SHARDGUARD_FENCE_TIMEOUT_MS: "600",
  SHARDGUARD_HEARTBEAT_INTERVAL_MS: "200",
};

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
      /SHARDGUARD_FAILURE_TIMEOUT_MS: must be an integer, got "3s"/,
    );
  });

  it("fails the cold start when the event bus is not configured", async () => {
    setEnv({ ...BASE, SHARDGUARD_EVENT_BUS: undefined });
    await expect(loadHandler()).rejects.toThrowError(/SHARDGUARD_EVENT_BUS must name the EventBridge bus/);
  });

  it("returns after one pass on a scheduled event when every shard is healthy", async () => {
    // Prepare: one healthy shard in the handler's own table (fresh for the 3 s failure timeout).
    setEnv(BASE);
    await registerShard("h", 0);
    const handler = await loadHandler();
    const context = contextWith(20_000);

    // Act
    const started = Date.now();
    const summary = await handler({ source: "aws.events", "detail-type": "Scheduled Event" }, context);

    // Assess: billed for one pass, not for the 20 s the invocation had.
    expect(summary).toMatchObject({ passes: 1, errors: 0, actions: 0 });
    expect(Date.now() - started).toBeLessThan(5000);
  });

  it("goes on while a shard is not quiet and returns shortly before the invocation ends", async () => {
    // Prepare: beside the healthy shard, one whose primary and agents went silent a minute ago.
    setEnv(BASE);
    await registerShard("s", 60_000);
    const handler = await loadHandler();
    const context = contextWith(6000);

    // Act
    const summary = await handler({ source: "aws.events", "detail-type": "Scheduled Event" }, context);

    // Assess: passes at tickInterval (1 s) until 2 s + a tick before the end.
    expect(summary).toMatchObject({ errors: 0, actions: 0 });
    expect((summary as { passes: number }).passes).toBeGreaterThanOrEqual(2);
    expect(Date.now()).toBeLessThan(context.end);
    expect(Date.now()).toBeGreaterThan(context.end - 4500);
  });

  it("runs the registered shards named by the wake queue's SQS event at once, watches them, and drops a malformed message", async () => {
    // Prepare: a 1 s failure timeout, so the woken shards are watched for 3 s. Both are registered
    // (wake-ups naming shards the index does not list are dropped: screenWakes).
    setEnv({ ...BASE, ...FAST_CONTROLLER });
    const aws = createAwsAdapters({ env: { ...awsEnv(), SHARDGUARD_TABLE: table } });
    await aws.store.shards.register("woken-a");
    await aws.store.shards.register("woken-b");
    aws.destroy();
    const handler = await loadHandler();
    const record = (body: string) => ({ eventSource: "aws:sqs", body, messageId: "m1" });
    const wake = (shard: string) =>
      JSON.stringify({ shard, node: "n1", reason: "crash", sent_at: Date.now() });
    const context = contextWith(8000);

    // Act
    const summary = await handler(
      {
        Records: [record(wake("woken-a")), record(wake("woken-a")), record(wake("woken-b")), record("{nope")],
      },
      context,
    );

    // Assess: shards without a topology are not quiet: watched until shortly before the end.
    expect(summary).toMatchObject({ errors: 0, actions: 0 });
    expect((summary as { cycles: number }).cycles).toBeGreaterThanOrEqual(4);
    expect(Date.now()).toBeLessThan(context.end);
  });

  it("ends at once, with no cycle and no watch, when the wake-ups name only shards the index does not list", async () => {
    // Prepare: a batch of the SQS event source's size, every shard made up.
    setEnv({ ...BASE, ...FAST_CONTROLLER });
    const handler = await loadHandler();
    const record = (body: string) => ({ eventSource: "aws:sqs", body, messageId: "m1" });
    const made = Array.from({ length: 10 }, (_, index) =>
      JSON.stringify({ shard: `made-up-${index}`, node: "n1", reason: "crash", sent_at: Date.now() }),
    );
    const context = contextWith(8000);
    const started = Date.now();

    // Act
    const summary = await handler({ Records: made.map(record) }, context);

    // Assess: no cycle, and back before the 3 s watch a listed shard would get.
    expect(summary).toMatchObject({ cycles: 0, errors: 0, actions: 0 });
    expect(Date.now() - started).toBeLessThan(3000);
  });

  it("ends a woken run once its shard stayed quiet for the watch of 3 failure timeouts", async () => {
    // Prepare: a healthy shard whose primary's agent keeps writing heartbeats.
    setEnv({ ...BASE, ...FAST_CONTROLLER });
    const shard = await registerShard("w", 0);
    const aws = createAwsAdapters({ env: { ...awsEnv(), SHARDGUARD_TABLE: table } });
    const beat = setInterval(() => {
      const now = aws.clock.now() * 1000;
      void aws.store.heartbeats
        .put({
          shard,
          node_id: "p1",
          node_address: "p1.local:6379",
          role: "primary",
          last_updated: now,
          agent_updated: now,
          last_txn_id: 10,
          repl_id: "a",
        })
        .catch(() => {});
    }, 200);
    try {
      const handler = await loadHandler();
      const event = {
        Records: [
          {
            eventSource: "aws:sqs",
            messageId: "m1",
            body: JSON.stringify({ shard, node: "r1", reason: "probe", sent_at: Date.now() }),
          },
        ],
      };

      // Act
      const started = Date.now();
      const summary = await handler(event, contextWith(20_000));
      const tookMs = Date.now() - started;

      // Assess: at least the watch (3 x 1 s), then ended quiet, long before the 20 s.
      expect(summary).toMatchObject({ errors: 0, actions: 0 });
      expect(tookMs).toBeGreaterThanOrEqual(3000);
      expect(tookMs).toBeLessThan(8000);
    } finally {
      clearInterval(beat);
      aws.destroy();
    }
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
