import { Template } from "aws-cdk-lib/assertions";
import { describe, expect, it } from "vitest";
import { MAX_STACK_NODES, ShardguardStack } from "../../cdk/shardguard-stack.ts";
import { ConfigurationError } from "../../src/core/errors.ts";
import { cdkApp } from "../fixtures/cdk-app.ts";

/**
 * One stack's `nodes` limit: each node is an output, CloudFormation allows 200 a stack. A fresh-clone
 * CI run synthesized 201 outputs for the suite's agents (the IAM check) and CDK refused the template;
 * a deployment would fail the same way, later. Now synth says so for more than MAX_STACK_NODES.
 */

function nodes(count: number) {
  return Array.from({ length: count }, (_, index) => ({ shard: "orders", node: `n${index}` }));
}

describe("the stack's nodes limit", () => {
  // 190 node policies take about 5 s to synthesize on this machine, longer under the suite's load.
  it("synthesizes MAX_STACK_NODES nodes within CloudFormation's 200 outputs", { timeout: 60_000 }, () => {
    // Act
    const stack = new ShardguardStack(cdkApp({ bundle: false }), "Shardguard", {
      nodes: nodes(MAX_STACK_NODES),
    });
    const outputs = Object.keys(Template.fromStack(stack).toJSON().Outputs ?? {});
    // Assess
    expect(outputs.length).toBeLessThanOrEqual(200);
    expect(outputs.filter((name) => name.startsWith("AgentPolicyArn")).length).toBe(MAX_STACK_NODES);
  });

  it("refuses one node more with the limit and the way out in the message", () => {
    // Act
    const build = () =>
      new ShardguardStack(cdkApp({ bundle: false }), "Shardguard", { nodes: nodes(MAX_STACK_NODES + 1) });
    // Assess
    expect(build).toThrow(ConfigurationError);
    expect(build).toThrow(/at most 190 .*addNode or grantAgent/);
  });
});
