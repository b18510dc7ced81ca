import type { AwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import type { ControllerDeps } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { EventPublisher, EventType, MetricName, Metrics } from "../../src/core/observability.ts";

/** Records events in memory, for tests that assert on what the controller published. */
export class MemoryEventPublisher implements EventPublisher {
  readonly events: Array<{ detailType: EventType; detail: Record<string, unknown> }> = [];
  async publish(detailType: EventType, detail: Record<string, unknown>): Promise<void> {
    this.events.push({ detailType, detail });
  }
  ofType(detailType: EventType) {
    return this.events.filter((event) => event.detailType === detailType);
  }
}

/** Counts in memory, for tests that assert on what the controller counted. */
export class MemoryMetrics implements Metrics {
  readonly totals = new Map<MetricName, number>();
  count(name: MetricName, value = 1): void {
    this.totals.set(name, (this.totals.get(name) ?? 0) + value);
  }
  flush(): void {}
  get(name: MetricName): number {
    return this.totals.get(name) ?? 0;
  }
}

/**
 * The real controller over the same local stack as a test's agents, with their timings (a
 * controller and its agents must agree on them), a 200 ms tick, a 5 s lease and its events and
 * metrics in memory.
 */
export function controllerOverAgents(
  aws: Pick<AwsAdapters, "store" | "bus" | "clock">,
  timings: { heartbeatIntervalMs: number; failureTimeoutMs: number; fenceTimeoutMs: number },
): ControllerDeps {
  return {
    store: aws.store,
    bus: aws.bus,
    clock: aws.clock,
    config: parseFailoverConfig({
      heartbeatIntervalMs: timings.heartbeatIntervalMs,
      failureTimeoutMs: timings.failureTimeoutMs,
      fenceTimeoutMs: timings.fenceTimeoutMs,
      tickIntervalMs: 200,
      lockLeaseMs: 5000,
      maxLagOnFailover: 10 * 1024 * 1024,
      quorum: "majority",
      cooldownMs: 60_000,
    }),
    log: silentLogger,
    events: new MemoryEventPublisher(),
    metrics: new MemoryMetrics(),
  };
}
