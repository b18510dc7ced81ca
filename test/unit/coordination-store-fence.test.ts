import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { CoordinationUnavailable } from "../../src/core/errors.ts";
import { type LockLease, LockLost } from "../../src/core/ports.ts";

/**
 * How a fenced write reads DynamoDB's CancellationReasons, through the real SDK client talking to
 * a stub endpoint that answers TransactWriteItems with scripted cancellations (DynamoDB Local
 * cannot be made to report a TransactionConflict on demand).
 */

type Reply = { status: number; body: Record<string, unknown> };

const cancelled = (...codes: string[]): Reply => ({
  status: 400,
  body: {
    __type: "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
    message: `Transaction cancelled, please refer cancellation reasons for specific reasons [${codes.join(", ")}]`,
    CancellationReasons: codes.map((Code) => ({ Code, Message: Code })),
  },
});
const ok: Reply = { status: 200, body: {} };

async function stubDynamo(replies: Reply[]): Promise<{ server: Server; endpoint: string; bodies: string[] }> {
  const bodies: string[] = [];
  const server = createServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => {
      body += chunk;
    });
    request.on("end", () => {
      bodies.push(body);
      const reply = replies.shift() ?? ok;
      response.writeHead(reply.status, { "content-type": "application/x-amz-json-1.0" });
      response.end(JSON.stringify(reply.body));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { server, endpoint: `http://127.0.0.1:${port}`, bodies };
}

const lease: LockLease = { shard: "s1", owner: "controller-a", fence: 7 };
const topology = { shard: "s1", epoch: 2, primary_node_id: "n2", status: "online" as const, updated_at: 1 };

describe("fenced writes read the cancellation reasons", () => {
  let server: Server | undefined;
  let adapters: AwsAdapters | undefined;

  afterEach(async () => {
    adapters?.destroy();
    await new Promise((resolve) => server?.close(resolve));
  });

  async function storeAnswering(replies: Reply[]) {
    const stub = await stubDynamo(replies);
    server = stub.server;
    adapters = createAwsAdapters({
      env: {
        AWS_ENDPOINT_URL_DYNAMODB: stub.endpoint,
        AWS_ENDPOINT_URL_SQS: stub.endpoint,
        AWS_REGION: "us-east-1",
        AWS_ACCESS_KEY_ID: "k",
        AWS_SECRET_ACCESS_KEY: "s",
      },
      maxAttempts: 1,
    });
    return { store: adapters.store, bodies: stub.bodies };
  }

  it("sends the lock check first, beside the write, in one transaction", async () => {
    // Prepare
    const { store, bodies } = await storeAnswering([ok]);

    // Act
    const written = await store.topology.compareAndSet("s1", 1, topology, {
      lease,
      replicaSet: { primary: "n1", version: 4 },
    });

    // Assess
    expect(written).toBe(true);
    const items = JSON.parse(bodies[0] ?? "{}").TransactItems;
    expect(items).toHaveLength(3);
    expect(items[0].ConditionCheck).toMatchObject({
      Key: { pk: { S: "CONTROL#s1" }, sk: { S: "LOCK" } },
      ConditionExpression: "#owner = :owner AND fence = :fence AND expires_at > :released",
      ExpressionAttributeValues: { ":owner": { S: "controller-a" }, ":fence": { N: "7" } },
    });
    expect(items[1].ConditionCheck).toMatchObject({
      Key: { sk: { S: "REPLICAS#n1" } },
      ConditionExpression: "version = :version",
    });
    expect(items[2].Put.Item.epoch).toEqual({ N: "2" });
  });

  it("throws LockLost when the lock check failed", async () => {
    const { store } = await storeAnswering([cancelled("ConditionalCheckFailed", "None")]);
    await expect(store.topology.compareAndSet("s1", 1, topology, { lease })).rejects.toBeInstanceOf(LockLost);
  });

  it("answers false when the lock held but the epoch or the replica set moved", async () => {
    const { store } = await storeAnswering([
      cancelled("None", "ConditionalCheckFailed"),
      cancelled("None", "ConditionalCheckFailed", "None"),
    ]);
    await expect(store.topology.compareAndSet("s1", 1, topology, { lease })).resolves.toBe(false);
    await expect(
      store.topology.compareAndSet("s1", 1, topology, {
        lease,
        replicaSet: { primary: "n1", version: undefined },
      }),
    ).resolves.toBe(false);
  });

  it("retries a transaction cancelled by a conflicting one", async () => {
    // Prepare
    const { store, bodies } = await storeAnswering([
      cancelled("TransactionConflict", "None"),
      cancelled("None", "TransactionConflict"),
      ok,
    ]);

    // Act
    const written = await store.topology.compareAndSet("s1", 1, topology, { lease });

    // Assess
    expect(written).toBe(true);
    expect(bodies).toHaveLength(3);
  });

  it("gives up as unavailable after four conflicting attempts", async () => {
    // Prepare
    const { store, bodies } = await storeAnswering(
      Array.from({ length: 4 }, () => cancelled("TransactionConflict", "None")),
    );

    // Act
    const attempt = store.history.append(
      { shard: "s1", epoch: 2, kind: "failover", at: 1, reason: "r", candidates: [], phase_timings: {} },
      { lease },
    );

    // Assess
    await expect(attempt).rejects.toBeInstanceOf(CoordinationUnavailable);
    expect(bodies).toHaveLength(4);
  });
});
