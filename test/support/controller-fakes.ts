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
