import { App, Stack } from "aws-cdk-lib";
import { Match, Template } from "aws-cdk-lib/assertions";
import * as dynamodb from "aws-cdk-lib/aws-dynamodb";
import { describe, expect, it } from "vitest";
import { partitionProblems } from "../../cdk/controller-partitions.ts";
import { ShardguardController } from "../../cdk/shardguard-controller.ts";
import {
  addTableAutoScaling,
  provisionedCapacity,
  steadyUnits,
  tableBillingProps,
  tableThrottles,
} from "../../cdk/table-capacity.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

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
    // shards, nodes, heartbeat ms, write units/s, read units/s: each agent's store cycles (the primary
    // every 2 heartbeats, each replica every 20: a Query and a PutItem each), the scheduled
    // controller's Query of every shard and index page once a minute, and 10 shards in trouble
    // read every tick
    [1, 3, 1000, 0.6, 0.6 + 1 / 60 + 0.5 / 60 + 1],
    [100, 3, 1000, 60, 60 + 100 / 60 + 0.5 / 60 + 10],
    [1000, 3, 1000, 600, 600 + 1000 / 60 + 5 / 60 + 10],
    [1000, 3, 2000, 550, 550 + 1000 / 60 + 5 / 60 + 10],
  ])("%i shards x %i nodes, heartbeat %i ms: %d writes/s, %d reads/s", (shards, nodes, hb, write, read) => {
    const units = steadyUnits(
      { shards, nodesPerShard: nodes },
      { heartbeatIntervalMs: hb, fenceTimeoutMs: 2500, tickIntervalMs: 1000 },
    );
    expect(units.write).toBeCloseTo(write, 6);
    expect(units.read).toBeCloseTo(read, 6);
  });

  it("sizes provisioned capacity at 70% utilization, scaling up to twice that", () => {
    expect(provisionedCapacity({ billingMode: "provisioned", shards: 100 })).toEqual({
      writeCapacity: 86,
      readCapacity: 103,
      maxWriteCapacity: 172,
      maxReadCapacity: 206,
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
      ProvisionedThroughput: { ReadCapacityUnits: 24, WriteCapacityUnits: 9 },
    });
    template.hasResourceProperties("AWS::ApplicationAutoScaling::ScalableTarget", {
      ScalableDimension: "dynamodb:table:WriteCapacityUnits",
      MinCapacity: 9,
      MaxCapacity: 18,
    });
    template.hasResourceProperties("AWS::ApplicationAutoScaling::ScalableTarget", {
      ScalableDimension: "dynamodb:table:ReadCapacityUnits",
      MinCapacity: 24,
      MaxCapacity: 48,
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

describe("the controller construct's billing, throttle alarm and partitions", { timeout: 120_000 }, () => {
  function controller(props: Partial<ConstructorParameters<typeof ShardguardController>[2]>) {
    const stack = new Stack(cdkApp({ bundle: false }), "S");
    new ShardguardController(stack, "C", { controllerEntry: FIXTURE_ENTRY, ...props });
    return Template.fromStack(stack);
  }

  it("by default: an on-demand table, one schedule target without a partition, a throttle alarm", () => {
    const template = controller({});
    template.hasResourceProperties("AWS::DynamoDB::Table", { BillingMode: "PAY_PER_REQUEST" });
    template.resourceCountIs("AWS::ApplicationAutoScaling::ScalableTarget", 0);
    const rules = Object.values(template.findResources("AWS::Events::Rule"));
    const scheduled = rules.filter((rule) => rule.Properties.ScheduleExpression === "rate(1 minute)");
    expect(scheduled).toHaveLength(1);
    expect(scheduled[0]?.Properties.Targets).toHaveLength(1);
    expect(scheduled[0]?.Properties.Targets[0].Input).toBeUndefined();
    template.hasResourceProperties("AWS::CloudWatch::Alarm", {
      AlarmDescription: Match.stringLikeRegexp("^DynamoDB throttled Shardguard's table"),
      Metrics: Match.arrayWith([Match.objectLike({ Expression: "FILL(reads, 0) + FILL(writes, 0)" })]),
    });
  });

  it("provisioned for 100 shards in 7 partitions: sized table with auto scaling, 7 targets over 2 rules", () => {
    const template = controller({
      billingMode: "provisioned",
      shards: 100,
      partitions: 7,
      controllerReservedConcurrency: 16,
    });
    // 60 store cycles/s (a PutItem and a Query each), each shard and 7 index pages a minute, and
    // 10 shards in trouble every tick: / 0.7.
    template.hasResourceProperties("AWS::DynamoDB::Table", {
      ProvisionedThroughput: { ReadCapacityUnits: 103, WriteCapacityUnits: 86 },
    });
    template.resourceCountIs("AWS::ApplicationAutoScaling::ScalableTarget", 2);
    const rules = Object.values(template.findResources("AWS::Events::Rule")).filter(
      (rule) => rule.Properties.ScheduleExpression === "rate(1 minute)",
    );
    const inputs = rules.flatMap((rule) =>
      (rule.Properties.Targets as { Input: string }[]).map((target) => JSON.parse(target.Input)),
    );
    expect(rules.map((rule) => rule.Properties.Targets.length).sort()).toEqual([2, 5]);
    expect(inputs.map((input) => input.partition.index).sort()).toEqual([0, 1, 2, 3, 4, 5, 6]);
    expect(new Set(inputs.map((input) => input.partition.count))).toEqual(new Set([7]));
  });

  it("refuses partitions its reserved concurrency cannot run, and provisioned billing without a shard count", () => {
    expect(partitionProblems(3, 8)).toEqual([]);
    expect(partitionProblems(3, 7)).toEqual([
      "controllerReservedConcurrency: 3 partitions overlap up to 6 scheduled invocations plus 2 for wake-ups; give at least 8, got 7",
    ]);
    expect(partitionProblems(0, 3)).toEqual(["partitions: must be an integer from 1 to 100, got 0"]);
    expect(() => controller({ partitions: 3 })).toThrow(/give at least 8, got 3/);
    expect(() => controller({ billingMode: "provisioned" })).toThrow(/shards: provisioned billing/);
  });
});
