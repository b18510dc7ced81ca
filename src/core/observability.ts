/**
 * What Shardguard makes observable, in one place: the logger every component writes through, the
 * metric names and the metrics port, and the catalogue of lifecycle events. Implementations (JSON
 * lines, Powertools, EventBridge) are adapters: src/adapters/observability.ts and
 * src/adapters/eventbridge-publisher.ts.
 */

/**
 * The one logger interface: agent, controller and adapters log through it. Powertools' `Logger`
 * satisfies it (the Lambda and the local controller pass theirs); the agent uses JSON lines.
 */
export interface Logger {
  debug(message: string, attributes?: Record<string, unknown>): void;
  info(message: string, attributes?: Record<string, unknown>): void;
  warn(message: string, attributes?: Record<string, unknown>): void;
  error(message: string, attributes?: Record<string, unknown>): void;
}

export const LOG_LEVELS = ["debug", "info", "warn", "error", "silent"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Metric names, camelCase in the {@link METRICS_NAMESPACE} namespace. */
export const METRIC_NAMES = [
  "staleHeartbeatDetected",
  "failoverStarted",
  "failoverCompleted",
  "failoverAborted",
  "shardOffline",
] as const;
export type MetricName = (typeof METRIC_NAMES)[number];

export const METRICS_NAMESPACE = "Shardguard";

/** The metrics port: counters, published in batches (one EMF line per flush with Powertools). */
export interface Metrics {
  count(name: MetricName, value?: number): void;
  /** Publishes what was counted since the last flush. */
  flush(): void;
}

/** `source` of every Shardguard event; rules match on it and on the detail-type. */
export const EVENT_SOURCE = "shardguard";

/**
 * Every detail-type the controller publishes. The detail is the JSON the controller passes:
 * shard, epoch, old and new primary, reason.
 */
export const EVENT_TYPES = [
  "FailoverStarted",
  "FailoverCompleted",
  "FailoverAborted",
  "ShardOffline",
  "ShardOnline",
] as const;
export type EventType = (typeof EVENT_TYPES)[number];

/** The events port (EventBridge in AWS, log lines in a local process). */
export interface EventPublisher {
  publish(detailType: EventType, detail: Record<string, unknown>): Promise<void>;
}
