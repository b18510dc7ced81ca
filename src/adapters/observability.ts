import type { Logger as PowertoolsLogger } from "@aws-lambda-powertools/logger";
import { MetricUnit, type Metrics as PowertoolsMetrics } from "@aws-lambda-powertools/metrics";
import {
  type EventPublisher,
  LOG_LEVELS,
  type Logger,
  type LogLevel,
  type Metrics,
} from "../core/observability.ts";

/**
 * Structured JSON lines with persistent keys (shard, node, component) on every line. Lines go to
 * `write` (stdout by default, which journald and CloudWatch agents collect as is).
 */
export function jsonLineLogger(
  persistent: Record<string, unknown>,
  level: LogLevel = "info",
  write: (line: string) => void = (line) => process.stdout.write(`${line}\n`),
): Logger {
  const threshold = LOG_LEVELS.indexOf(level);
  const emit =
    (lineLevel: Exclude<LogLevel, "silent">) => (message: string, attributes?: Record<string, unknown>) => {
      if (LOG_LEVELS.indexOf(lineLevel) < threshold) return;
      write(
        JSON.stringify({
          level: lineLevel.toUpperCase(),
          message,
          timestamp: new Date().toISOString(),
          ...persistent,
          ...attributes,
        }),
      );
    };
  return { debug: emit("debug"), info: emit("info"), warn: emit("warn"), error: emit("error") };
}

/**
 * What an adapter logs with when its caller passes no logger: warnings and errors as JSON lines on
 * stderr, so nothing malformed goes unreported.
 */
export const stderrLogger: Logger = jsonLineLogger({}, "warn", (line) => process.stderr.write(`${line}\n`));

/** Powertools' Logger as a {@link Logger} (it takes no `undefined` attributes). */
export function powertoolsLogger(logger: PowertoolsLogger): Logger {
  return {
    debug: (message, attributes) => logger.debug(message, attributes ?? {}),
    info: (message, attributes) => logger.info(message, attributes ?? {}),
    warn: (message, attributes) => logger.warn(message, attributes ?? {}),
    error: (message, attributes) => logger.error(message, attributes ?? {}),
  };
}

/** Powertools Metrics: EMF on stdout, which CloudWatch turns into metrics (Lambda, or a log agent). */
export function powertoolsMetrics(metrics: PowertoolsMetrics): Metrics {
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

/** For one-shot processes (an operator's in-process request) whose counts nobody collects. */
export const discardMetrics: Metrics = { count() {}, flush() {} };

/** A publisher for local runs: every event becomes an info log line. */
export function logEventPublisher(log: Logger): EventPublisher {
  return {
    async publish(detailType, detail) {
      log.info(`event ${detailType}`, { event: detailType, ...detail });
    },
  };
}

/** Drops every line: for a CLI whose output is the answer (malformed items show in `status`). */
export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };
