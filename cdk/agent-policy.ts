import { ArnFormat, Stack, Token } from "aws-cdk-lib";
import { PolicyStatement } from "aws-cdk-lib/aws-iam";
import type { IConstruct } from "constructs";
import { type QueueNames, queueNames } from "../src/adapters/queue-names.ts";
import { wakeQueueName } from "../src/adapters/sqs-wake-queue.ts";
import { ConfigurationError } from "../src/core/errors.ts";
import { ID_PATTERN, ID_RULE } from "../src/core/model.ts";
import { keys } from "../src/core/table.ts";

/** One node's agent: the shard it serves and its node id. */
export interface AgentIdentity {
  readonly shard: string;
  readonly node: string;
}

/**
 * Queues are created by the agents themselves, idempotently, under the prefix (the SQS adapter's
 * `ensureQueue`), so the same agent code runs against LocalStack and the local emulator. The construct
 * fixes the naming and what each party may do with it; a new node still needs a deploy, for its
 * policy (`addNode`).
 */
export function nodeQueueNames(queuePrefix: string, identity: AgentIdentity): QueueNames {
  validateIdentity(identity);
  return queueNames(queuePrefix, identity.shard, identity.node);
}

/**
 * The shard partition (`SHARD#<shard>`): Query (the snapshot's membership), GetItem (the topology of
 * the layout before the controller's partition, until `shardguard migrate-layout` moves it), PutItem
 * (its member item, and the shard's registration in the shard index, `keys.registration`),
 * UpdateItem. Every agent of the shard may write here, so readers take nothing
 * from it but member ids in sort keys (keys.shardPk); PutItem and UpdateItem also let agents of the
 * previous release (heartbeats and replica sets here) run through an upgrade. No DeleteItem: no node
 * can unlist a peer.
 */
export const AGENT_SHARD_ACTIONS = [
  "dynamodb:Query",
  "dynamodb:GetItem",
  "dynamodb:PutItem",
  "dynamodb:UpdateItem",
] as const;
/**
 * The node's own partition (`NODE#<shard>#<node>`), the only one of the shard it writes: PutItem (its
 * heartbeat), UpdateItem (ADD/DELETE on its replica set as primary). IAM authorizes a transaction item
 * by item: the replica-set shrink's Update needs UpdateItem here and its topology check
 * ConditionCheckItem on the controller's partition. Proven from recorded calls:
 * test/integration/iam-recorded-calls.test.ts.
 */
export const AGENT_NODE_ACTIONS = ["dynamodb:PutItem", "dynamodb:UpdateItem"] as const;
/** Every node partition of its shard (`NODE#<shard>#*`), read-only: the snapshot's Queries. */
export const AGENT_PEER_ACTIONS = ["dynamodb:Query"] as const;
/**
 * The controller's partition of the agent's shard (`CONTROL#<shard>`: topology and lock), read-only:
 * Query (the snapshot), GetItem (the topology a command is checked against), ConditionCheckItem (the
 * topology check inside the replica-set shrink). No write: only the controller's role changes who is
 * primary (docs/security.md).
 */
export const AGENT_CONTROL_ACTIONS = [
  "dynamodb:Query",
  "dynamodb:GetItem",
  "dynamodb:ConditionCheckItem",
] as const;
/**
 * Idempotent creation of the node's own queue and the installation's shared dead-letter queue
 * (SqsCommandBus.ensureQueue: GetQueueUrl, else CreateQueue for the dead-letter queue, GetQueueAttributes for its ARN and
 * policy, CreateQueue for the queue with its redrive policy, queue policy and SQS-managed encryption), and
 * SetQueueAttributes to bring an existing queue's policy up to date (docs/security.md#commands).
 */
export const AGENT_QUEUE_SETUP_ACTIONS = [
  "sqs:GetQueueUrl",
  "sqs:CreateQueue",
  "sqs:GetQueueAttributes",
  "sqs:SetQueueAttributes",
] as const;
/** Consuming commands from the node's own queue only. */
export const AGENT_QUEUE_CONSUME_ACTIONS = [
  "sqs:ReceiveMessage",
  "sqs:DeleteMessage",
  "sqs:ChangeMessageVisibility",
] as const;

