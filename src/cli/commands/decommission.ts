import {
  DeleteQueueCommand,
  GetQueueUrlCommand,
  ListQueuesCommand,
  type SQSClient,
} from "@aws-sdk/client-sqs";
import type { Command } from "commander";
import type { AwsAdapters } from "../../adapters/aws-adapters.ts";
import { classifyAwsError } from "../../adapters/aws-errors.ts";
import { DynamoHeartbeatStore, type NodeRetirement } from "../../adapters/dynamo-coordination-store.ts";
import { queuePrefixFromEnv, tableNameFromEnv } from "../../adapters/env.ts";
import { silentLogger } from "../../adapters/observability.ts";
import { legacyDeadLetterQueueName, QUEUE_NAME_SEPARATOR, queueNames } from "../../adapters/queue-names.ts";
import { wakeQueueName } from "../../adapters/sqs-wake-queue.ts";
import type { FailoverConfig } from "../../core/config.ts";
import { ShardguardError } from "../../core/errors.ts";
import { agentAgeMs, agentWrittenAt, isReportCurrent, reportWindowMs } from "../../core/freshness.ts";
import type { ShardSnapshot } from "../../core/ports.ts";
import { withOperatorSession } from "../aws-session.ts";

/** `decommission` would retire a node the shard still needs or whose agent still runs: nothing was changed. */
export class DecommissionRefused extends ShardguardError {
  override name = "DecommissionRefused";
}

interface DecommissionOptions {
  readonly shard?: string;
  readonly node?: string;
  readonly allQueues?: boolean;
  readonly json?: boolean;
}

/**
 * Retires a node for good, or after `cdk destroy` deletes every queue of the installation.
 *
 * `--shard S --node N`: first the store, in one conditional transaction (`retireNode`,
 * src/adapters/dynamo-coordination-store.ts): N's heartbeat, replica set and member item, and N's id
 * from every other node's stored replica set, so that no failover waits for a node the operator
 * retired (gate `member_unheard` would wait for good: a retired node's agent never reports again;
 * nemesis seed 2905) and no controller keeps it in its snapshots until the heartbeat's TTL. Refused,
 * with nothing changed, while N's agent is heard (its report current: a running agent would write
 * its heartbeat again and its primary's agent add it back), while N is the topology's primary, the
 * old primary or the target of a failover under way, or the old primary an offline shard's lineage
 * names (their reports and sets are what the controller's gates judge), and in a shard not migrated
 * to node partitions. There is no override: every refusal ends by itself (the report lapses within
 * its keepalive plus the failure timeout) or after an operator's step (drain, a failover's end,
 * recover, migrate-layout). Then N's queue (and the node's own dead-letter queue an older release
 * made; never the installation's shared one, which other nodes use).
 *
 * `--all-queues`: every queue under the installation's prefix (after `cdk destroy`; the wake queue
 * is the stack's own). Agents create their own queues at run time
 * (docs/deploy.md#queues-agents-create-their-own), so CloudFormation does not know them.
 *
 * Needs sqs:DeleteQueue (and sqs:ListQueues for --all-queues), and writes to every node's partition
 * of the shard, which no Shardguard role may: run it with administrator credentials.
 */
