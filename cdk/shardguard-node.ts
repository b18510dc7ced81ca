import { Duration } from "aws-cdk-lib";
import * as cloudwatch from "aws-cdk-lib/aws-cloudwatch";
import * as iam from "aws-cdk-lib/aws-iam";
import { Construct } from "constructs";
import { type AgentIdentity, nodeQueueNames } from "./agent-policy.ts";

export interface ShardguardNodeOptions extends AgentIdentity {
  /**
   * Role the node's agent runs as (an EC2 instance role, an ECS task role); the agent policy is
   * attached to it.
   * @default - none: attach `policy` to the agent's role yourself (its ARN is a stack output)
   */
  readonly role?: iam.IRole;
}

/**
 * What a node needs of the controller construct it belongs to (`ShardguardController` is one):
 * declared here so that the node does not import the controller that creates it.
 */
export interface NodeController {
  readonly queuePrefix: string;
  agentPolicyStatements(identity: AgentIdentity): iam.PolicyStatement[];
}

export interface ShardguardNodeProps extends ShardguardNodeOptions {
  readonly controller: NodeController;
  readonly alarmActions: readonly cloudwatch.IAlarmAction[];
}

/** One database node known to the stack: its agent's policy and the alarm on its dead-letter queue. */
export class ShardguardNode extends Construct {
  public readonly shard: string;
  public readonly nodeId: string;
  /** Least-privilege policy of this node's agent (see agent-policy.ts). */
  public readonly policy: iam.ManagedPolicy;
  public readonly queueName: string;
  public readonly deadLetterQueueName: string;
  /** In alarm while the node's dead-letter queue holds a command the agent could not parse. */
  public readonly deadLetterAlarm: cloudwatch.Alarm;

  constructor(scope: Construct, id: string, props: ShardguardNodeProps) {
    super(scope, id);
    this.shard = props.shard;
    this.nodeId = props.node;
    const names = nodeQueueNames(props.controller.queuePrefix, props);
    this.queueName = names.queue;
    this.deadLetterQueueName = names.deadLetterQueue;
    this.policy = new iam.ManagedPolicy(this, "AgentPolicy", {
      description: `Shardguard agent of node ${props.node} in shard ${props.shard}`,
      statements: props.controller.agentPolicyStatements({ shard: props.shard, node: props.node }),
      roles: props.role ? [props.role] : [],
    });
    this.deadLetterAlarm = new cloudwatch.Alarm(this, "DeadLetterAlarm", {
      alarmDescription: `The dead-letter queue of Shardguard node ${props.node} (shard ${props.shard}) is not empty.`,
      metric: this.metricDeadLetterMessages(),
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      // The queue exists only once the agent has started; until then there is nothing to report.
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    });
    for (const action of props.alarmActions) this.deadLetterAlarm.addAlarmAction(action);
  }

  /** Messages waiting in the node's dead-letter queue (SQS publishes it while the queue holds any). */
  public metricDeadLetterMessages(options: cloudwatch.MetricOptions = {}): cloudwatch.Metric {
    return new cloudwatch.Metric({
      namespace: "AWS/SQS",
      metricName: "ApproximateNumberOfMessagesVisible",
      dimensionsMap: { QueueName: this.deadLetterQueueName },
      statistic: "Maximum",
      period: Duration.minutes(5),
      ...options,
    });
  }
}