/** Waking the controller after a crash report (SqsWakeQueue.send): look the queue up, send to it. */
export const AGENT_WAKE_ACTIONS = ["sqs:GetQueueUrl", "sqs:SendMessage"] as const;

/** Throws a ConfigurationError naming `shard` or `node` when either is not a valid id. */
export function validateIdentity(identity: AgentIdentity): void {
  const problems: string[] = [];
  for (const field of ["shard", "node"] as const) {
    const value = identity[field];
    if (!Token.isUnresolved(value) && !ID_PATTERN.test(value)) {
      problems.push(`${field}: "${value}" ${ID_RULE}`);
    }
  }
  if (problems.length > 0) throw new ConfigurationError(`Shardguard agent: ${problems.join("; ")}`);
}

export interface AgentPolicyTarget extends AgentIdentity {
  readonly tableArn: string;
  readonly queuePrefix: string;
}

/**
 * The statements of one agent's policy.
 *
 * `dynamodb:LeadingKeys` constrains the partition key only, so what each party writes lives in a
 * partition of its own: the agent writes its heartbeat and replica set in its node's partition
 * (`NODE#<shard>#<node>`) and no other node's, only reads its peers' (`NODE#<shard>#*`) and the
 * controller's (`CONTROL#<shard>`: topology, lock), so one node's credentials can neither name a
 * primary, hold the lock, nor report for a peer (docs/security.md). In the shard partition
 * (`SHARD#<shard>`) it writes its member item, which carries nothing a reader trusts beyond the id,
 * and the shard's registration: the shard index (`SHARD_INDEX`) is a secondary index sorted by the
 * partition key, so the only shard an agent can register is its own; the legacy index partition
 * (`SHARDS`) gets no grant. It cannot touch history (`HISTORY#<shard>`) at all. `ForAllValues` is safe here because no
 * granted action can run without a partition key (no Scan, no batch operations).
 */
export function agentPolicyStatements(scope: IConstruct, target: AgentPolicyTarget): PolicyStatement[] {
  const stack = Stack.of(scope);
  const queueArn = (name: string) =>
    stack.formatArn({ service: "sqs", resource: name, arnFormat: ArnFormat.NO_RESOURCE_NAME });
  const names = nodeQueueNames(target.queuePrefix, target);
  return [
    new PolicyStatement({
      sid: "OwnNodePartition",
      actions: [...AGENT_NODE_ACTIONS],
      resources: [target.tableArn],
      conditions: {
        "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": [keys.nodePk(target.shard, target.node)] },
      },
    }),
    new PolicyStatement({
      sid: "ReadShardNodes",
      actions: [...AGENT_PEER_ACTIONS],
      resources: [target.tableArn],
      conditions: {
        "ForAllValues:StringLike": { "dynamodb:LeadingKeys": [keys.nodePkPattern(target.shard)] },
      },
    }),
    new PolicyStatement({
      sid: "ShardMembership",
      actions: [...AGENT_SHARD_ACTIONS],
      resources: [target.tableArn],
      conditions: {
        "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": [keys.shardPk(target.shard)] },
      },
    }),
    new PolicyStatement({
      sid: "ReadShardControl",
      actions: [...AGENT_CONTROL_ACTIONS],
      resources: [target.tableArn],
      conditions: {
        "ForAllValues:StringEquals": { "dynamodb:LeadingKeys": [keys.controlPk(target.shard)] },
      },
    }),
    new PolicyStatement({
      sid: "CreateOwnQueues",
      actions: [...AGENT_QUEUE_SETUP_ACTIONS],
      // Exact names, not `<queue>*`: node "n1" must not match node "n10"'s queue.
      resources: [queueArn(names.queue), queueArn(names.deadLetterQueue)],
    }),
    new PolicyStatement({
      sid: "ConsumeOwnQueue",
      actions: [...AGENT_QUEUE_CONSUME_ACTIONS],
      resources: [queueArn(names.queue)],
    }),
    new PolicyStatement({
      sid: "WakeController",
      actions: [...AGENT_WAKE_ACTIONS],
      resources: [queueArn(wakeQueueName(target.queuePrefix))],
    }),
  ];
}
