import { App, Validations } from "aws-cdk-lib";
import { AwsSolutionsChecks } from "cdk-nag";
import { parseNodeList, ShardguardStack } from "./shardguard-stack.ts";

/**
 * `npx cdk synth` / `npx cdk deploy`. Context (`-c key=value` or cdk.json):
 *   stackName (default "Shardguard"), tableName (default: CloudFormation names it), queuePrefix
 *   (default: the stack name), nodes ("shard:node,shard:node"), alarmTopicArn, deletionProtection
 *   ("false" to allow deleting the table), controllerEntry, billingMode ("on-demand" or
 *   "provisioned"), shards, nodesPerShard and partitions (sizing: docs/cost.md), dashboard ("false"
 *   for none). Every physical name derives from the stack, so two stacks with different names
 *   deploy side by side in one account.
 */
const app = new App();
const context = (key: string): string | undefined => {
  const value = app.node.tryGetContext(key);
  return value === undefined || value === "" ? undefined : String(value);
};
/** A whole-number context value; anything else fails the synth naming the key. */
const count = (key: string): number | undefined => {
  const value = context(key);
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value)) throw new Error(`context ${key}: "${value}" is not a whole number`);
  return Number(value);
};

new ShardguardStack(app, context("stackName") ?? "Shardguard", {
  description: "Shardguard: serverless automatic failover for Redis-protocol primary/replica shards",
  env: { account: process.env.CDK_DEFAULT_ACCOUNT, region: process.env.CDK_DEFAULT_REGION },
  controller: {
    tableName: context("tableName"),
    queuePrefix: context("queuePrefix"),
    deletionProtection: context("deletionProtection") !== "false",
    controllerEntry: context("controllerEntry"),
    billingMode: context("billingMode") as "on-demand" | "provisioned" | undefined,
    shards: count("shards"),
    nodesPerShard: count("nodesPerShard"),
    partitions: count("partitions"),
    dashboard: context("dashboard") !== "false",
  },
  nodes: parseNodeList(context("nodes")),
  alarmTopicArn: context("alarmTopicArn"),
});

// The AwsSolutions pack runs on every synth; a finding that is neither fixed nor acknowledged fails it.
Validations.of(app).addPlugins(new AwsSolutionsChecks(app));
