import { CfnOutput, Stack, type StackProps } from "aws-cdk-lib";
import { SnsAction } from "aws-cdk-lib/aws-cloudwatch-actions";
import * as iam from "aws-cdk-lib/aws-iam";
import * as sns from "aws-cdk-lib/aws-sns";
import type { Construct } from "constructs";
import { ENV } from "../src/adapters/env.ts";
import { ConfigurationError } from "../src/core/errors.ts";
import { agentTimingEnvironment, environmentFileText } from "./agent-environment.ts";
import type { AgentIdentity } from "./agent-policy.ts";
import { ShardguardController, type ShardguardControllerProps } from "./shardguard-controller.ts";

export interface ShardguardStackProps extends StackProps {
  /** Props of the controller construct (alarm actions are derived from `alarmTopicArn`). */
  readonly controller?: Omit<ShardguardControllerProps, "alarmActions">;
  /**
   * Nodes whose agents get a managed policy (its ARN is an output).
   * @default - none
   */
  readonly nodes?: readonly AgentIdentity[];
  /**
   * SNS topic every alarm notifies.
   * @default - alarms without actions
   */
  readonly alarmTopicArn?: string;
}

/**
 * The most `nodes` one stack takes: each is an output (its policy's ARN), and CloudFormation allows
 * 200 outputs a stack, 9 of which are the stack's own. A larger fleet gives the rest of its nodes
 * their policies in another stack (`ShardguardController.addNode` or `grantAgent`, docs/deploy.md).
 */
export const MAX_STACK_NODES = 190;

/** The deployable Shardguard stack: the controller construct plus what operators and agents need to find. */
export class ShardguardStack extends Stack {
  public readonly controller: ShardguardController;
  /** Role operators assume to run `shardguard status/history/switchover/pause/resume`. */
  public readonly operatorRole: iam.Role;

  constructor(scope: Construct, id: string, props: ShardguardStackProps = {}) {
    super(scope, id, props);
    if ((props.nodes?.length ?? 0) > MAX_STACK_NODES) {
      throw new ConfigurationError(
        `nodes: ${props.nodes?.length} entries, but one stack takes at most ${MAX_STACK_NODES} (each is an output; ` +
          "CloudFormation allows 200 a stack): give the rest their policies in another stack with addNode or grantAgent (docs/deploy.md)",
      );
    }
    const alarmActions = props.alarmTopicArn
      ? [new SnsAction(sns.Topic.fromTopicArn(this, "AlarmTopic", props.alarmTopicArn))]
      : [];
    this.controller = new ShardguardController(this, "Shardguard", { ...props.controller, alarmActions });

    this.operatorRole = new iam.Role(this, "OperatorRole", {
      assumedBy: new iam.AccountRootPrincipal(),
      description:
        "Shardguard operators: invoke the controller (switchover, pause, resume), read status and history.",
    });
    this.controller.grantOperatorInvoke(this.operatorRole);

    new CfnOutput(this, "TableName", {
      value: this.controller.table.tableName,
      description: `Coordination table: set ${ENV.table} to it for agents and the CLI`,
    });
    new CfnOutput(this, "QueuePrefix", {
      value: this.controller.queuePrefix,
      description: `Command queue prefix: set ${ENV.queuePrefix} to it for agents`,
    });
    new CfnOutput(this, "AgentEnvironment", {
      value: environmentFileText({
        ...this.controller.agentEnvironment(),
        ...agentTimingEnvironment(this.controller.config),
      }),
      description:
        "Every agent's environment file (systemd EnvironmentFile=): the table, the queue prefix and the controller's timings",
    });
    new CfnOutput(this, "ControllerFunctionName", {
      value: this.controller.controllerFunction.functionName,
      description: "The scheduled controller Lambda (its logs show every cycle)",
    });
    new CfnOutput(this, "OperatorFunctionName", {
      value: this.controller.operatorFunction.functionName,
      description: `Set ${ENV.controllerFunction} to it: the Lambda the CLI invokes for switchover, pause, resume and recover`,
    });
    new CfnOutput(this, "EventBusName", { value: this.controller.eventBus.eventBusName });
    new CfnOutput(this, "OperatorRoleArn", { value: this.operatorRole.roleArn });
    new CfnOutput(this, "OperatorProfile", {
      value: operatorProfile(this.stackName, this.operatorRole.roleArn, this.region),
      description: "Append to ~/.aws/config: the operator profile, with the stack's region",
    });
    if (this.controller.dashboard) {
      new CfnOutput(this, "DashboardName", { value: this.controller.dashboard.dashboardName });
    }
    for (const identity of props.nodes ?? []) {
      const node = this.controller.addNode(identity);
      new CfnOutput(this, `AgentPolicyArn-${identity.shard}-${identity.node}`, {
        value: node.policy.managedPolicyArn,
        description: `Attach to the instance or task role of node ${identity.node} (shard ${identity.shard})`,
      });
    }
  }
}

/**
 * The `~/.aws/config` profile operators use: the operator role, and the stack's region, since the
 * table and the function exist in that region only (without it the CLI fails outside the default
 * region). `source_profile` is where the operator's own credentials come from.
 */
export function operatorProfile(stackName: string, roleArn: string, region: string): string {
  return [
    `[profile ${operatorProfileName(stackName)}]`,
    `role_arn = ${roleArn}`,
    `region = ${region}`,
    "source_profile = default",
  ].join("\n");
}

/** `shardguard-operator` for the default stack, else `<stack name in lower case>-operator`. */
export function operatorProfileName(stackName: string): string {
  return `${stackName.toLowerCase()}-operator`;
}

/** Parses the `nodes` context: "shard:node,shard:node". */
export function parseNodeList(value: string | undefined): AgentIdentity[] {
  if (!value) return [];
  return value
    .split(",")
    .map((entry) => entry.trim())
    .filter((entry) => entry.length > 0)
    .map((entry) => {
      const [shard, node, ...rest] = entry.split(":");
      if (!shard || !node || rest.length > 0) {
        throw new ConfigurationError(`nodes: "${entry}" must be shard:node`);
      }
      return { shard, node };
    });
}