export function registerDecommission(program: Command): void {
  program
    .command("decommission")
    .description(
      "retire a node for good (--shard, --node): its heartbeat, replica set and member item, its id in every " +
        "other node's stored replica set, and its SQS queue; refused, with no override, while its agent is heard " +
        "(stop its agent and redis-server first; its last report lapses within its keepalive plus the failure " +
        "timeout), while it is the primary (drain it first), the old primary or target of a failover under way, " +
        "or the old primary of an offline shard (recover first), and in a shard not migrated (migrate-layout first). " +
        "Or, after cdk destroy, delete every queue under " +
        "SHARDGUARD_QUEUE_PREFIX (--all-queues). Administrator credentials (sqs:DeleteQueue, every node's partition)",
    )
    .option("--shard <id>", "the node's shard")
    .option("--node <id>", "the retired node")
    .option("--all-queues", "every queue of this installation: <prefix>_*")
    .option("--json", "machine-readable result")
    .action(async (options: DecommissionOptions) => {
      const prefix = queuePrefixFromEnv(process.env);
      if (options.allQueues === (options.shard !== undefined || options.node !== undefined)) {
        throw new ShardguardError("give either --shard and --node, or --all-queues");
      }
      const result = await withOperatorSession(
        async ({ aws, config }) => {
          const sqs = aws.clients.sqs;
          if (options.allQueues) return { deleted: await deleteUnderPrefix(sqs, prefix) };
          if (!options.shard || !options.node) throw new ShardguardError("--shard and --node go together");
          const retired = await retireFromStore(aws, config, options.shard, options.node);
          const names = queueNames(prefix, options.shard, options.node);
          // Never the installation's shared dead-letter queue; an old installation's own one of the node.
          const legacy = legacyDeadLetterQueueName(prefix, options.shard, options.node);
          const urls = await Promise.all([names.queue, legacy].map((name) => urlOf(sqs, name)));
          const deleted = await deleteQueues(
            sqs,
            urls.filter((url): url is string => url !== undefined),
          );
          return { retired, deleted };
          // Deleting queues and other nodes' items is an administrator's job (docs/deploy.md), not the operator role's.
        },
        { principal: undefined },
      );
      process.stdout.write(
        options.json ? `${JSON.stringify(result)}\n` : describeResult(options.node, result),
      );
    });
}

interface Retired {
  readonly node: string;
  /** A heartbeat of the node was stored (and deleted). */
  readonly heartbeat: boolean;
  /** The primaries whose stored replica set listed the node (it no longer does). */
  readonly replicaSets: readonly string[];
}

function describeResult(
  node: string | undefined,
  result: { readonly retired?: Retired; readonly deleted: readonly string[] },
): string {
  const lines: string[] = [];
  if (result.retired?.heartbeat) lines.push(`deleted the heartbeat and member items of ${node}`);
  for (const primary of result.retired?.replicaSets ?? [])
    lines.push(`removed ${node} from the replica set of ${primary}`);
  lines.push(...result.deleted.map((name) => `deleted ${name}`));
  if (lines.length === 0) lines.push("no queue to delete");
  return lines.map((line) => `${line}\n`).join("");
}

/** Attempts of the store's retirement whose conditions found the shard changed since it was read. */
const RETIRE_ATTEMPTS = 3;

/** Reads the shard, judges the refusals, and retires the node in one transaction conditioned on that read. */
async function retireFromStore(
  aws: AwsAdapters,
  config: FailoverConfig,
  shard: string,
  node: string,
): Promise<Retired> {
  const store = new DynamoHeartbeatStore({
    documents: aws.clients.documents,
    tableName: tableNameFromEnv(process.env),
    clock: aws.clock,
    logger: silentLogger,
  });
  for (let attempt = 1; ; attempt++) {
    const snapshot = await store.snapshot(shard);
    const refusal = retirementRefusal(snapshot, node, config, aws.clock.now());
    if (refusal !== undefined) throw new DecommissionRefused(`refused: ${refusal}`);
    const judged = retirementOf(snapshot, node);
    if (await store.retireNode(shard, node, judged)) {
      return {
        node,
        heartbeat: judged.heartbeatWrittenAt !== undefined,
        replicaSets: judged.replicaSets.map((set) => set.primary),
      };
    }
    if (attempt >= RETIRE_ATTEMPTS) {
      throw new ShardguardError(
        `shard ${shard} changed under the decommission of ${node} ${RETIRE_ATTEMPTS} times (a heartbeat, a replica set or the topology): nothing was changed; run it again`,
      );
    }
  }
}

/**
 * Why `node` may not be retired now, in one line; undefined when it may. Judged on one snapshot
 * (the store's transaction then requires the shard unchanged since).
 */
