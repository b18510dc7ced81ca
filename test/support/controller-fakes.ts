import type { ControllerLog, EventDetailType } from "../../src/controller/observability.ts";
import type { EventPublisher } from "../../src/core/ports.ts";

/** Records events in memory, for tests that assert on what the controller published. */
export class MemoryEventPublisher implements EventPublisher {
  readonly events: Array<{ detailType: EventDetailType; detail: Record<string, unknown> }> = [];
  async publish(detailType: EventDetailType, detail: Record<string, unknown>): Promise<void> {
    this.events.push({ detailType, detail });
  }
  ofType(detailType: EventDetailType) {
    return this.events.filter((event) => event.detailType === detailType);
  }
}

/** A log that drops everything; for tests that assert on results rather than lines. */
export const silentLog: ControllerLog = {
  debug() {},
  info() {},
  warn() {},
  error() {},
};
