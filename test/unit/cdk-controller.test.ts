import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { type App, Stack } from "aws-cdk-lib";
import { Annotations, Match, Template } from "aws-cdk-lib/assertions";
import * as iam from "aws-cdk-lib/aws-iam";
import { AwsSolutionsChecks } from "cdk-nag";
import { beforeAll, describe, expect, it } from "vitest";
import { ShardguardController } from "../../cdk/shardguard-controller.ts";
import { ShardguardStack } from "../../cdk/shardguard-stack.ts";
import { ENV, failoverConfigFromEnv } from "../../src/adapters/env.ts";
import { DEFAULT_CONFIG, type FailoverConfig } from "../../src/core/config.ts";
import { SHARD_INDEX, TTL_ATTRIBUTE, tableDefinition } from "../../src/core/table.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

const ALARM_TOPIC = "arn:aws:sns:eu-west-1:123456789012:shardguard-alarms";

type Statement = { Action: string | string[]; Resource: unknown; Condition?: unknown; Sid?: string };

/** One synthesized stack (one esbuild bundling) shared by every assertion in this file. */
let app: App;
let stack: ShardguardStack;
let template: Template;
let assemblyDir: string;

beforeAll(() => {
  app = cdkApp();
  stack = new ShardguardStack(app, "Shardguard", {
    controller: { controllerEntry: FIXTURE_ENTRY, tableName: "shardguard", queuePrefix: "shardguard" },
    nodes: [{ shard: "orders", node: "n1" }],
    alarmTopicArn: ALARM_TOPIC,
  });
  template = Template.fromStack(stack);
  assemblyDir = app.synth().directory;
}, 60_000);

function logicalId(construct: { node: { defaultChild?: unknown } }): string {
  return stack.getLogicalId(construct.node.defaultChild as never);
}

/** Statements of the IAM policy attached to `roleLogicalId`, as (actions, resource) pairs. */
function statementsOfRole(roleLogicalId: string): Statement[] {
  const policies = template.findResources("AWS::IAM::Policy", {
    Properties: { Roles: Match.arrayWith([{ Ref: roleLogicalId }]) },
  });
  return Object.values(policies).flatMap(
    (policy) =>
      (policy as { Properties: { PolicyDocument: { Statement: Statement[] } } }).Properties.PolicyDocument
        .Statement,
  );
}

/** Sorted: with `@aws-cdk/aws-iam:minimizePolicies` (cdk.json) CDK sorts actions and merges statements. */
function actionsOf(statement: Statement): string[] {
  return (Array.isArray(statement.Action) ? [...statement.Action] : [statement.Action]).sort();
}

/** A single resource is rendered bare, several as a list; compare them as lists. */
function resourcesOf(statement: Statement): unknown[] {
  return Array.isArray(statement.Resource) ? statement.Resource : [statement.Resource];
}

/** A statement in the shape the tests compare: sorted actions, resource list, condition or null. */
function grantOf(statement: Statement) {
  return {
    actions: actionsOf(statement),
    resources: resourcesOf(statement),
    condition: statement.Condition ?? null,
  };
}

function expectedGrant(actions: string[], resources: unknown[], condition: unknown = null) {
  return { actions: [...actions].sort(), resources, condition };
}

describe("coordination table", () => {
  it("uses the key schema of the shared table definition the local stack creates", () => {
    // Prepare
    const definition = tableDefinition("shardguard");

    // Act
    const tables = template.findResources("AWS::DynamoDB::Table");

    // Assess
    expect(Object.keys(tables)).toHaveLength(1);
    template.hasResourceProperties("AWS::DynamoDB::Table", {
      TableName: "shardguard",
      KeySchema: definition.KeySchema,
      AttributeDefinitions: definition.AttributeDefinitions,
      GlobalSecondaryIndexes: definition.GlobalSecondaryIndexes,
    });
  });

  it("bills on demand, keeps point-in-time recovery and the TTL attribute, and is protected from deletion", () => {
    template.hasResource("AWS::DynamoDB::Table", {
      DeletionPolicy: "Retain",
      UpdateReplacePolicy: "Retain",
      Properties: Match.objectLike({
        BillingMode: "PAY_PER_REQUEST",
        PointInTimeRecoverySpecification: { PointInTimeRecoveryEnabled: true, RecoveryPeriodInDays: 35 },
        TimeToLiveSpecification: { AttributeName: TTL_ATTRIBUTE, Enabled: true },
        DeletionProtectionEnabled: true,
      }),
    });
  });

  it("turns deletion protection off when asked", () => {
    // Prepare: skip bundling, only the table matters here.
    const otherApp = cdkApp({ bundle: false });
    const otherStack = new Stack(otherApp, "Unprotected");

    // Act
    new ShardguardController(otherStack, "Shardguard", {
      controllerEntry: FIXTURE_ENTRY,
      deletionProtection: false,
    });

    // Assess
    Template.fromStack(otherStack).hasResourceProperties("AWS::DynamoDB::Table", {
      DeletionProtectionEnabled: false,
    });
  });
});

