import { Logger } from "@aws-lambda-powertools/logger";
import { Metrics } from "@aws-lambda-powertools/metrics";
import { powertoolsLogger, powertoolsMetrics } from "../../src/adapters/observability.ts";
import { parseWakes } from "../../src/adapters/sqs-wake-queue.ts";
import { ControllerLoop, type LoopSummary } from "../../src/controller/loop.ts";
import {
  handleOperatorRequest,
  isOperatorRequest,
  type OperatorResponse,
} from "../../src/controller/requests.ts";
import { createControllerRuntime } from "../../src/controller/runtime.ts";
import { METRICS_NAMESPACE } from "../../src/core/observability.ts";
import { partitionFromEvent } from "../../src/core/partition.ts";

/**
 * The controller Lambda. Scheduled every minute, it makes a pass over its shards and returns once
 * every shard is quiet (healthy, paused or cooling down); while one is not (a stale primary, a
 * failover, an offline shard) it goes on at tickInterval until shortly before its timeout. An
 * agent's wake-up (the wake queue's SQS event: a crash, a replica's link down or its probe failing)
 * runs the woken shards at once and watches them for WAKE_WATCH_TIMEOUTS failure timeouts (a
 * primary in doubt is stale within one) and until they are quiet. So the function runs for seconds
 * a minute while nothing is wrong (docs/cost.md), and a failure no agent reports is seen at the
 * next scheduled pass. An operator request event (`{ action, shard, to?, reason? }`) runs that
 * request instead and returns its JSON result. Clients and configuration live at module scope: a
 * bad SHARDGUARD_* variable fails the cold start with the variable's name.
 */

const SERVICE = "shardguard-controller";
const logger = new Logger({ serviceName: SERVICE, persistentKeys: { component: "controller" } });
const metrics = new Metrics({ namespace: METRICS_NAMESPACE, serviceName: SERVICE });
const runtime = createControllerRuntime(process.env, {
  log: powertoolsLogger(logger),
  metrics: powertoolsMetrics(metrics),
  requireEventBus: true,
});
// Module scope: a warm container keeps the per-shard "last logged state" across invocations.
const loop = new ControllerLoop(runtime.deps);

/** Failure timeouts a woken run watches its shards for, at least, before it may end quiet. */
export const WAKE_WATCH_TIMEOUTS = 3;

/** The part of the Lambda context the handler uses. */
export interface ControllerContext {
  getRemainingTimeInMillis(): number;
  readonly awsRequestId?: string;
}

export async function handler(
  event: unknown,
  context: ControllerContext,
): Promise<LoopSummary | OperatorResponse> {
  logger.appendKeys({ request_id: context.awsRequestId });
  try {
    return await dispatch(event, context);
  } finally {
    // Every path publishes what it counted (an operator's switchover counts failoverStarted and
    // failoverCompleted); the loop flushes per pass too, and a flush with nothing stored is a no-op.
    runtime.deps.metrics.flush();
  }
}

async function dispatch(event: unknown, context: ControllerContext): Promise<LoopSummary | OperatorResponse> {
  // Both within the invocation's time: leases cut to it, phases started only when they fit in it.
  const remainingMs = () => context.getRemainingTimeInMillis();
  if (isOperatorRequest(event)) return handleOperatorRequest(runtime.deps, event, { remainingMs });
  // The wake-up queue's event source mapping: one cycle now for each shard named (the crash fast
  // path), then those shards watched until they are quiet.
  if (isSqsEvent(event)) {
    const wakes = parseWakes(event.Records.map((record) => record.body ?? ""));
    // Only the shards the wake-ups may cycle (listed in the shard index, capped: screenWakes) are
    // watched, so a flood naming made-up shards ends the invocation in milliseconds.
    const { shards, ...woken } = await loop.wake(wakes, { remainingMs });
    if (shards.length === 0) return woken;
    const watched = await loop.run({
      remainingMs,
      shards,
      untilQuiet: { minMs: WAKE_WATCH_TIMEOUTS * runtime.deps.config.failureTimeoutMs },
    });
    return {
      passes: woken.passes + watched.passes,
      cycles: woken.cycles + watched.cycles,
      actions: woken.actions + watched.actions,
      errors: woken.errors + watched.errors,
    };
  }
  // A partitioned fleet: each schedule's input names its slice, `{ partition: { index, count } }`.
  return loop.run({ remainingMs, partition: partitionFromEvent(event), untilQuiet: { minMs: 0 } });
}

function isSqsEvent(event: unknown): event is { Records: { body?: string }[] } {
  const records = (event as { Records?: unknown } | null)?.Records;
  return (
    Array.isArray(records) &&
    records.every((record) => (record as { eventSource?: string })?.eventSource === "aws:sqs")
  );
}
