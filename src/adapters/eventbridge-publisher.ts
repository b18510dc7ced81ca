import { type EventBridgeClient, PutEventsCommand } from "@aws-sdk/client-eventbridge";
import { CoordinationUnavailable, errorMessage } from "../core/errors.ts";
import { EVENT_SOURCE, type EventPublisher, type EventType } from "../core/observability.ts";

/**
 * Failover lifecycle events on an EventBridge bus: detail-types FailoverStarted,
 * FailoverCompleted, FailoverAborted, ShardOffline, ShardOnline; the detail is the JSON the
 * controller passes (shard, epoch, old and new primary, reason).
 */
export class EventBridgePublisher implements EventPublisher {
  readonly #client: EventBridgeClient;
  readonly #eventBusName: string;

  constructor(options: { readonly client: EventBridgeClient; readonly eventBusName: string }) {
    this.#client = options.client;
    this.#eventBusName = options.eventBusName;
  }

  async publish(detailType: EventType, detail: Record<string, unknown>) {
    let failed: { code?: string; message?: string } | undefined;
    try {
      const out = await this.#client.send(
        new PutEventsCommand({
          Entries: [
            {
              Source: EVENT_SOURCE,
              DetailType: detailType,
              Detail: JSON.stringify(detail),
              EventBusName: this.#eventBusName,
            },
          ],
        }),
      );
      // PutEvents answers 200 with per-entry failures; a rejected entry is a failure too.
      if (out.FailedEntryCount) {
        failed = { code: out.Entries?.[0]?.ErrorCode, message: out.Entries?.[0]?.ErrorMessage };
      }
    } catch (error) {
      throw new CoordinationUnavailable(
        `PutEvents (${detailType} on bus ${this.#eventBusName}) failed: ${errorMessage(error)}`,
        { cause: error },
      );
    }
    if (failed) {
      throw new CoordinationUnavailable(
        `EventBridge rejected ${detailType} on bus ${this.#eventBusName}: ${failed.code ?? "unknown"} ${failed.message ?? ""}`.trim(),
      );
    }
  }
}
