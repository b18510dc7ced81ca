import { z } from "zod";
import { ConfigurationError } from "./errors.ts";

export const QUORUM_MODES = ["none", "majority", "all"] as const;
export type QuorumMode = (typeof QUORUM_MODES)[number];

/**
 * Failover timing and policy. Every duration is in milliseconds; the defaults are the starting
 * values of docs/ARCHITECTURE.md and are tuned by `npm run bench:failover`.
 */
export const failoverConfigSchema = z
  .object({
    /** How often each agent checks its database (its cycle; it writes on a change, in doubt, and at its keepalive). */
    heartbeatIntervalMs: z.number().int().min(100).default(1000),
    /** A primary whose heartbeat is older than this is stale. */
    failureTimeoutMs: z.number().int().min(200).default(3000),
    /**
     * A primary that cannot write its heartbeat for this long fences itself (policy `fence`). Above
     * the primary's keepalive (2 s by default: it writes every other cycle), below the failure timeout.
     */
    fenceTimeoutMs: z.number().int().min(100).default(2500),
    /** Pause between two controller passes over all shards. */
    tickIntervalMs: z.number().int().min(100).default(1000),
    /** Lease of the failover lock; a crashed orchestrator's lock is taken over after it. */
    lockLeaseMs: z.number().int().min(1000).default(60_000),
    /** A replica further behind the old primary than this (replication offset bytes) is not promoted. */
    maxLagOnFailover: z
      .number()
      .int()
      .min(0)
      .default(1024 * 1024),
    /** How many fresh replicas must report their link to the primary down before a failover. */
    quorum: z.enum(QUORUM_MODES).default("majority"),
    /** No automatic failover for this long after one completed, unless the primary's own agent confirms its database died. */
    cooldownMs: z
      .number()
      .int()
      .min(0)
      .default(5 * 60_000),
  })
  .superRefine(checkTimings);

export type FailoverConfig = z.output<typeof failoverConfigSchema>;
export type FailoverConfigInput = z.input<typeof failoverConfigSchema>;

/**
 * Formats zod issues as "field: reason; field: reason". A message may name another setting as
 * `{key}` (a cross-field check); `name` spells both that and the field (a flag, a variable), by
 * default as the key itself.
 */
export function describeIssues(
  error: z.ZodError | readonly z.core.$ZodIssue[],
  name: (key: string) => string = (key) => key,
): string {
  const issues = "issues" in error ? error.issues : error;
  return issues
    .map((issue) => {
      const message = issue.message.replace(/\{(\w+)\}/g, (_, key: string) => name(key));
      if (issue.path.length === 0) return `(root): ${message}`;
      const [first, ...rest] = issue.path.map(String);
      return `${[name(first as string), ...rest].join(".")}: ${message}`;
    })
    .join("; ");
}

/**
 * The timing rules every component that reads the timings checks: a failure timeout above the
 * heartbeat interval, and a fence timeout below the failure timeout.
 */
export function checkTimings(
  config: {
    readonly heartbeatIntervalMs: number;
    readonly failureTimeoutMs: number;
    readonly fenceTimeoutMs: number;
  },
  ctx: z.RefinementCtx,
): void {
  if (config.failureTimeoutMs <= config.heartbeatIntervalMs) {
    ctx.addIssue({
      code: "custom",
      path: ["failureTimeoutMs"],
      message: `must be greater than {heartbeatIntervalMs} (${config.heartbeatIntervalMs} ms)`,
    });
  }
  if (config.fenceTimeoutMs >= config.failureTimeoutMs) {
    ctx.addIssue({
      code: "custom",
      path: ["fenceTimeoutMs"],
      message: `must be less than {failureTimeoutMs} (${config.failureTimeoutMs} ms) so a cut-off primary fences before it is replaced`,
    });
  }
}

/** Validates a configuration, reporting every bad field at once. */
export function parseFailoverConfig(input: FailoverConfigInput = {}): FailoverConfig {
  const result = failoverConfigSchema.safeParse(input);
  if (!result.success) throw new ConfigurationError(`invalid configuration: ${describeIssues(result.error)}`);
  return result.data;
}

export const DEFAULT_CONFIG: FailoverConfig = parseFailoverConfig();

/**
 * The agents' keepalives (the longest an agent goes without writing its heartbeat while nothing it
 * reports changes) as given, or derived from the cycle and the fence timeout: a primary every other
 * cycle but below the fence timeout by half a cycle, a quiet replica every 20 cycles.
 */
export function keepalives(options: {
  readonly heartbeatIntervalMs: number;
  readonly fenceTimeoutMs: number;
  readonly primaryKeepaliveMs?: number | undefined;
  readonly replicaKeepaliveMs?: number | undefined;
}): { primaryKeepaliveMs: number; replicaKeepaliveMs: number } {
  const cycle = options.heartbeatIntervalMs;
  const primaryKeepaliveMs =
    options.primaryKeepaliveMs ??
    Math.max(cycle, Math.min(2 * cycle, Math.floor(options.fenceTimeoutMs - cycle / 2)));
  return { primaryKeepaliveMs, replicaKeepaliveMs: options.replicaKeepaliveMs ?? 20 * cycle };
}
