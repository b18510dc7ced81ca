import { afterEach, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../src/adapters/observability.ts";
import { handleMessage } from "../../src/agent/command-consumer.ts";
import type { AgentContext } from "../../src/agent/context.ts";
import { Mutex } from "../../src/agent/scheduling.ts";
import type { Command } from "../../src/core/model.ts";
import type { ReceivedCommand } from "../../src/core/ports.ts";

const PROMOTE: Command = {
  type: "PROMOTE",
  shard: "s1",
  epoch: 5,
  command_id: "s1:5:PROMOTE:n1",
  issued_at: 1,
} as Command;

const message: ReceivedCommand = {
  command: PROMOTE,
  error: undefined,
  receiptHandle: "r",
  receiveCount: 1,
  body: JSON.stringify(PROMOTE),
};

/** The parts of an agent's context `handleMessage` touches, with a topology read that hangs. */
function contextWithHangingStore(roleLock: Mutex, storeTimeoutMs: number) {
  return {
    shard: "s1",
    nodeId: "n1",
    address: "10.0.0.1:6379",
    highestEpoch: 4,
    epochContext: { epoch: 4 },
    roleLock,
    storeTimeoutMs,
    logger: silentLogger,
    state: { hasApplied: () => false },
    count: () => {},
    deps: {
      // A store outage: the GetItem answers nothing.
      topology: { read: () => new Promise<never>(() => {}) },
      commands: { delete: vi.fn(async () => {}) },
    },
  } as unknown as AgentContext;
}

afterEach(() => {
  vi.useRealTimers();
});

describe("the command consumer and the role lock", () => {
  it("leaves the role lock free while a command's topology read hangs, and gives the command back after the store timeout", async () => {
    // Prepare
    vi.useFakeTimers();
    const roleLock = new Mutex();
    const ctx = contextWithHangingStore(roleLock, 1000);

    // Act: a PROMOTE arrives during a store outage; then the primary's connection closes and the
    // replica must be parked (PrimaryProbe's park runs under the role lock) before its database
    // reconnects to a primary that may have restarted empty.
    const handled = handleMessage(ctx, message);
    let parked = false;
    const park = roleLock.run(async () => {
      parked = true;
    });
    await vi.advanceTimersByTimeAsync(10);

    // Assess
    expect(parked).toBe(true);
    await park;
    await vi.advanceTimersByTimeAsync(1000);
    expect(await handled).toBe(false);
    expect(ctx.deps.commands.delete).not.toHaveBeenCalled();
  });
});
