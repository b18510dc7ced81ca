import {
  DeleteQueueCommand,
  GetQueueUrlCommand,
  ListQueuesCommand,
  type SQSClient,
} from "@aws-sdk/client-sqs";
import type { Command } from "commander";
import { classifyAwsError } from "../../adapters/aws-errors.ts";
import { queuePrefixFromEnv } from "../../adapters/env.ts";
import { legacyDeadLetterQueueName, QUEUE_NAME_SEPARATOR, queueNames } from "../../adapters/queue-names.ts";
import { wakeQueueName } from "../../adapters/sqs-wake-queue.ts";
import { ShardguardError } from "../../core/errors.ts";
import { withOperatorSession } from "../aws-session.ts";

interface DecommissionOptions {
  readonly shard?: string;
  readonly node?: string;
  readonly allQueues?: boolean;
  readonly json?: boolean;
}

/**
 * Agents create their own queues at run time (docs/deploy.md#queues-agents-create-their-own), so
 * CloudFormation does not know them and `cdk destroy` leaves them: this deletes one retired node's
 * queue (and the node's own dead-letter queue an older release made; never the installation's
 * shared one, which other nodes use), or with --all-queues every queue under the installation's
 * prefix (after `cdk destroy`; the wake queue is the stack's own). Needs sqs:DeleteQueue (and sqs:ListQueues for --all-queues), which no
 * Shardguard role has: run it with administrator credentials.
 */
export function registerDecommission(program: Command): void {
  program
    .command("decommission")
    .description(
      "delete the SQS queues agents created: one retired node's (--shard, --node) or, after cdk destroy, " +
        "every queue under SHARDGUARD_QUEUE_PREFIX (--all-queues); needs sqs:DeleteQueue",
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
      const deleted = await withOperatorSession(
        async ({ aws }) => {
          const sqs = aws.clients.sqs;
          if (options.allQueues) return deleteUnderPrefix(sqs, prefix);
          if (!options.shard || !options.node) throw new ShardguardError("--shard and --node go together");
          const names = queueNames(prefix, options.shard, options.node);
          // Never the installation's shared dead-letter queue; an old installation's own one of the node.
          const legacy = legacyDeadLetterQueueName(prefix, options.shard, options.node);
          const urls = await Promise.all([names.queue, legacy].map((name) => urlOf(sqs, name)));
          return deleteQueues(
            sqs,
            urls.filter((url): url is string => url !== undefined),
          );
          // Deleting queues is an administrator's job (docs/deploy.md), not the operator role's.
        },
        { principal: undefined },
      );
      process.stdout.write(
        options.json
          ? `${JSON.stringify({ deleted })}\n`
          : deleted.length === 0
            ? "no queue to delete\n"
            : deleted.map((name) => `deleted ${name}\n`).join(""),
      );
    });
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
