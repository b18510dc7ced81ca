import { EventBridgeClient, PutEventsCommand } from "@aws-sdk/client-eventbridge";
import { mockClient } from "aws-sdk-client-mock";
import { afterEach, describe, expect, it } from "vitest";
import { EventBridgePublisher } from "../../src/adapters/eventbridge-publisher.ts";
import { CoordinationUnavailable } from "../../src/core/errors.ts";
import { EVENT_SOURCE } from "../../src/core/observability.ts";

// No EventBridge emulator runs locally: a client mock is the only way to see the request and
// the service's per-entry failures.
const eventBridge = mockClient(EventBridgeClient);
afterEach(() => eventBridge.reset());

function aPublisher() {
  return new EventBridgePublisher({
    client: new EventBridgeClient({ region: "us-east-1" }),
    eventBusName: "ops-bus",
  });
}

describe("EventBridge publisher", () => {
  it("puts one entry with source shardguard, the detail-type and the JSON detail on the configured bus", async () => {
    // Prepare
    eventBridge.on(PutEventsCommand).resolves({ FailedEntryCount: 0, Entries: [{ EventId: "e1" }] });

    // Act
    await aPublisher().publish("FailoverCompleted", { shard: "s1", epoch: 4, new_primary: "r1" });

    // Assess
    const [call] = eventBridge.commandCalls(PutEventsCommand);
    expect(call?.args[0].input.Entries).toEqual([
      {
        Source: EVENT_SOURCE,
        DetailType: "FailoverCompleted",
        Detail: JSON.stringify({ shard: "s1", epoch: 4, new_primary: "r1" }),
        EventBusName: "ops-bus",
      },
    ]);
  });

  it("reports an entry EventBridge rejected as CoordinationUnavailable with its error code", async () => {
    // Prepare
    eventBridge.on(PutEventsCommand).resolves({
      FailedEntryCount: 1,
      Entries: [{ ErrorCode: "ThrottlingException", ErrorMessage: "Rate exceeded" }],
    });

    // Act
    const publishing = aPublisher().publish("ShardOffline", { shard: "s1" });

    // Assess
    await expect(publishing).rejects.toThrowError(CoordinationUnavailable);
    await expect(publishing).rejects.toThrowError(
      /ShardOffline on bus ops-bus: ThrottlingException Rate exceeded/,
    );
  });

  it("wraps a failed call in CoordinationUnavailable, naming the event", async () => {
    // Prepare
    eventBridge.on(PutEventsCommand).rejects(new Error("socket hang up"));

    // Act
    const publishing = aPublisher().publish("FailoverStarted", { shard: "s1" });

    // Assess
    await expect(publishing).rejects.toThrowError(
      /PutEvents \(FailoverStarted on bus ops-bus\) failed: socket hang up/,
    );
  });
});
