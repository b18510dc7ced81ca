import { readFileSync } from "node:fs";
import path from "node:path";
import { Stack } from "aws-cdk-lib";
import { Match, Template } from "aws-cdk-lib/assertions";
import * as ecs from "aws-cdk-lib/aws-ecs";
import { beforeAll, describe, expect, it } from "vitest";
import { agentTimingEnvironment } from "../../cdk/agent-environment.ts";
import { ShardguardController } from "../../cdk/shardguard-controller.ts";
import { operatorProfile, ShardguardStack } from "../../cdk/shardguard-stack.ts";
import { defaultQueuePrefix, queueNames, validateQueuePrefix } from "../../src/adapters/queue-names.ts";
import { wakeQueueName } from "../../src/adapters/sqs-wake-queue.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

type Statement = { Action: string | string[]; Resource: unknown };
type Resource = { Type: string; Properties: Record<string, unknown> };

const ENV = { account: "123456789012", region: "eu-west-3" };

/** Two stacks of the default app side by side in one account: only their names differ. */
function twoInstallations() {
  const app = cdkApp({ bundle: false });
  const stacks = ["Shardguard", "Shardguard-Staging"].map(
    (name) =>
      new ShardguardStack(app, name, {
        env: ENV,
        controller: { controllerEntry: FIXTURE_ENTRY },
        nodes: [{ shard: "orders", node: "n1" }],
      }),
  );
  const [a, b] = stacks.map((stack) => ({ stack, template: Template.fromStack(stack).toJSON() }));
  if (!a || !b) throw new Error("two stacks expected");
  return [a, b] as const;
}

/** The resource part (after the account) of every SQS ARN any IAM statement in the template names. */
function sqsResourcePatterns(template: Record<string, unknown>): string[] {
  const patterns: string[] = [];
  for (const resource of Object.values(template.Resources as Record<string, Resource>)) {
    if (resource.Type !== "AWS::IAM::Policy" && resource.Type !== "AWS::IAM::ManagedPolicy") continue;
    const document = resource.Properties.PolicyDocument as { Statement: Statement[] };
    for (const statement of document.Statement) {
      const resources = Array.isArray(statement.Resource) ? statement.Resource : [statement.Resource];
      for (const arn of resources) {
        if (typeof arn === "string" && arn.startsWith("arn:aws:sqs:")) patterns.push(arn.split(":")[5] ?? "");
      }
    }
  }
  return patterns;
}

/** IAM's wildcard matching of a resource pattern (`*` any run, `?` one character). */
function iamMatches(pattern: string, name: string): boolean {
  const regex = pattern
    .replace(/[.+^${}()|[\]\\]/g, "\\$&")
    .replace(/\*/g, ".*")
    .replace(/\?/g, ".");
  return new RegExp(`^${regex}$`).test(name);
}

