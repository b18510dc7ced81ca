/**
 * The controller of bench/scale.ts, in its own process so its memory is its own: the real
 * ControllerLoop wired from the environment as src/controller/runtime.ts wires it, with the
 * adapters' request counter at hand (one loop object kept across passes,
 * as a warm container keeps it), running one pass per message from the parent and answering with
 * the pass's wall time, CPU time, memory and the decision codes it saw.
 *
 * Message in: { partition?: { index, count }, concurrency?: number }. Answer: PassReport.
 */
import { diffCounts } from "../../src/adapters/api-call-counter.ts";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { failoverConfigFromEnv } from "../../src/adapters/env.ts";
import { discardMetrics, logEventPublisher } from "../../src/adapters/observability.ts";
import { ControllerLoop } from "../../src/controller/loop.ts";
import type { Logger } from "../../src/core/observability.ts";
import type { Partition } from "../../src/core/partition.ts";

export interface PassRequest {
  readonly partition?: Partition;
  readonly concurrency?: number;
}

export interface PassReport {
  readonly wallMs: number;
  readonly cpuMs: number;
  readonly cycles: number;
  readonly errors: number;
  /** Decision code (or kind) per shard cycle, counted. */
  readonly codes: Record<string, number>;
  /** AWS requests of the pass by operation (the SDK middleware's count, retries included). */
  readonly requests: Record<string, number>;
  readonly rssMb: number;
  readonly heapUsedMb: number;
  readonly maxRssMb: number;
}

let codes: Record<string, number> = {};
const record = (attributes?: Record<string, unknown>) => {
  if (!attributes || attributes.outcome === undefined) return;
  const code = String(attributes.code ?? attributes.decision ?? attributes.outcome);
  codes[code] = (codes[code] ?? 0) + 1;
};
const log: Logger = {
  debug: (_message, attributes) => record(attributes),
  info: (_message, attributes) => record(attributes),
  warn: (message, attributes) => process.stderr.write(`${JSON.stringify({ message, ...attributes })}\n`),
  error: (message, attributes) => process.stderr.write(`${JSON.stringify({ message, ...attributes })}\n`),
};
const aws = createAwsAdapters({ env: process.env, logger: log });
const loop = new ControllerLoop({
  store: aws.store,
  bus: aws.bus,
  clock: aws.clock,
  events: logEventPublisher(log),
  config: failoverConfigFromEnv(process.env),
  log,
  metrics: discardMetrics,
});
const mb = (bytes: number) => Math.round((bytes / 1024 / 1024) * 10) / 10;

process.on("message", (message: PassRequest | "stop") => {
  if (message === "stop") {
    aws.destroy();
    process.disconnect();
    return;
  }
  void (async () => {
    codes = {};
    const before = aws.counter.snapshot();
    const cpu = process.cpuUsage();
    const started = performance.now();
    const summary = await loop.run({
      once: true,
      partition: message.partition,
      concurrency: message.concurrency,
    });
    const wallMs = performance.now() - started;
    const used = process.cpuUsage(cpu);
    const memory = process.memoryUsage();
    const report: PassReport = {
      wallMs: Math.round(wallMs),
      cpuMs: Math.round((used.user + used.system) / 1000),
      cycles: summary.cycles,
      errors: summary.errors,
      codes,
      requests: Object.fromEntries(
        Object.entries(diffCounts(before, aws.counter.snapshot())).map(([op, count]) => [op, count.requests]),
      ),
      rssMb: mb(memory.rss),
      heapUsedMb: mb(memory.heapUsed),
      maxRssMb: mb(process.resourceUsage().maxRSS * 1024),
    };
    process.send?.(report);
  })();
});
process.send?.("ready");
