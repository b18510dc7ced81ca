import { App, Stack } from "aws-cdk-lib";
import { Template } from "aws-cdk-lib/assertions";
import * as dynamodb from "aws-cdk-lib/aws-dynamodb";
import { describe, expect, it } from "vitest";
import {
  addTableAutoScaling,
  provisionedCapacity,
  steadyUnits,
  tableBillingProps,
  tableThrottles,
} from "../../cdk/table-capacity.ts";

function synth(capacity: ReturnType<typeof provisionedCapacity>) {
  const stack = new Stack(new App(), "T");
  const table = new dynamodb.Table(stack, "Table", {
    partitionKey: { name: "pk", type: dynamodb.AttributeType.STRING },
    ...tableBillingProps(capacity),
  });
  addTableAutoScaling(table, capacity);
  return { template: Template.fromStack(stack), table };
}

describe("table capacity", { timeout: 60_000 }, () => {
  it.each([
    // shards, nodes, heartbeat ms, write units/s, read units/s (3 agents' snapshots + the controller's, + index)
    [1, 3, 1000, 3, 4.5],
    [100, 3, 1000, 300, 400.5],
    [1000, 3, 1000, 3000, 4005],
    [1000, 3, 2000, 1500, 2505],
  ])("%i shards x %i nodes, heartbeat %i ms: %d writes/s, %d reads/s", (shards, nodes, hb, write, read) => {
    expect(
      steadyUnits({ shards, nodesPerShard: nodes }, { heartbeatIntervalMs: hb, tickIntervalMs: 1000 }),
    ).toEqual({ write, read });
  });

  it("sizes provisioned capacity at 70% utilization, scaling up to twice that", () => {
    expect(provisionedCapacity({ billingMode: "provisioned", shards: 100 })).toEqual({
      writeCapacity: 429,
      readCapacity: 573,
      maxWriteCapacity: 858,
      maxReadCapacity: 1146,
    });
  });

  it("is on-demand unless asked, and refuses provisioned without a shard count", () => {
    expect(provisionedCapacity({})).toBeUndefined();
    expect(provisionedCapacity({ billingMode: "on-demand", shards: 5 })).toBeUndefined();
    expect(() => provisionedCapacity({ billingMode: "provisioned" })).toThrow(/shards: provisioned billing/);
    expect(() => provisionedCapacity({ billingMode: "provisioned", shards: 0 })).toThrow(/shards/);
  });

  it("on-demand: PAY_PER_REQUEST and no scaling targets", () => {
    const { template } = synth(undefined);
    template.hasResourceProperties("AWS::DynamoDB::Table", { BillingMode: "PAY_PER_REQUEST" });
    template.resourceCountIs("AWS::ApplicationAutoScaling::ScalableTarget", 0);
  });

  it("provisioned: the sized throughput and read and write auto scaling at 70%", () => {
    const { template } = synth(provisionedCapacity({ billingMode: "provisioned", shards: 10 }));
    template.hasResourceProperties("AWS::DynamoDB::Table", {
      ProvisionedThroughput: { ReadCapacityUnits: 58, WriteCapacityUnits: 43 },
    });
    template.hasResourceProperties("AWS::ApplicationAutoScaling::ScalableTarget", {
      ScalableDimension: "dynamodb:table:WriteCapacityUnits",
      MinCapacity: 43,
      MaxCapacity: 86,
    });
    template.hasResourceProperties("AWS::ApplicationAutoScaling::ScalableTarget", {
      ScalableDimension: "dynamodb:table:ReadCapacityUnits",
      MinCapacity: 58,
      MaxCapacity: 116,
    });
    template.resourceCountIs("AWS::ApplicationAutoScaling::ScalingPolicy", 2);
  });

  it("the throttle metric sums read and write throttle events", () => {
    const { table } = synth(undefined);
    const metric = tableThrottles(table).toMetricConfig();
    expect(metric.mathExpression?.expression).toBe("FILL(reads, 0) + FILL(writes, 0)");
    expect(Object.keys(metric.mathExpression?.usingMetrics ?? {}).sort()).toEqual(["reads", "writes"]);
  });
});
