import { describe, expect, it } from "vitest";
import { type ScreenContext, screenCommand } from "../../src/agent/command-screen.ts";
import type { Command } from "../../src/core/model.ts";
import type { ReceivedCommand } from "../../src/core/ports.ts";

function aMessage(command: Partial<Command> | undefined, error?: string): ReceivedCommand {
  const full =
    command === undefined
      ? undefined
      : ({ type: "PROMOTE", shard: "s1", epoch: 5, command_id: "c-5", issued_at: 1, ...command } as Command);
  return { command: full, error, receiptHandle: "r", receiveCount: 1, body: JSON.stringify(full ?? "junk") };
}

const context: ScreenContext = {
  shard: "s1",
  nodeId: "n1",
  address: "10.0.0.1:6379",
  highestEpoch: 4,
  hasApplied: (id) => id === "c-old",
};

describe("command screening", () => {
  it("applies a command of the current or a newer epoch", () => {
    expect(screenCommand(aMessage({ epoch: 4 }), context).action).toBe("apply");
    expect(screenCommand(aMessage({ epoch: 9 }), context).action).toBe("apply");
  });

  it("ignores a command whose epoch is below the highest applied", () => {
    // Act
    const screening = screenCommand(aMessage({ epoch: 3 }), context);

    // Assess
    expect(screening).toMatchObject({ action: "ignore" });
    expect(screening.action === "ignore" && screening.reason).toMatch(
      /epoch 3, below the highest applied epoch 4/,
    );
  });

  it("ignores a command id that was already applied", () => {
    expect(screenCommand(aMessage({ command_id: "c-old", epoch: 9 }), context)).toMatchObject({
      action: "ignore",
      reason: "command c-old was already applied",
    });
  });

  it("rejects a malformed message for the dead-letter queue", () => {
    expect(screenCommand(aMessage(undefined, "body: not JSON"), context)).toEqual({
      action: "reject",
      reason: "malformed command: body: not JSON",
    });
  });

  it("rejects a command for another shard", () => {
    expect(screenCommand(aMessage({ shard: "s2" }), context).action).toBe("reject");
  });

  it("rejects a REPLICAOF that points the node at itself", () => {
    // Prepare
    const message = aMessage({ type: "REPLICAOF", primary: { node_id: "n9", address: "10.0.0.1:6379" } });

    // Act + Assess
    expect(screenCommand(message, context).action).toBe("reject");
  });
});
