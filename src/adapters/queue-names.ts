import { ConfigurationError } from "../core/errors.ts";
import { idSchema } from "../core/model.ts";

/** SQS allows 80 characters of letters, digits, `-` and `_` in a queue name. */
export const SQS_QUEUE_NAME_MAX = 80;
export const QUEUE_PREFIX_PATTERN = /^[A-Za-z0-9_-]{1,20}$/;
/** Separates prefix, shard and node in a queue name; ids cannot contain it, so names never collide. */
export const QUEUE_NAME_SEPARATOR = "_";
export const DLQ_SUFFIX = "_dlq";

export interface QueueNames {
  readonly queue: string;
  readonly deadLetterQueue: string;
}

export function validateQueuePrefix(prefix: string): void {
  if (!QUEUE_PREFIX_PATTERN.test(prefix)) {
    throw new ConfigurationError(
      `invalid queue prefix "${prefix}": must be 1-20 letters, digits, '-' or '_' (SHARDGUARD_QUEUE_PREFIX)`,
    );
  }
}

/**
 * `<prefix>_<shard>_<node>` and `<prefix>_<shard>_<node>_dlq`. With a prefix of at most 20 and ids
 * of at most 24 characters the longest name is 20+1+24+1+24+4 = 74, within SQS's 80.
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
  return { queue, deadLetterQueue: `${queue}${DLQ_SUFFIX}` };
}

/** Every node queue under `prefix` (an IAM resource pattern for the controller). */
export function queueNamePattern(prefix: string): string {
  validateQueuePrefix(prefix);
  return `${prefix}${QUEUE_NAME_SEPARATOR}*`;
}