describe("two installations in one account", () => {
  let installations: ReturnType<typeof twoInstallations>;
  beforeAll(() => {
    installations = twoInstallations();
  }, 60_000);

  it("derive distinct physical names from their stacks: CloudFormation names the tables, the queue prefix is the stack name", () => {
    // Act
    const [a, b] = installations;

    // Assess
    for (const { template } of [a, b]) {
      const tables = Object.values(template.Resources as Record<string, Resource>).filter(
        (resource) => resource.Type === "AWS::DynamoDB::Table",
      );
      expect(tables).toHaveLength(1);
      expect(tables[0]?.Properties).not.toHaveProperty("TableName");
    }
    expect(a.stack.controller.queuePrefix).toBe("Shardguard");
    expect(b.stack.controller.queuePrefix).toBe("Shardguard-Staging");
    expect(a.template.Outputs.QueuePrefix.Value).toBe("Shardguard");
    expect(b.template.Outputs.QueuePrefix.Value).toBe("Shardguard-Staging");
  });

  it("grant no SQS rights on the other installation's queues", () => {
    // Prepare
    const [a, b] = installations;
    const queuesOf = (prefix: string) => [
      wakeQueueName(prefix),
      queueNames(prefix, "orders", "n1").queue,
      queueNames(prefix, "orders", "n1").deadLetterQueue,
    ];

    // Act
    const patternsA = sqsResourcePatterns(a.template);
    const patternsB = sqsResourcePatterns(b.template);

    // Assess: each grants on its own queues, none on the other's.
    expect(patternsA).toEqual(expect.arrayContaining(["Shardguard_*", "Shardguard_orders_n1"]));
    expect(patternsB).toEqual(
      expect.arrayContaining(["Shardguard-Staging_*", "Shardguard-Staging_orders_n1"]),
    );
    for (const [patterns, otherQueues] of [
      [patternsA, queuesOf("Shardguard-Staging")],
      [patternsB, queuesOf("Shardguard")],
    ] as const) {
      for (const pattern of patterns)
        for (const queue of otherQueues)
          expect(iamMatches(pattern, queue), `${pattern} ~ ${queue}`).toBe(false);
    }
  });

  it("cut long stack names to 20 characters with a hash, so they still differ", () => {
    // Act
    const one = defaultQueuePrefix("Shardguard-Production-Orders");
    const two = defaultQueuePrefix("Shardguard-Production-Payments");

    // Assess
    expect(one).not.toBe(two);
    for (const prefix of [one, two]) {
      expect(prefix).toMatch(/^Shardguard-Pr-[0-9a-f]{6}$/);
      expect(() => validateQueuePrefix(prefix)).not.toThrow();
    }
  });
});

describe("queue prefix separator", () => {
  it.each([
    ["a prefix with the separator", "sg_a"],
    ["a prefix that is only the separator", "_"],
  ])("rejects %s, naming the prop and the reason", (_name, queuePrefix) => {
    // Prepare
    const stack = new Stack(cdkApp({ bundle: false }), "Prefix");

    // Act / Assess
    expect(
      () => new ShardguardController(stack, "Shardguard", { controllerEntry: FIXTURE_ENTRY, queuePrefix }),
    ).toThrowError(/queuePrefix: invalid queue prefix .*'_' separates prefix, shard and node/);
  });
});

describe("operator requests", () => {
  it("go to a function of their own that neither the schedule nor the wake queue invokes", () => {
    // Prepare
    const app = cdkApp({ bundle: false });
    const stack = new ShardguardStack(app, "Shardguard", {
      env: ENV,
      controller: { controllerEntry: FIXTURE_ENTRY },
    });
    const template = Template.fromStack(stack);
    const idOf = (fn: { node: { defaultChild?: unknown } }) =>
      stack.getLogicalId(fn.node.defaultChild as never);
    const controllerId = idOf(stack.controller.controllerFunction);
    const operatorId = idOf(stack.controller.operatorFunction);

    // Act
    const functions = template.findResources("AWS::Lambda::Function");
    const rules = Object.values(template.findResources("AWS::Events::Rule"));
    const mappings = Object.values(template.findResources("AWS::Lambda::EventSourceMapping"));
    const permissions = Object.values(template.findResources("AWS::Lambda::Permission"));

    // Assess: concurrency pools are per function, and the operator's is never used by the loop.
    expect(functions[controllerId]?.Properties.ReservedConcurrentExecutions).toBe(3);
    expect(functions[operatorId]?.Properties.ReservedConcurrentExecutions).toBe(2);
    expect(functions[operatorId]?.Properties.Runtime).toBe("nodejs24.x");
    const targets = rules.flatMap((rule) => (rule.Properties.Targets as { Arn: unknown }[]) ?? []);
    expect(targets.map((target) => target.Arn)).toEqual([{ "Fn::GetAtt": [controllerId, "Arn"] }]);
    expect(mappings.map((mapping) => mapping.Properties.FunctionName)).toEqual([{ Ref: controllerId }]);
    expect(JSON.stringify(permissions)).not.toContain(operatorId);
    expect(template.toJSON().Outputs.OperatorFunctionName.Value).toEqual({ Ref: operatorId });
  }, 30_000);
});

