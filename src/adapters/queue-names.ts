import { createHash } from "node:crypto";
import { z } from "zod";
import { ConfigurationError } from "../core/errors.ts";
import { idSchema } from "../core/model.ts";

/** SQS allows 80 characters of letters, digits, `-` and `_` in a queue name. */
export const SQS_QUEUE_NAME_MAX = 80;
/**
 * Separates prefix, shard and node in a queue name. Neither prefixes nor ids may contain it, so
 * names never collide and one installation's `<prefix>_*` never matches another's queues.
 */
export const QUEUE_NAME_SEPARATOR = "_";
export const QUEUE_PREFIX_MAX = 20;
export const QUEUE_PREFIX_PATTERN = /^[A-Za-z0-9-]{1,20}$/;
export const QUEUE_PREFIX_RULE = `must be 1-${QUEUE_PREFIX_MAX} letters, digits or '-' ('${QUEUE_NAME_SEPARATOR}' separates prefix, shard and node in queue names)`;
/** The queue prefix as the agent's options and the construct validate it. */
export const queuePrefixSchema = z.string().regex(QUEUE_PREFIX_PATTERN, QUEUE_PREFIX_RULE);
export const DLQ_SUFFIX = "_dlq";

/** Room for the senders of a large installation, well within SQS's 20,480-byte queue policy. */
export const MAX_COMMAND_SENDERS = 50;
/** An IAM principal's ARN as `aws:PrincipalArn` carries it (a role's, not its session's); `*` and `?` match as in `ArnLike`. */
const PRINCIPAL_ARN = /^arn:aws[a-z-]*:(iam|sts)::(\d{12}|\*):[\w+=,.@/*?-]+$/;

/** Why `senders` cannot be the principals a node's queue policy lets send, or undefined when it can. */
export function checkCommandSenders(senders: readonly string[]): string | undefined {
  if (senders.length > MAX_COMMAND_SENDERS)
    return `at most ${MAX_COMMAND_SENDERS} ARNs, got ${senders.length}`;
  const bad = senders.filter((arn) => !PRINCIPAL_ARN.test(arn));
  if (bad.length === 0) return undefined;
  return `${bad.map((arn) => JSON.stringify(arn)).join(", ")}: not an IAM role or user ARN (arn:aws:iam::<account>:role/<name>)`;
}

/**
 * The principals that may send commands, as a setting gives them: a comma-separated string (a
 * flag, a variable) or a list (a config file, an in-process caller).
 */
export const commandSendersSchema = z
  .union([z.string(), z.array(z.string())])
  .transform((value) =>
    (typeof value === "string" ? value.split(",") : value).map((arn) => arn.trim()).filter(Boolean),
  )
  .superRefine((senders, ctx) => {
    const problem = checkCommandSenders(senders);
    if (problem) ctx.addIssue({ code: "custom", message: problem });
  });

export interface QueueNames {
  readonly queue: string;
  /** The installation's one dead-letter queue, shared by every node queue (`deadLetterQueueName`). */
  readonly deadLetterQueue: string;
}

export function validateQueuePrefix(prefix: string): void {
  if (!QUEUE_PREFIX_PATTERN.test(prefix)) {
    throw new ConfigurationError(
      `invalid queue prefix "${prefix}": ${QUEUE_PREFIX_RULE} (SHARDGUARD_QUEUE_PREFIX)`,
    );
  }
}

/**
 * The queue prefix of an installation whose stack is `stackName`. A CloudFormation stack name is
 * letters, digits and '-', so a name of up to 20 characters is the prefix as it is
 * (`Shardguard-Staging`); a longer one is cut to 13 characters and ends in '-' and 6 hex digits of
 * its hash, so distinct stacks get distinct prefixes.
 */
export function defaultQueuePrefix(stackName: string): string {
  const cleaned = stackName.replace(/[^A-Za-z0-9-]/g, "-");
  if (cleaned === stackName && QUEUE_PREFIX_PATTERN.test(cleaned)) return cleaned;
  const hash = createHash("sha256").update(stackName).digest("hex").slice(0, 6);
  return `${cleaned.slice(0, QUEUE_PREFIX_MAX - 7)}-${hash}`;
}

/**
 * The installation's dead-letter queue, `<prefix>_dlq`: every node queue sends what its agent could
 * not parse there, so one alarm watches them all (a per-node alarm cost $0.10 a node a month:
 * docs/cost.md). One separator: no node queue (`<prefix>_<shard>_<node>`) is named so.
 */
export function deadLetterQueueName(prefix: string): string {
  validateQueuePrefix(prefix);
  return `${prefix}${DLQ_SUFFIX}`;
}

/**
 * A node's own dead-letter queue as installations before the shared one created it; only
 * `shardguard decommission` still looks for it.
 */
export function legacyDeadLetterQueueName(prefix: string, shard: string, nodeId: string): string {
  return `${queueNames(prefix, shard, nodeId).queue}${DLQ_SUFFIX}`;
}

/**
 * `<prefix>_<shard>_<node>`, and the installation's dead-letter queue. With a prefix of at most 20
 * and ids of at most 24 characters the longest name is 20+1+24+1+24 = 70, within SQS's 80.
 */
export function queueNames(prefix: string, shard: string, nodeId: string): QueueNames {
  validateQueuePrefix(prefix);
  for (const [what, value] of [
    ["shard id", shard],
    ["node id", nodeId],
  ] as const) {
    const result = idSchema.safeParse(value);
    if (!result.success) {
      throw new ConfigurationError(`invalid ${what} "${value}": ${result.error.issues[0]?.message}`);
    }
  }
  const queue = [prefix, shard, nodeId].join(QUEUE_NAME_SEPARATOR);
  return { queue, deadLetterQueue: deadLetterQueueName(prefix) };
}

/** Every node queue under `prefix` (an IAM resource pattern for the controller). */
export function queueNamePattern(prefix: string): string {
  validateQueuePrefix(prefix);
  return `${prefix}${QUEUE_NAME_SEPARATOR}*`;
}
