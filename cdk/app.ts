import { App, Validations } from "aws-cdk-lib";
import { AwsSolutionsChecks } from "cdk-nag";
import { parseNodeList, ShardguardStack } from "./shardguard-stack.ts";

/**
 * `npx cdk synth` / `npx cdk deploy`. Context (`-c key=value` or cdk.json):
 *   stackName (default "Shardguard"), tableName (default: CloudFormation names it), queuePrefix
 *   (default: the stack name), nodes ("shard:node,shard:node"), alarmTopicArn, deletionProtection
 *   ("false" to allow deleting the table), controllerEntry. Every physical name derives from the
 *   stack, so two stacks with different names deploy side by side in one account.
 */
const app = new App();
const context = (key: string): string | undefined => {
  const value = app.node.tryGetContext(key);
  return value === undefined || value === "" ? undefined : String(value);
};

new ShardguardStack(app, context("stackName") ?? "Shardguard", {
  description: "Shardguard: serverless automatic failover for Redis-protocol primary/replica shards",
  env: { account: process.env.CDK_DEFAULT_ACCOUNT, region: process.env.CDK_DEFAULT_REGION },
  controller: {
    tableName: context("tableName"),
    queuePrefix: context("queuePrefix"),
    deletionProtection: context("deletionProtection") !== "false",
    controllerEntry: context("controllerEntry"),
  },
  nodes: parseNodeList(context("nodes")),
  alarmTopicArn: context("alarmTopicArn"),
});

// The AwsSolutions pack runs on every synth; a finding that is neither fixed nor acknowledged fails it.
Validations.of(app).addPlugins(new AwsSolutionsChecks(app));
