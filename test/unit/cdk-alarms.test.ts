import { Template } from "aws-cdk-lib/assertions";
import { beforeAll, describe, expect, it } from "vitest";
import { ShardguardStack } from "../../cdk/shardguard-stack.ts";
import { METRIC_NAMES } from "../../src/core/observability.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

let stack: ShardguardStack;
let template: Template;

beforeAll(() => {
  stack = new ShardguardStack(cdkApp({ bundle: false }), "Shardguard", {
    controller: { controllerEntry: FIXTURE_ENTRY, dashboardName: "shardguard" },
    nodes: [
      { shard: "orders", node: "n1" },
      { shard: "orders", node: "n2" },
    ],
  });
  template = Template.fromStack(stack);
}, 60_000);

describe("the controller's alarms and dashboard (cdk/controller-alarms.ts, cdk/controller-dashboard.ts)", () => {
  it("keeps the logical IDs of earlier releases, so an upgrade updates them in place", () => {
    // A changed ID would make CloudFormation create a new resource and delete the old one: for a
    // dashboard with a fixed name, the delete removes the dashboard the create had just written.
    const ids = (type: string) => Object.keys(template.findResources(type)).sort();
    expect(ids("AWS::CloudWatch::Alarm")).toEqual(
      [
        "ShardguardFailoverAlarmDC39D4EC",
        "ShardguardShardOfflineAlarm0C2B2AF3",
        "ShardguardPrimaryStaleAlarm2A8F9891",
        "ShardguardControllerErrorsAlarm237E385D",
        "ShardguardControllerThrottlesAlarm1263A94B",
        "ShardguardControllerNotRunningAlarm48255F1E",
        "ShardguardControllerFailureQueueAlarmC6D0018B",
        "ShardguardTableThrottleAlarm5B699592",
        "ShardguardDeadLetterQueueAlarmAFDC054B",
      ].sort(),
    );
    expect(ids("AWS::CloudWatch::Dashboard")).toEqual(["ShardguardDashboard38891460"]);
  });

  it("exposes every control-plane alarm on the construct, in the dashboard's alarm widget", () => {
    // Act
    const controller = stack.controller;
    const body = JSON.stringify(template.findResources("AWS::CloudWatch::Dashboard"));

    // Assess
    expect(controller.alarms.all).toHaveLength(9);
    expect(controller.alarms.all).toContain(controller.alarms.deadLetters);
    expect(controller.alarms.all).toContain(controller.failoverAlarm);
    expect(controller.alarms.all).toContain(controller.tableThrottleAlarm);
    for (const alarm of controller.alarms.all) {
      expect(body).toContain(stack.getLogicalId(alarm.node.defaultChild as never));
    }
  });

  it("graphs every controller metric; one alarm watches every node's dead letters, none a node", () => {
    // Act
    const body = JSON.stringify(template.findResources("AWS::CloudWatch::Dashboard"));
    const deadLetterAlarms = Object.values(template.findResources("AWS::CloudWatch::Alarm")).filter((alarm) =>
      JSON.stringify(alarm).includes("_dlq"),
    );

    // Assess
    for (const metric of METRIC_NAMES) expect(body).toContain(`SELECT SUM(${metric}) FROM Shardguard`);
    expect(deadLetterAlarms).toHaveLength(1);
    expect(deadLetterAlarms[0]?.Properties).toMatchObject({
      Dimensions: [{ Name: "QueueName", Value: `${stack.controller.queuePrefix}_dlq` }],
    });
  });
});
