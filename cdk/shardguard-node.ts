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
}

/**
 * One database node known to the stack: its agent's policy. What its agent cannot parse lands in
 * the installation's shared dead-letter queue, which the controller's alarms watch (one alarm for
 * every node: docs/cost.md).
 */
export class ShardguardNode extends Construct {
  public readonly shard: string;
  public readonly nodeId: string;
  /** Least-privilege policy of this node's agent (see agent-policy.ts). */
  public readonly policy: iam.ManagedPolicy;
  public readonly queueName: string;
  /** The installation's shared dead-letter queue (`<prefix>_dlq`). */
  public readonly deadLetterQueueName: string;

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
  }
}