describe("operator profile", () => {
  it("is an output holding the operator role and the stack's region", () => {
    // Prepare
    const app = cdkApp({ bundle: false });
    const stack = new ShardguardStack(app, "Shardguard", {
      env: ENV,
      controller: { controllerEntry: FIXTURE_ENTRY },
    });

    // Act
    const output = stack.resolve(Template.fromStack(stack).toJSON().Outputs.OperatorProfile.Value) as {
      "Fn::Join": [string, unknown[]];
    };

    // Assess
    const text = output["Fn::Join"][1]
      .map((part) => (typeof part === "string" ? part : "<role-arn>"))
      .join("");
    expect(text).toBe(
      "[profile shardguard-operator]\nrole_arn = <role-arn>\nregion = eu-west-3\nsource_profile = default",
    );
    expect(operatorProfile("Shardguard-Staging", "arn:r", "us-east-2")).toContain(
      "[profile shardguard-staging-operator]",
    );
  }, 30_000);
});

describe("the ECS example of docs/deploy.md", () => {
  it("synthesizes in awsvpc mode with the agent's environment from the construct and no --address", () => {
    // Prepare: the page's task definition, as a user's stack would hold it.
    const doc = readFileSync(path.join(import.meta.dirname, "..", "..", "docs", "deploy.md"), "utf8");
    const example = /### ECS: task role[\s\S]*?```ts\n([\s\S]*?)```/.exec(doc)?.[1] ?? "";
    const stack = new Stack(cdkApp({ bundle: false }), "Ecs", { env: ENV });
    const shardguard = new ShardguardController(stack, "Shardguard", { controllerEntry: FIXTURE_ENTRY });
    const task = new ecs.Ec2TaskDefinition(stack, "OrdersN1", { networkMode: ecs.NetworkMode.AWS_VPC });
    task.addContainer("redis", {
      image: ecs.ContainerImage.fromRegistry("redis:7"),
      memoryLimitMiB: 1024,
      portMappings: [{ containerPort: 6379 }],
    });
    task.addContainer("shardguard-agent", {
      image: ecs.ContainerImage.fromRegistry("shardguard-agent"),
      command: ["shardguard", "agent", "--shard", "orders", "--node-id", "n1", "--redis", "127.0.0.1:6379"],
      environment: { ...shardguard.agentEnvironment(), ...agentTimingEnvironment(shardguard.config) },
      memoryLimitMiB: 256,
    });
    shardguard.grantAgent(task.taskRole, { shard: "orders", node: "n1" });

    // Act
    const template = Template.fromStack(stack);

    // Assess: the test's task is the page's.
    expect(example).toContain("networkMode: ecs.NetworkMode.AWS_VPC");
    expect(example).toContain(
      "environment: { ...shardguard.agentEnvironment(), ...agentTimingEnvironment(shardguard.config) },",
    );
    expect(example).toContain(
      'command: ["shardguard", "agent", "--shard", "orders", "--node-id", "n1", "--redis", "127.0.0.1:6379"],',
    );
    expect(example).not.toContain(`"--address"`);
    template.hasResourceProperties("AWS::ECS::TaskDefinition", {
      NetworkMode: "awsvpc",
      ContainerDefinitions: Match.arrayWith([
        Match.objectLike({
          Name: "shardguard-agent",
          Environment: Match.arrayWith([
            { Name: "SHARDGUARD_TABLE", Value: { Ref: Match.stringLikeRegexp("ShardguardTable") } },
            { Name: "SHARDGUARD_QUEUE_PREFIX", Value: "Ecs" },
            { Name: "SHARDGUARD_FAILURE_TIMEOUT_MS", Value: String(shardguard.config.failureTimeoutMs) },
            { Name: "SHARDGUARD_FENCE_TIMEOUT_MS", Value: String(shardguard.config.fenceTimeoutMs) },
          ]),
        }),
      ]),
    });
  }, 30_000);
});
