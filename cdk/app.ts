import { App, Validations } from "aws-cdk-lib";
import { AwsSolutionsChecks } from "cdk-nag";
import { DEFAULT_TABLE_NAME } from "../src/core/table.ts";
import { parseNodeList, ShardguardStack } from "./shardguard-stack.ts";

/**
 * `npx cdk synth` / `npx cdk deploy`. Context (`-c key=value` or cdk.json):
 *   tableName (default "shardguard"), queuePrefix, nodes ("shard:node,shard:node"),
 *   alarmTopicArn, deletionProtection ("false" to allow deleting the table), controllerEntry.
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
    tableName: context("tableName") ?? DEFAULT_TABLE_NAME,
    queuePrefix: context("queuePrefix"),
    deletionProtection: context("deletionProtection") !== "false",
    controllerEntry: context("controllerEntry"),
  },
  nodes: parseNodeList(context("nodes")),
  alarmTopicArn: context("alarmTopicArn"),
});

// The AwsSolutions pack runs on every synth; a finding that is neither fixed nor acknowledged fails it.
Validations.of(app).addPlugins(new AwsSolutionsChecks(app));