export function retirementRefusal(
  snapshot: ShardSnapshot,
  node: string,
  config: FailoverConfig,
  now: number,
): string | undefined {
  const shard = snapshot.shard;
  if (snapshot.legacyTopology) {
    return `shard ${shard} is in the older layout (its nodes write the shard partition): upgrade its agents and run shardguard migrate-layout --shard ${shard} first`;
  }
  const topology = snapshot.topology;
  const failover = topology?.status === "failing_over" ? topology.failover : undefined;
  if (failover?.new_primary_node_id === node || failover?.old_primary_node_id === node) {
    const role = failover.new_primary_node_id === node ? "target" : "old primary";
    return `${node} is the ${role} of the ${failover.kind} under way in shard ${shard} (epoch ${topology?.epoch}); run this again once shardguard status shows the shard online`;
  }
  if (topology?.primary_node_id === node) {
    return `${node} is the primary of shard ${shard}; drain it first (shardguard drain switches over to another node), then stop its agent and redis-server and decommission it`;
  }
  if (topology?.status === "offline" && topology.lineage?.node_id === node) {
    return `${node} is the old primary of offline shard ${shard} (the controller's gates judge its last report and replica set); bring the shard back first (shardguard recover), then decommission it`;
  }
  const heartbeat = snapshot.nodes.find((candidate) => candidate.node_id === node);
  if (heartbeat !== undefined && isReportCurrent(heartbeat, config, now)) {
    const windowMs = reportWindowMs(heartbeat.keepalive_ms, config);
    return `${node}'s agent reported ${Math.max(0, Math.round(agentAgeMs(heartbeat, now)))} ms ago and its report stands for ${windowMs} ms (its keepalive plus the failure timeout): stop its agent and redis-server for good, then run this again once that passed`;
  }
  return undefined;
}

/** What the retirement is conditioned on: the topology's epoch, the node's heartbeat, the sets listing it. */
export function retirementOf(snapshot: ShardSnapshot, node: string): NodeRetirement {
  const heartbeat = snapshot.nodes.find((candidate) => candidate.node_id === node);
  return {
    epoch: snapshot.topology?.epoch,
    heartbeatWrittenAt: heartbeat === undefined ? undefined : agentWrittenAt(heartbeat),
    replicaSets: Object.entries(snapshot.replicaSets)
      .filter(([primary, members]) => primary !== node && members.includes(node))
      .map(([primary]) => ({ primary, version: snapshot.replicaSetVersions[primary] }))
      .sort((a, b) => a.primary.localeCompare(b.primary)),
  };
}

async function urlOf(sqs: SQSClient, name: string): Promise<string | undefined> {
  try {
    return (await sqs.send(new GetQueueUrlCommand({ QueueName: name }))).QueueUrl;
  } catch (error) {
    // QueueDoesNotExist (JSON protocol) or AWS.SimpleQueueService.NonExistentQueue (query protocol).
    if (classifyAwsError(error) === "missing_resource") return undefined;
    throw error;
  }
}

/**
 * Every node queue whose name starts with `<prefix>_`: prefixes hold no '_', so no other
 * installation's queue starts so.
 */
async function deleteUnderPrefix(sqs: SQSClient, prefix: string): Promise<string[]> {
  const urls: string[] = [];
  let NextToken: string | undefined;
  do {
    const page = await sqs.send(
      new ListQueuesCommand({
        QueueNamePrefix: `${prefix}${QUEUE_NAME_SEPARATOR}`,
        MaxResults: 1000,
        NextToken,
      }),
    );
    urls.push(...(page.QueueUrls ?? []));
    NextToken = page.NextToken;
  } while (NextToken);
  // Exact prefix matches only; the wake queue belongs to the stack (CloudFormation deletes it).
  return deleteQueues(
    sqs,
    urls.filter(
      (url) =>
        nameOf(url).startsWith(`${prefix}${QUEUE_NAME_SEPARATOR}`) && nameOf(url) !== wakeQueueName(prefix),
    ),
  );
}

async function deleteQueues(sqs: SQSClient, urls: readonly string[]): Promise<string[]> {
  for (const url of urls) await sqs.send(new DeleteQueueCommand({ QueueUrl: url }));
  return urls.map(nameOf).sort();
}

function nameOf(url: string): string {
  return url.split("/").pop() ?? url;
}
