import type { Logger } from "@aws-lambda-powertools/logger";
import { type Metrics, MetricUnit } from "@aws-lambda-powertools/metrics";
import type { EventPublisher } from "../core/ports.ts";

/**
 * What the controller needs to be observable: structured logs, counters and lifecycle events.
 * Powertools' Logger satisfies ControllerLog as it is; metrics and events go through small
 * ports so that the local process and tests can use in-memory or log-only versions.
 */
export interface ControllerLog {
  debug(message: string, attributes?: Record<string, unknown>): void;
  info(message: string, attributes?: Record<string, unknown>): void;
  warn(message: string, attributes?: Record<string, unknown>): void;
  error(message: string, attributes?: Record<string, unknown>): void;
}

/** Metric names, camelCase in the "Shardguard" namespace. */
export const METRIC_NAMES = [
  "staleHeartbeatDetected",
  "failoverStarted",
  "failoverCompleted",
  "failoverAborted",
  "shardOffline",
] as const;
export type MetricName = (typeof METRIC_NAMES)[number];

export const METRICS_NAMESPACE = "Shardguard";

export interface ControllerMetrics {
  count(name: MetricName, value?: number): void;
  /** Publishes what was counted since the last flush (one EMF line per flush in Lambda). */
  flush(): void;
}

export type EventDetailType = Parameters<EventPublisher["publish"]>[0];

/** Powertools Metrics (EMF on stdout, picked up by CloudWatch in Lambda). */
export function powertoolsMetrics(metrics: Metrics): ControllerMetrics {
  let pending = 0;
  return {
    count(name, value = 1) {
      metrics.addMetric(name, MetricUnit.Count, value);
      pending += 1;
    },
    flush() {
      // Publishing with nothing stored makes Powertools warn; only flush what exists.
      if (pending === 0) return;
      pending = 0;
      metrics.publishStoredMetrics();
    },
  };
}

/** Counts in memory; for tests and for the local process's summary. */
export class MemoryMetrics implements ControllerMetrics {
  readonly totals = new Map<MetricName, number>();
  count(name: MetricName, value = 1): void {
    this.totals.set(name, (this.totals.get(name) ?? 0) + value);
  }
  flush(): void {}
  get(name: MetricName): number {
    return this.totals.get(name) ?? 0;
  }
}

/** A publisher for local runs: every event becomes an info log line. */
export function logEventPublisher(log: ControllerLog): EventPublisher {
  return {
    async publish(detailType, detail) {
      log.info(`event ${detailType}`, { event: detailType, ...detail });
    },
  };
}

/** Powertools Logger already matches ControllerLog; this keeps the entry points explicit. */
export function powertoolsLog(logger: Logger): ControllerLog {
  return {
    debug: (message, attributes) => logger.debug(message, attributes ?? {}),
    info: (message, attributes) => logger.info(message, attributes ?? {}),
    warn: (message, attributes) => logger.warn(message, attributes ?? {}),
    error: (message, attributes) => logger.error(message, attributes ?? {}),
  };
}
