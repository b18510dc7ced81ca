import { z } from "zod";
import { idSchema } from "./model.ts";

/**
 * Controller wake-ups (docs/controller.md#controller-wake-ups): an agent that wrote a heartbeat the
 * crash fast path may act on tells the controller at once instead of waiting for its next tick.
 * A wake-up is only a hint: it names a shard to look at now; the decision still comes from the
 * snapshot, and a lost wake-up costs at most one tick (the periodic scan stays).
 */

export const WAKE_REASONS = ["crash", "link_down", "probe"] as const;

export const wakeSchema = z.object({
  shard: idSchema,
  node: idSchema,
  /**
   * `crash`: the primary's agent wrote a confirmed crash report; `link_down`: a replica lost its
   * primary; `probe`: a replica's probe of its primary got no good answer (hung, fenced, restarted).
   */
  reason: z.enum(WAKE_REASONS),
  /** ms (AWS-aligned) when the agent sent it: the receiver measures the delivery latency. */
  sent_at: z.number().int(),
});
export type Wake = z.output<typeof wakeSchema>;

export interface WakeSender {
  /** Best effort: resolves false (never throws) when the queue is missing or unreachable. */
  send(wake: Wake): Promise<boolean>;
}

export interface WakeReceiver {
  /** Long-polls up to `waitSeconds`; received wake-ups are deleted at once (they are hints). */
  receive(waitSeconds: number, signal?: AbortSignal): Promise<Wake[]>;
}

/**
 * What a flood of wake-ups may cost (Guarantee 6: no input from the network can stall the controller
 * or run up its reads). Anyone whose role may send to the wake queue (every agent) can name any shard:
 * - a shard the shard index does not list gets no cycle (an index listing is cached; a wake naming an
 *   unknown shard refreshes it at most once per `indexMaxAgeMs`);
 * - at most `maxShards` distinct shards get a cycle per batch, the rest are dropped (a dropped
 *   wake-up costs at most a tick: the periodic pass stays);
 * - a shard's woken cycles start at least `minIntervalMs` apart (later ones wait; repeated ones
 *   coalesce into one), so one shard named a thousand times a second costs 1000 / minIntervalMs
 *   cycles a second at most.
 */
export interface WakeLimits {
  readonly maxShards: number;
  readonly minIntervalMs: number;
  readonly indexMaxAgeMs: number;
}

/** The defaults, for a tick of `tickIntervalMs`: a woken shard at most ten times a tick (a wait of at most a tenth of a tick on the crash fast path). */
export function wakeLimits(tickIntervalMs: number, concurrency: number): WakeLimits {
  return {
    maxShards: concurrency,
    minIntervalMs: Math.max(1, Math.floor(tickIntervalMs / 10)),
    indexMaxAgeMs: Math.max(30_000, 30 * tickIntervalMs),
  };
}

export interface ScreenedWakes {
  /** Distinct shards to cycle, in order of first mention. */
  readonly shards: readonly string[];
  /** Distinct shards named that the index does not list. */
  readonly unknown: readonly string[];
  /** Distinct listed shards dropped past `maxShards`. */
  readonly overCap: readonly string[];
}

/**
 * Which shards a batch of wake-ups may cycle. `known`: the shard ids of the last index listing,
 * undefined when none succeeded (then every shard counts as listed, still capped: the store is what
 * the cycles would fail on too).
 */
export function screenWakes(
  wakes: readonly Wake[],
  known: ReadonlySet<string> | undefined,
  limits: Pick<WakeLimits, "maxShards">,
): ScreenedWakes {
  const shards: string[] = [];
  const unknown: string[] = [];
  const overCap: string[] = [];
  const seen = new Set<string>();
  for (const { shard } of wakes) {
    if (seen.has(shard)) continue;
    seen.add(shard);
    if (known !== undefined && !known.has(shard)) unknown.push(shard);
    else if (shards.length >= limits.maxShards) overCap.push(shard);
    else shards.push(shard);
  }
  return { shards, unknown, overCap };
}

/** How long a woken cycle waits so that it starts `minIntervalMs` after the shard's last one. */
export function wokenCycleDelay(
  lastStartedAt: number | undefined,
  now: number,
  minIntervalMs: number,
): number {
  if (lastStartedAt === undefined) return 0;
  return Math.max(0, lastStartedAt + minIntervalMs - now);
}

/** Whether a wake naming a shard missing from a listing taken at `listedAt` may list the index again. */
export function indexListingStale(listedAt: number | undefined, now: number, maxAgeMs: number): boolean {
  return listedAt === undefined || now - listedAt >= maxAgeMs;
}