describe("wake queue", () => {
  it("is consumed by the controller through an event source mapping, at once and in batches of 10", () => {
    template.hasResourceProperties("AWS::SQS::Queue", {
      QueueName: "shardguard_wake",
      MessageRetentionPeriod: 60,
      VisibilityTimeout: 75,
      SqsManagedSseEnabled: true,
    });
    template.hasResourceProperties("AWS::Lambda::EventSourceMapping", {
      BatchSize: 10,
      MaximumBatchingWindowInSeconds: 0,
      ScalingConfig: { MaximumConcurrency: 2 },
      EventSourceArn: { "Fn::GetAtt": [logicalId(stack.controller.wakeQueue), "Arn"] },
    });
  });
});

describe("controller function", () => {
  it("runs on Node.js 24 on arm64 with the loop's timeout, memory and reserved concurrency", () => {
    template.hasResourceProperties("AWS::Lambda::Function", {
      Runtime: "nodejs24.x",
      Architectures: ["arm64"],
      Handler: "index.handler",
      Timeout: 75,
      MemorySize: 512,
      ReservedConcurrentExecutions: 3,
    });
  });

  it("is bundled offline by the local esbuild as an ES module with a require shim", () => {
    // Prepare
    const assetDirs = readdirSync(assemblyDir).filter((name) => name.startsWith("asset."));

    // Act
    const bundles = assetDirs
      .map((dir) => path.join(assemblyDir, dir, "index.mjs"))
      .filter((file) => {
        try {
          return readFileSync(file, "utf8").length > 0;
        } catch {
          return false;
        }
      });

    // Assess
    expect(bundles).toHaveLength(1);
    expect(readFileSync(bundles[0] as string, "utf8")).toContain("createRequire");
  });

  it("sets every environment variable the handler reads, and they parse back to the construct's configuration", () => {
    // Prepare
    const functions = template.findResources("AWS::Lambda::Function");
    const variables = (
      Object.values(functions)[0] as { Properties: { Environment: { Variables: Record<string, unknown> } } }
    ).Properties.Environment.Variables;

    // Act
    const numericAndQuorum = Object.fromEntries(
      Object.entries(variables).filter(([, value]) => typeof value === "string"),
    ) as Record<string, string>;

    // Assess
    const controllerVariables = [
      ENV.table,
      ENV.queuePrefix,
      ENV.eventBusName,
      ...Object.keys(DEFAULT_CONFIG).map((field) => ENV[field as keyof FailoverConfig]),
    ];
    for (const name of controllerVariables) expect(variables).toHaveProperty(name);
    expect(variables[ENV.table]).toEqual({ Ref: logicalId(stack.controller.table) });
    expect(variables[ENV.queuePrefix]).toBe("shardguard");
    expect(variables[ENV.eventBusName]).toBe("default");
    expect(failoverConfigFromEnv(numericAndQuorum)).toEqual(stack.controller.config);
  });

  it("is started by an EventBridge schedule every minute, with retries and a dead-letter queue", () => {
    const failureQueue = logicalId(stack.controller.controllerFailureQueue);
    template.hasResourceProperties("AWS::Events::Rule", {
      ScheduleExpression: "rate(1 minute)",
      State: "ENABLED",
      Targets: [
        Match.objectLike({
          Arn: { "Fn::GetAtt": [logicalId(stack.controller.controllerFunction), "Arn"] },
          DeadLetterConfig: { Arn: { "Fn::GetAtt": [failureQueue, "Arn"] } },
          RetryPolicy: { MaximumRetryAttempts: 2, MaximumEventAgeInSeconds: 60 },
        }),
      ],
    });
  });

  it("sends failed invocations to the dead-letter queue instead of retrying into the next minute's run", () => {
    template.hasResourceProperties("AWS::Lambda::EventInvokeConfig", {
      MaximumRetryAttempts: 0,
      MaximumEventAgeInSeconds: 60,
      DestinationConfig: {
        OnFailure: {
          Destination: { "Fn::GetAtt": [logicalId(stack.controller.controllerFailureQueue), "Arn"] },
        },
      },
    });
  });

  it("encrypts its dead-letter queue and refuses requests without TLS", () => {
    template.hasResourceProperties("AWS::SQS::Queue", { SqsManagedSseEnabled: true });
    template.hasResourceProperties("AWS::SQS::QueuePolicy", {
      PolicyDocument: {
        Statement: Match.arrayWith([
          Match.objectLike({
            Effect: "Deny",
            Action: "sqs:*",
            Condition: { Bool: { "aws:SecureTransport": "false" } },
          }),
        ]),
      },
    });
  });
});

