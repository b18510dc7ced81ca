import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CountingProxy } from "../../bench/lib/counting-proxy.ts";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { awsEnv, tableName, uniqueName } from "../support/aws.ts";

/**
 * bench:cost counts requests and capacity units through this proxy; the counts must be what the
 * real store adapter sends and what DynamoDB Local charges, or every $/shard-month is wrong.
 */
describe("bench counting proxy", () => {
  let dynamo: CountingProxy;
  let sqs: CountingProxy;
  beforeAll(async () => {
    dynamo = await CountingProxy.start(awsEnv().AWS_ENDPOINT_URL_DYNAMODB as string, { capacity: true });
    sqs = await CountingProxy.start(awsEnv().AWS_ENDPOINT_URL_SQS as string);
  });
  afterAll(async () => {
    await dynamo.stop();
    await sqs.stop();
  });

  it("counts a heartbeat put, a snapshot and an index page by operation, with DynamoDB Local's capacity units", async () => {
    // Prepare
    const aws = createAwsAdapters({
      env: { ...awsEnv(), AWS_ENDPOINT_URL_DYNAMODB: dynamo.url, AWS_ENDPOINT_URL_SQS: sqs.url },
      tableName: tableName(),
      queuePrefix: uniqueName("proxy").replaceAll("-", ""),
    });
    const shard = uniqueName("proxy");
    await aws.store.shards.register(shard);
    dynamo.reset();

    // Act
    await aws.store.heartbeats.put({
      shard,
      node_id: "n1",
      node_address: "127.0.0.1:6379",
      role: "primary",
      last_updated: aws.clock.now() * 1000,
      last_txn_id: 1,
    });
    const snapshot = await aws.store.heartbeats.snapshot(shard);
    await aws.store.shards.list(undefined, 100);
    await aws.bus.ensureQueue(shard, "n1");
    const counted = dynamo.snapshot();
    aws.destroy();

    // Assess
    expect(snapshot.nodes.map((node) => node.node_id)).toEqual(["n1"]);
    // The heartbeat, and the node's member item with its first heartbeat (docs/coordination.md).
    expect(counted.PutItem).toEqual({ requests: 2, capacityUnits: 2, errors: 0 });
    // The snapshot: the members, the controller's partition and the node's own partition.
    expect(counted["Query (shard)"]).toEqual({ requests: 1, capacityUnits: 1, errors: 0 });
    expect(counted["Query (control)"]?.requests).toBe(1);
    expect(counted["Query (node)"]).toEqual({ requests: 1, capacityUnits: 1, errors: 0 });
    expect(counted["Query (shard index)"]?.requests).toBe(1);
    expect(counted["Query (shard index)"]?.capacityUnits).toBeGreaterThan(0);
    expect(Object.keys(sqs.snapshot()).length).toBeGreaterThan(0);
  });

  it("counts a failed conditional write as an error", async () => {
    // Prepare
    const aws = createAwsAdapters({
      env: { ...awsEnv(), AWS_ENDPOINT_URL_DYNAMODB: dynamo.url },
      tableName: tableName(),
    });
    const shard = uniqueName("proxy");
    const topology = { shard, epoch: 1, primary_node_id: "n1", status: "online" as const, updated_at: 1 };
    await aws.store.topology.compareAndSet(shard, undefined, topology);
    dynamo.reset();

    // Act
    const second = await aws.store.topology.compareAndSet(shard, undefined, topology);
    aws.destroy();

    // Assess
    expect(second).toBe(false);
    const writes = Object.entries(dynamo.snapshot()).filter(([op]) => !op.startsWith("Query"));
    expect(writes.reduce((sum, [, count]) => sum + count.errors, 0)).toBe(1);
  });
});
