/**
 * The controller function's memory, sized by measurement when the fleet's size is known. Lambda
 * gives CPU in proportion to memory (1,769 MB = one vCPU), and a controller pass is CPU work: about
 * 8 ms plus 0.594 ms per shard (`npm run bench:scale`, bench/results/scale-1-10-100.json and
 * scale-100-1000-5000.json, an upper bound: it includes DynamoDB Local's loopback sends). The
 * smallest size whose modeled pass over one partition's shards stays within 700 ms of the 1 s tick,
 * and whose memory holds the measured resident size (86 MB for one shard, + 13.1 MB per 1,000
 * shards, + 15%), is the default. docs/cost.md has the table.
 */

export const MEASURED = {
  cpuFixedMs: 8,
  cpuPerShardMs: 0.594,
  residentMb: 86,
  residentPerShardMb: 0.0131,
} as const;

const SIZES_MB = [128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1769] as const;
const ONE_VCPU_MB = 1769;
const PASS_BUDGET_MS = 700;
const CONCURRENCY = 32;
const DYNAMO_ROUND_TRIP_MS = 5;
/** Without a shard count: the size the construct always had (about 300 shards, docs/cost.md). */
export const UNSIZED_DEFAULT_MB = 512;

/** Modeled pass over `shards` on a function of `memoryMb`, in ms. */
export function modeledPassMs(shards: number, memoryMb: number): number {
  const cpu = MEASURED.cpuFixedMs + MEASURED.cpuPerShardMs * shards;
  return cpu / Math.min(1, memoryMb / ONE_VCPU_MB) + Math.ceil(shards / CONCURRENCY) * DYNAMO_ROUND_TRIP_MS;
}

/**
 * The default memory for a controller partition watching `shards / partitions` shards; 512 MB when
 * the shard count is not given. A fleet too large for one vCPU per partition gets the largest size
 * listed (one vCPU: a single-threaded loop gains nothing above it), and the pass stays above the
 * budget: more partitions are the answer (docs/cost.md).
 */
export function defaultControllerMemoryMb(shards: number | undefined, partitions = 1): number {
  if (shards === undefined) return UNSIZED_DEFAULT_MB;
  const perPartition = Math.ceil(shards / Math.max(1, partitions));
  const resident = (MEASURED.residentMb + MEASURED.residentPerShardMb * perPartition) * 1.15;
  for (const size of SIZES_MB) {
    if (size >= resident && modeledPassMs(perPartition, size) <= PASS_BUDGET_MS) return size;
  }
  return SIZES_MB[SIZES_MB.length - 1] as number;
}