describe("IAM", () => {
  const tableArn = () => ({ "Fn::GetAtt": [logicalId(stack.controller.table), "Arn"] });
  const shardIndexArn = () => ({ "Fn::Join": ["", [tableArn(), `/index/${SHARD_INDEX.indexName}`]] });
  /** An ARN in this (environment-agnostic) stack's account and region. */
  const arnIn = (service: string, resource: string) => ({
    "Fn::Join": [
      "",
      [
        "arn:",
        { Ref: "AWS::Partition" },
        `:${service}:`,
        { Ref: "AWS::Region" },
        ":",
        { Ref: "AWS::AccountId" },
        `:${resource}`,
      ],
    ],
  });

  it("grants the controller exactly the actions it uses, each on its own resource", () => {
    // Act
    const statements = statementsOfRole(logicalId(stack.controller.controllerRole));

    // Assess
    expect(statements.map(grantOf)).toEqual([
      expectedGrant(
        ["logs:CreateLogStream", "logs:PutLogEvents"],
        [{ "Fn::GetAtt": [logicalId(stack.controller.controllerLogGroup), "Arn"] }],
      ),
      // Added by the L2 SqsDestination for the async failure destination.
      expectedGrant(
        ["sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"],
        [{ "Fn::GetAtt": [logicalId(stack.controller.controllerFailureQueue), "Arn"] }],
      ),
      // Added by the L2 SqsEventSource: the wake queue's event source mapping consumes it.
      expectedGrant(
        [
          "sqs:ReceiveMessage",
          "sqs:ChangeMessageVisibility",
          "sqs:GetQueueUrl",
          "sqs:DeleteMessage",
          "sqs:GetQueueAttributes",
        ],
        [{ "Fn::GetAtt": [logicalId(stack.controller.wakeQueue), "Arn"] }],
      ),
      expectedGrant(
        [
          "dynamodb:GetItem",
          "dynamodb:Query",
          "dynamodb:PutItem",
          "dynamodb:UpdateItem",
          "dynamodb:DeleteItem",
          "dynamodb:ConditionCheckItem",
        ],
        [tableArn()],
      ),
      // The shard index by name: listing the shards is the one read through an index.
      expectedGrant(["dynamodb:Query"], [shardIndexArn()]),
      expectedGrant(
        // Send only: agents create their queues, the controller never does.
        ["sqs:GetQueueUrl", "sqs:SendMessage"],
        [arnIn("sqs", "shardguard_*")],
      ),
      expectedGrant(["events:PutEvents"], [arnIn("events", "event-bus/default")]),
    ]);
  });

  it("gives the agent policy writes to its own node partition only, reads of its shard, its own queues, and no grant on the legacy shard index partition", () => {
    // Act
    const policies = template.findResources("AWS::IAM::ManagedPolicy");

    // Assess
    expect(Object.keys(policies)).toHaveLength(1);
    const statements = (
      Object.values(policies)[0] as { Properties: { PolicyDocument: { Statement: Statement[] } } }
    ).Properties.PolicyDocument.Statement;
    expect(statements.map((statement) => statement.Sid)).toEqual([
      "OwnNodePartition",
      "ReadShardNodes",
      "ShardMembership",
      "ReadShardControl",
      "CreateOwnQueues",
      "ConsumeOwnQueue",
      "WakeController",
    ]);
    expect(statements.map(grantOf)).toEqual([
      expectedGrant(["dynamodb:PutItem", "dynamodb:UpdateItem"], [tableArn()], {
        "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["NODE#orders#n1"] },
      }),
      expectedGrant(["dynamodb:Query"], [tableArn()], {
        "ForAllValues:StringLike": { "dynamodb:LeadingKeys": ["NODE#orders#*"] },
      }),
      expectedGrant(
        ["dynamodb:Query", "dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem"],
        [tableArn()],
        {
          "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["SHARD#orders"] },
        },
      ),
      expectedGrant(["dynamodb:Query", "dynamodb:GetItem", "dynamodb:ConditionCheckItem"], [tableArn()], {
        "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["CONTROL#orders"] },
      }),
      expectedGrant(
        ["sqs:GetQueueUrl", "sqs:CreateQueue", "sqs:GetQueueAttributes", "sqs:SetQueueAttributes"],
        [arnIn("sqs", "shardguard_dlq"), arnIn("sqs", "shardguard_orders_n1")],
      ),
      expectedGrant(
        ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"],
        [arnIn("sqs", "shardguard_orders_n1")],
      ),
      expectedGrant(["sqs:GetQueueUrl", "sqs:SendMessage"], [arnIn("sqs", "shardguard_wake")]),
    ]);
  });

  it("grants an existing agent role the same statements as the managed policy", () => {
    // Prepare
    const otherApp = cdkApp({ bundle: false });
    const otherStack = new Stack(otherApp, "Agent");
    const controller = new ShardguardController(otherStack, "Shardguard", { controllerEntry: FIXTURE_ENTRY });
    const taskRole = new iam.Role(otherStack, "TaskRole", {
      assumedBy: new iam.ServicePrincipal("ecs-tasks.amazonaws.com"),
    });

    // Act
    controller.grantAgent(taskRole, { shard: "orders", node: "n2" });

    // Assess
    const policies = Template.fromStack(otherStack).findResources("AWS::IAM::Policy", {
      Properties: { Roles: [{ Ref: otherStack.getLogicalId(taskRole.node.defaultChild as iam.CfnRole) }] },
    });
    const granted = (
      Object.values(policies)[0] as { Properties: { PolicyDocument: { Statement: Statement[] } } }
    ).Properties.PolicyDocument.Statement;
    expect(granted.map((statement) => [actionsOf(statement), statement.Condition ?? null])).toEqual([
      [
        ["dynamodb:PutItem", "dynamodb:UpdateItem"],
        { "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["NODE#orders#n2"] } },
      ],
      [["dynamodb:Query"], { "ForAllValues:StringLike": { "dynamodb:LeadingKeys": ["NODE#orders#*"] } }],
      [
        ["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:UpdateItem"],
        { "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["SHARD#orders"] } },
      ],
      [
        ["dynamodb:ConditionCheckItem", "dynamodb:GetItem", "dynamodb:Query"],
        { "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": ["CONTROL#orders"] } },
      ],
      [["sqs:CreateQueue", "sqs:GetQueueAttributes", "sqs:GetQueueUrl", "sqs:SetQueueAttributes"], null],
      [["sqs:ChangeMessageVisibility", "sqs:DeleteMessage", "sqs:ReceiveMessage"], null],
      [["sqs:GetQueueUrl", "sqs:SendMessage"], null],
    ]);
  });

  it("lets operators invoke the unqualified operator function and read the table, nothing more", () => {
    // Act
    const statements = statementsOfRole(logicalId(stack.operatorRole));

    // Assess
    expect(statements.map(grantOf)).toEqual([
      expectedGrant(
        ["lambda:InvokeFunction"],
        [{ "Fn::GetAtt": [logicalId(stack.controller.operatorFunction), "Arn"] }],
      ),
      expectedGrant(["dynamodb:GetItem", "dynamodb:Query"], [tableArn()]),
      expectedGrant(["dynamodb:Query"], [shardIndexArn()]),
    ]);
  });
});

describe("events, alarms and dashboard", () => {
  const metricsInsights = (metric: string) =>
    Match.objectLike({
      Metrics: [Match.objectLike({ Expression: `SELECT SUM(${metric}) FROM Shardguard`, Period: 60 })],
    });

  it("alarms when a failover starts and when a shard goes offline, on the controller's metrics", () => {
    template.hasResourceProperties("AWS::CloudWatch::Alarm", metricsInsights("failoverStarted"));
    template.hasResourceProperties("AWS::CloudWatch::Alarm", metricsInsights("shardOffline"));
  });

  it("alarms when a primary stays stale for three minutes without a failover", () => {
    template.hasResourceProperties("AWS::CloudWatch::Alarm", {
      Metrics: [
        Match.objectLike({ Expression: "SELECT SUM(staleHeartbeatDetected) FROM Shardguard", Period: 60 }),
      ],
      EvaluationPeriods: 3,
    });
  });

  it("alarms on controller errors, throttles and a controller that stopped running", () => {
    for (const metric of ["Errors", "Throttles"]) {
      template.hasResourceProperties("AWS::CloudWatch::Alarm", {
        Namespace: "AWS/Lambda",
        MetricName: metric,
        ComparisonOperator: "GreaterThanOrEqualToThreshold",
        Threshold: 1,
      });
    }
    template.hasResourceProperties("AWS::CloudWatch::Alarm", {
      Namespace: "AWS/Lambda",
      MetricName: "Invocations",
      ComparisonOperator: "LessThanThreshold",
      TreatMissingData: "breaching",
    });
  });

  it("alarms when the controller's or the node queues' shared dead-letter queue is not empty", () => {
    template.hasResourceProperties("AWS::CloudWatch::Alarm", {
      Namespace: "AWS/SQS",
      MetricName: "ApproximateNumberOfMessagesVisible",
      Dimensions: [
        {
          Name: "QueueName",
          Value: { "Fn::GetAtt": [logicalId(stack.controller.controllerFailureQueue), "QueueName"] },
        },
      ],
    });
    template.hasResourceProperties("AWS::CloudWatch::Alarm", {
      Namespace: "AWS/SQS",
      MetricName: "ApproximateNumberOfMessagesVisible",
      Dimensions: [{ Name: "QueueName", Value: "shardguard_dlq" }],
      Statistic: "Maximum",
    });
  });

  it("sends every alarm to the alarm topic", () => {
    const alarms = Object.values(template.findResources("AWS::CloudWatch::Alarm"));
    // 8 of the controller (the table throttle alarm included) and the node's dead-letter alarm.
    expect(alarms).toHaveLength(9);
    for (const alarm of alarms) {
      expect((alarm as { Properties: { AlarmActions: string[] } }).Properties.AlarmActions).toEqual([
        ALARM_TOPIC,
      ]);
    }
  });

  it("publishes a dashboard", () => {
    template.resourceCountIs("AWS::CloudWatch::Dashboard", 1);
  });

  it("offers a rule on the failover events of the event bus", () => {
    // Prepare
    const otherApp = cdkApp({ bundle: false });
    const otherStack = new Stack(otherApp, "Events");
    const controller = new ShardguardController(otherStack, "Shardguard", { controllerEntry: FIXTURE_ENTRY });

    // Act
    controller.onShardguardEvent("OnFailover", { detailTypes: ["FailoverStarted", "FailoverCompleted"] });

    // Assess
    Template.fromStack(otherStack).hasResourceProperties("AWS::Events::Rule", {
      EventPattern: { source: ["shardguard"], "detail-type": ["FailoverStarted", "FailoverCompleted"] },
    });
  });
});

describe("cdk-nag AwsSolutions", () => {
  it("reports no unacknowledged finding", () => {
    // Act
    const report = new AwsSolutionsChecks(app).validateScope(app);

    // Assess
    expect(report.violations).toEqual([]);
    expect(report.success).toBe(true);
    expect(Annotations.fromStack(stack).findError("*", Match.anyValue())).toEqual([]);
  });

  it("stays clean in a stack with a concrete account and region, where ARNs are literals", () => {
    // Prepare
    const otherApp = cdkApp({ bundle: false });
    const otherStack = new ShardguardStack(otherApp, "Concrete", {
      env: { account: "123456789012", region: "eu-west-1" },
      controller: { controllerEntry: FIXTURE_ENTRY, queuePrefix: "sg" },
      nodes: [{ shard: "orders", node: "n1" }],
    });

    // Act
    const report = new AwsSolutionsChecks(otherApp).validateScope(otherStack);

    // Assess
    expect(report.violations).toEqual([]);
  });

  it("justifies every acknowledgment with a reason", () => {
    // Act
    const acknowledged = stack.node
      .findAll()
      .flatMap((construct) => construct.node.metadata)
      .filter((entry) => entry.type === "aws:cdk:acknowledged-rules")
      .flatMap((entry) => Object.entries(entry.data as Record<string, string>))
      // CDK records the id qualified by its namespace ("Annotation::AwsSolutions-SQS3").
      .map(([id, reason]) => ({ id: id.replace(/^\w+::/, ""), reason }));

    // Assess
    expect(acknowledged.map((rule) => rule.id).sort()).toEqual([
      "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:sqs:<AWS::Region>:<AWS::AccountId>:shardguard_*]",
      "AwsSolutions-SQS3",
      "AwsSolutions-SQS3",
    ]);
    for (const rule of acknowledged) expect(rule.reason.length).toBeGreaterThan(40);
  });
});
