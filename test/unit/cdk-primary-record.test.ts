import { Stack } from "aws-cdk-lib";
import { Match, Template } from "aws-cdk-lib/assertions";
import { describe, expect, it } from "vitest";
import type { ShardguardControllerProps } from "../../cdk/controller-props.ts";
import { ShardguardController } from "../../cdk/shardguard-controller.ts";
import { ENV, primaryRecordsFromEnv } from "../../src/adapters/env.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

type Statement = { Action: string | string[]; Resource: unknown; Condition?: unknown };

function controllerWith(primaryRecords?: ShardguardControllerProps["primaryRecords"]) {
  const stack = new Stack(cdkApp({ bundle: false }), "Records", {
    env: { account: "123456789012", region: "eu-west-1" },
  });
  const controller = new ShardguardController(stack, "Shardguard", {
    controllerEntry: FIXTURE_ENTRY,
    queuePrefix: "sg",
    primaryRecords,
  });
  return { stack, controller, template: Template.fromStack(stack) };
}

function route53Statements(template: Template): Statement[] {
  return Object.values(template.findResources("AWS::IAM::Policy"))
    .flatMap(
      (policy) =>
        (policy as { Properties: { PolicyDocument: { Statement: Statement[] } } }).Properties.PolicyDocument
          .Statement,
    )
    .filter((statement) => JSON.stringify(statement.Action).includes("route53:"));
}

// Synthesizing a stack takes seconds, tens of them on a loaded machine.
describe("primaryRecords on the construct", { timeout: 120_000 }, () => {
  it("lets the controller change only the shards' names and epoch records in their zone, and tells it which", () => {
    // Act
    const { template } = controllerWith({
      orders: { hostedZoneId: "Z111", name: "Orders.Redis.Example.com" },
      carts: { hostedZoneId: "Z111", name: "carts.redis.example.com", ttl: 10 },
    });

    // Assess: one read and one conditioned change statement for the one zone.
    expect(route53Statements(template)).toEqual([
      {
        Action: "route53:ListResourceRecordSets",
        Effect: "Allow",
        Resource: "arn:aws:route53:::hostedzone/Z111",
      },
      {
        Action: "route53:ChangeResourceRecordSets",
        Effect: "Allow",
        Resource: "arn:aws:route53:::hostedzone/Z111",
        Condition: {
          "ForAllValues:StringEquals": {
            "route53:ChangeResourceRecordSetsNormalizedRecordNames": [
              "_shardguard.carts.redis.example.com",
              "_shardguard.orders.redis.example.com",
              "carts.redis.example.com",
              "orders.redis.example.com",
            ],
            "route53:ChangeResourceRecordSetsRecordTypes": ["A", "AAAA", "CNAME", "TXT"],
          },
        },
      },
    ]);
    const functions = template.findResources("AWS::Lambda::Function", {
      Properties: {
        Environment: { Variables: Match.objectLike({ [ENV.primaryRecords]: Match.anyValue() }) },
      },
    });
    const variables = Object.values(functions).map(
      (fn) =>
        (fn as { Properties: { Environment: { Variables: Record<string, string> } } }).Properties.Environment
          .Variables,
    );
    // The scheduled controller and the operators' one, each with the records the handler parses back.
    expect(variables).toHaveLength(2);
    for (const env of variables) {
      expect(primaryRecordsFromEnv(env)).toEqual({
        orders: { hostedZoneId: "Z111", name: "orders.redis.example.com", ttl: 5 },
        carts: { hostedZoneId: "Z111", name: "carts.redis.example.com", ttl: 10 },
      });
    }
  });

  it("grants nothing on Route 53 and sets no variable without records", () => {
    const { template } = controllerWith();
    expect(route53Statements(template)).toEqual([]);
    expect(JSON.stringify(template.toJSON())).not.toContain(ENV.primaryRecords);
  });

  it("refuses a bad record at synth, naming the prop", () => {
    expect(() =>
      controllerWith({ orders: { hostedZoneId: "/hostedzone/Z1", name: "orders.example.com" } }),
    ).toThrow(/primaryRecords: orders\.hostedZoneId/);
  });
});
