import { readFileSync } from "node:fs";
import { Match, Template } from "aws-cdk-lib/assertions";
import { beforeAll, describe, expect, it } from "vitest";
import {
  agentIamRows,
  controllerIamRows,
  EXAMPLE_NODE,
  EXAMPLE_QUEUE_PREFIX,
  IAM_DOC_TABLES,
  withIamTable,
} from "../../cdk/docs-iam.ts";
import { ShardguardStack } from "../../cdk/shardguard-stack.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

const ROOT = new URL("../../", import.meta.url);

type Statement = { Action: string | string[]; Resource: unknown; Sid?: string };

const sorted = (actions: readonly string[]) => [...actions].sort();
const actionsOf = (statement: Statement) =>
  sorted(Array.isArray(statement.Action) ? statement.Action : [statement.Action]);

/** The stack of the pages, synthesized once: its node policy and controller role are what AWS evaluates. */
let stack: ShardguardStack;
let template: Template;

beforeAll(() => {
  stack = new ShardguardStack(cdkApp({ bundle: false }), "Shardguard", {
    controller: { controllerEntry: FIXTURE_ENTRY, queuePrefix: EXAMPLE_QUEUE_PREFIX },
    nodes: [EXAMPLE_NODE],
  });
  template = Template.fromStack(stack);
}, 60_000);

function agentPolicyStatements(): Statement[] {
  const policies = template.findResources("AWS::IAM::ManagedPolicy", {
    Properties: { Description: Match.stringLikeRegexp(`node ${EXAMPLE_NODE.node} in shard`) },
  });
  return Object.values(policies).flatMap(
    (policy) =>
      (policy as { Properties: { PolicyDocument: { Statement: Statement[] } } }).Properties.PolicyDocument
        .Statement,
  );
}

function controllerRoleStatements(): Statement[] {
  const role = stack.getLogicalId(stack.controller.controllerRole.node.defaultChild as never);
  const policies = template.findResources("AWS::IAM::Policy", {
    Properties: { Roles: Match.arrayWith([{ Ref: role }]) },
  });
  return Object.values(policies).flatMap(
    (policy) =>
      (policy as { Properties: { PolicyDocument: { Statement: Statement[] } } }).Properties.PolicyDocument
        .Statement,
  );
}

describe("the IAM tables of docs/deploy.md and docs/ec2.md", () => {
  it.each(IAM_DOC_TABLES.map((table) => [table.file, table] as const))(
    "%s carries the table the code generates (run node cdk/docs-iam.ts after changing a grant)",
    (_file, table) => {
      const text = readFileSync(new URL(table.file, ROOT), "utf8");

      expect(withIamTable(text, table)).toBe(text);
    },
  );

  it("lists, statement by statement, the actions of the agent policy the stack synthesizes", () => {
    // Act
    const synthesized = agentPolicyStatements().map((statement) => [statement.Sid, actionsOf(statement)]);
    const documented = agentIamRows().map((row) => [
      /\(`(\w+)`\)/.exec(row.principal)?.[1],
      sorted(row.actions),
    ]);

    // Assess
    expect(synthesized.length).toBeGreaterThanOrEqual(5);
    expect(documented).toEqual(synthesized);
  });

  it("lists every DynamoDB action the synthesized controller role holds on the table", () => {
    // Act
    const synthesized = controllerRoleStatements()
      .flatMap(actionsOf)
      .filter((action) => action.startsWith("dynamodb:"));
    const documented = controllerIamRows()
      .filter((row) => row.principal === "controller")
      .flatMap((row) => row.actions)
      .filter((action) => action.startsWith("dynamodb:"));

    // Assess
    expect(sorted([...new Set(documented)])).toEqual(sorted([...new Set(synthesized)]));
  });

  it("fails when a generated table was edited by hand", () => {
    // Prepare
    const table = IAM_DOC_TABLES.find((candidate) => candidate.file === "docs/ec2.md");
    if (!table) throw new Error("docs/ec2.md has no IAM table declared");
    const text = readFileSync(new URL(table.file, ROOT), "utf8");

    // Act
    const edited = text.replace("`sqs:CreateQueue`, ", "");

    // Assess
    expect(edited).not.toBe(text);
    expect(withIamTable(edited, table)).not.toBe(edited);
  });
});
