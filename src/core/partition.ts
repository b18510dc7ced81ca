import { ConfigurationError } from "./errors.ts";

/**
 * Which of K controller partitions watches a shard: jump consistent hashing (Lamping & Veach,
 * "A Fast, Minimal Memory, Consistent Hash Algorithm", 2014) of the shard id's 64-bit FNV-1a hash.
 * Every shard belongs to exactly one partition; the partitions are balanced; going from K to K+1
 * partitions moves only the shards that land in the new one (about 1/(K+1) of them), so a controller
 * keeps most of its shards when the fleet is re-partitioned. Pure: no clock, no environment.
 *
 * A shard watched by two partitions for a moment (two deployments with different K overlapping)
 * is safe: every action is under the shard's lock with a compare-and-set on the epoch.
 */

/** One controller's slice of the shards: partition `index` of `count` (0 ≤ index < count). */
export interface Partition {
  readonly index: number;
  readonly count: number;
}

const MASK_64 = (1n << 64n) - 1n;
const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
const JUMP_MULTIPLIER = 2862933555777619733n;

/** 64-bit FNV-1a of the UTF-8 bytes of `text`. */
export function fnv1a64(text: string): bigint {
  let hash = FNV_OFFSET;
  for (const byte of new TextEncoder().encode(text)) {
    hash ^= BigInt(byte);
    hash = (hash * FNV_PRIME) & MASK_64;
  }
  return hash;
}

/** Jump consistent hash: the bucket in [0, buckets) of a 64-bit key. */
export function jumpHash(key: bigint, buckets: number): number {
  if (!Number.isInteger(buckets) || buckets < 1)
    throw new RangeError(`buckets must be a positive integer, got ${buckets}`);
  let k = key & MASK_64;
  let b = -1;
  let j = 0;
  while (j < buckets) {
    b = j;
    k = (k * JUMP_MULTIPLIER + 1n) & MASK_64;
    // The reference's double arithmetic, in its order: (b + 1) * (2^31 / ((key >> 33) + 1)).
    j = Math.floor((b + 1) * (2 ** 31 / (Number(k >> 33n) + 1)));
  }
  return b;
}

/** The partition (0 ≤ result < count) whose controller watches `shard`. */
export function partitionOf(shard: string, count: number): number {
  return jumpHash(fnv1a64(shard), count);
}

/** True when `partition` watches `shard`; with no partition (one controller) every shard. */
export function inPartition(shard: string, partition: Partition | undefined): boolean {
  return (
    partition === undefined ||
    partition.count === 1 ||
    partitionOf(shard, partition.count) === partition.index
  );
}

/** Checks a partition given as numbers (configuration, a Lambda event); a sentence for each problem. */
export function validatePartition(partition: Partition): string | undefined {
  if (!Number.isInteger(partition.count) || partition.count < 1) {
    return `partition count must be a positive integer, got ${partition.count}`;
  }
  if (!Number.isInteger(partition.index) || partition.index < 0 || partition.index >= partition.count) {
    return `partition index must be an integer from 0 to ${partition.count - 1}, got ${partition.index}`;
  }
  return undefined;
}

/**
 * The partition a scheduled controller event names (`{ partition: { index, count } }`, the CDK
 * schedule's input); undefined (every shard) when it names none. Throws on a bad one.
 */
export function partitionFromEvent(event: unknown): Partition | undefined {
  const partition = (event as { partition?: unknown } | null)?.partition;
  if (partition === undefined) return undefined;
  const { index, count } = (partition ?? {}) as { index?: unknown; count?: unknown };
  const candidate = { index: Number(index), count: Number(count) };
  const problem = validatePartition(candidate);
  if (problem) throw new ConfigurationError(`scheduled event: ${problem}`);
  return candidate;
}

/** `2/5` -> { index: 2, count: 5 } (the CLI's `--partition`). Throws on a bad one. */
export function parsePartitionText(text: string): Partition {
  const match = /^(\d+)\/(\d+)$/.exec(text.trim());
  if (!match) throw new ConfigurationError(`expected <index>/<count>, e.g. 0/5, got ${text}`);
  const partition = { index: Number(match[1]), count: Number(match[2]) };
  const problem = validatePartition(partition);
  if (problem) throw new ConfigurationError(problem);
  return partition;
}
