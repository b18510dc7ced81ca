import { Duration } from "aws-cdk-lib";
import * as cloudwatch from "aws-cdk-lib/aws-cloudwatch";
import * as dynamodb from "aws-cdk-lib/aws-dynamodb";
import { DEFAULT_CONFIG, keepalives } from "../src/core/config.ts";
import { ShardguardError } from "../src/core/errors.ts";

/**
 * The coordination table's billing: on-demand (the default) or provisioned capacity sized from
 * the fleet, with auto scaling, and the throttle metric an alarm watches in either mode.
 *
 * Provisioned sizing, from what `npm run bench:cost` measured per shard (docs/cost.md): an agent
 * writes one heartbeat (< 1 KB: 1 write unit) and reads its shard's snapshot (one strongly
 * consistent Query of < 4 KB: 1 read unit) at its keepalive while nothing changes (the primary
 * every 2 s, each replica every 20 s at the defaults); the Lambda controller reads each shard's
 * snapshot and the shard index (eventually consistent, about 50 bytes a shard: 0.5 read units per 100
 * shards or less, counted so per partition) once a minute, and each shard in
 * trouble once a tick (room is left for INCIDENT_SHARDS at once; burst capacity and auto scaling
 * beyond). Auto scaling keeps utilization at 70% between the sized minimum and twice it.
 */

export type TableBillingMode = "on-demand" | "provisioned";

export interface TableCapacityProps {
  /**
   * `on-demand`: pay per request, nothing to size. `provisioned`: capacity sized from `shards`
   * with auto scaling (cheaper for a steady fleet; throttles when the fleet outgrows it, hence
   * the throttle alarm).
   * @default "on-demand"
   */
  readonly billingMode?: TableBillingMode;
  /** Shards the table serves; required for `provisioned`. */
  readonly shards?: number;
  /** Nodes (agents) per shard. @default 3 */
  readonly nodesPerShard?: number;
  /** Controller partitions (each lists the shard index every tick). @default 1 */
  readonly partitions?: number;
}

export interface CapacityRates {
  readonly heartbeatIntervalMs: number;
  readonly fenceTimeoutMs: number;
  readonly tickIntervalMs: number;
  /** The agents' keepalives, when not their defaults (derived from the two above). */
  readonly primaryKeepaliveMs?: number;
  readonly replicaKeepaliveMs?: number;
}

/** Shards the sizing leaves room for in trouble at once: a looping controller reads each every tick. */
export const INCIDENT_SHARDS = 10;

/** Seconds between the scheduled controller runs, each of which reads every shard once. */
const SCHEDULE_SECONDS = 60;

/** Auto scaling target utilization. */
export const TARGET_UTILIZATION_PERCENT = 70;

export interface ProvisionedCapacity {
  readonly readCapacity: number;
  readonly writeCapacity: number;
  /** Auto scaling bounds: from the sized capacity to twice it. */
  readonly maxReadCapacity: number;
  readonly maxWriteCapacity: number;
}

/** Read and write units per second the fleet uses in steady state (no failover running). */
export function steadyUnits(props: TableCapacityProps, rates: CapacityRates = DEFAULT_CONFIG) {
  const shards = props.shards ?? 0;
  const nodes = props.nodesPerShard ?? 3;
  const partitions = props.partitions ?? 1;
  const { primaryKeepaliveMs, replicaKeepaliveMs } = keepalives(rates);
  // Each store cycle of an agent is one Query and one PutItem.
  const agentCycles = 1000 / primaryKeepaliveMs + ((nodes - 1) * 1000) / replicaKeepaliveMs;
  const perTick = 1000 / rates.tickIntervalMs;
  const scheduled =
    shards / SCHEDULE_SECONDS + (partitions * Math.ceil(shards / 100) * 0.5) / SCHEDULE_SECONDS;
  return {
    write: shards * agentCycles,
    read: shards * agentCycles + scheduled + Math.min(shards, INCIDENT_SHARDS) * perTick,
  };
}

/** Provisioned capacity for `props`, or undefined for on-demand. Throws on a bad combination. */
export function provisionedCapacity(
  props: TableCapacityProps,
  rates: CapacityRates = DEFAULT_CONFIG,
): ProvisionedCapacity | undefined {
  const mode = props.billingMode ?? "on-demand";
  if (mode === "on-demand") return undefined;
  if (mode !== "provisioned")
    throw new ShardguardError(`billingMode: must be on-demand or provisioned, got ${mode}`);
  if (props.shards === undefined || !Number.isInteger(props.shards) || props.shards < 1) {
    throw new ShardguardError(
      `shards: provisioned billing is sized from the shard count; give a positive integer`,
    );
  }
  const units = steadyUnits(props, rates);
  const size = (perSecond: number) => Math.max(1, Math.ceil(perSecond / (TARGET_UTILIZATION_PERCENT / 100)));
  const readCapacity = size(units.read);
  const writeCapacity = size(units.write);
  return {
    readCapacity,
    writeCapacity,
    maxReadCapacity: readCapacity * 2,
    maxWriteCapacity: writeCapacity * 2,
  };
}

/** The billing part of the table's props (spread into `new dynamodb.Table`). */
export function tableBillingProps(
  capacity: ProvisionedCapacity | undefined,
): Pick<dynamodb.TableProps, "billingMode" | "readCapacity" | "writeCapacity"> {
  if (!capacity) return { billingMode: dynamodb.BillingMode.PAY_PER_REQUEST };
  return {
    billingMode: dynamodb.BillingMode.PROVISIONED,
    readCapacity: capacity.readCapacity,
    writeCapacity: capacity.writeCapacity,
  };
}

/** Auto scaling of a provisioned table between the sized capacity and twice it; nothing on-demand. */
export function addTableAutoScaling(table: dynamodb.Table, capacity: ProvisionedCapacity | undefined): void {
  if (!capacity) return;
  table
    .autoScaleReadCapacity({ minCapacity: capacity.readCapacity, maxCapacity: capacity.maxReadCapacity })
    .scaleOnUtilization({ targetUtilizationPercent: TARGET_UTILIZATION_PERCENT });
  table
    .autoScaleWriteCapacity({ minCapacity: capacity.writeCapacity, maxCapacity: capacity.maxWriteCapacity })
    .scaleOnUtilization({ targetUtilizationPercent: TARGET_UTILIZATION_PERCENT });
}

/**
 * The shard index's own capacity on a provisioned table: a listing reads about 40 bytes per shard
 * (keys only, eventually consistent: 8 KB, about 200 shards, per read unit), at most once per tick
 * (the local controller; the Lambda lists once per run); a registration is one write per agent start.
 * Sized for a listing a second, never below 1; burst capacity absorbs the rest.
 */
export function shardIndexCapacity(
  capacity: ProvisionedCapacity | undefined,
  shards: number | undefined,
): Pick<dynamodb.GlobalSecondaryIndexProps, "readCapacity" | "writeCapacity"> {
  if (!capacity) return {};
  return { readCapacity: Math.max(1, Math.ceil((shards ?? 1) / 200)), writeCapacity: 1 };
}

/** Read + write throttle events on the table per minute (either billing mode can throttle). */
export function tableThrottles(table: dynamodb.Table): cloudwatch.IMetric {
  const options = { period: Duration.minutes(1), statistic: "Sum" };
  return new cloudwatch.MathExpression({
    expression: "FILL(reads, 0) + FILL(writes, 0)",
    usingMetrics: {
      reads: table.metric("ReadThrottleEvents", options),
      writes: table.metric("WriteThrottleEvents", options),
    },
    label: "Table throttle events",
    period: Duration.minutes(1),
  });
}
