import { describe, expect, it } from "vitest";
import { type ScreenContext, screenCommand } from "../../src/agent/command-screen.ts";
import type { Command, Topology } from "../../src/core/model.ts";
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

/** A topology at `epoch` failing over to `target` (or online with it as primary). */
function aTopology(epoch: number, target: string, status: Topology["status"] = "failing_over"): Topology {
  return {
    shard: "s1",
    epoch,
    status,
    primary_node_id: status === "failing_over" ? "n0" : target,
    primary_address: "10.0.0.9:6379",
    updated_at: 1,
    ...(status === "failing_over"
      ? {
          phase: "promote",
          failover: {
            kind: "failover",
            old_primary_node_id: "n0",
            new_primary_node_id: target,
            new_primary_address: "10.0.0.2:6379",
            reason: "r",
            started_at: 1,
            candidates: [],
            phase_started: {},
          },
        }
      : {}),
  };
}

describe("command screening", () => {
  it("applies a command of the current or a newer epoch that the topology names", () => {
    expect(screenCommand(aMessage({ epoch: 4 }), { ...context, topology: aTopology(4, "n1") }).action).toBe(
      "apply",
    );
    expect(screenCommand(aMessage({ epoch: 9 }), { ...context, topology: aTopology(9, "n1") }).action).toBe(
      "apply",
    );
    expect(
      screenCommand(aMessage({ epoch: 9 }), { ...context, topology: aTopology(9, "n1", "online") }).action,
    ).toBe("apply");
  });

  it("drops a PROMOTE whose epoch the topology has left, with the reason", () => {
    // Act: a controller paused past its lease sends the PROMOTE of its abandoned plan (epoch 5).
    const screening = screenCommand(aMessage({ epoch: 5 }), { ...context, topology: aTopology(6, "n2") });

    // Assess
    expect(screening).toMatchObject({
      action: "ignore",
      reason: "command c-5 has epoch 5, the topology is at epoch 6",
    });
  });

  it("drops a PROMOTE of the current epoch that names another node than the topology", () => {
    const screening = screenCommand(aMessage({ epoch: 5 }), { ...context, topology: aTopology(5, "n2") });
    expect(screening).toMatchObject({
      action: "ignore",
      reason: "command c-5 names n1 as primary, the topology names n2 at epoch 5",
    });
  });

  it("follows a REPLICAOF only to the primary the topology names at its epoch", () => {
    // Prepare
    const toN2 = aMessage({
      type: "REPLICAOF",
      epoch: 5,
      primary: { node_id: "n2", address: "10.0.0.2:6379" },
    });
    const toN3 = aMessage({
      type: "REPLICAOF",
      epoch: 5,
      primary: { node_id: "n3", address: "10.0.0.3:6379" },
    });

    // Act + Assess
    expect(screenCommand(toN2, { ...context, topology: aTopology(5, "n2") }).action).toBe("apply");
    expect(screenCommand(toN2, { ...context, topology: aTopology(5, "n2", "online") }).action).toBe("apply");
    expect(screenCommand(toN3, { ...context, topology: aTopology(5, "n2") })).toMatchObject({
      action: "ignore",
      reason: "command c-5 names n3 as primary, the topology names n2 at epoch 5",
    });
    expect(screenCommand(toN2, { ...context, topology: aTopology(6, "n2") }).action).toBe("ignore");
  });

  it("applies a PROMOTE by hand on a shard that no controller manages yet (no topology)", () => {
    expect(screenCommand(aMessage({ epoch: 5 }), context).action).toBe("apply");
  });

  it("does not need the topology for PAUSE_WRITES", () => {
    expect(screenCommand(aMessage({ type: "PAUSE_WRITES", epoch: 4, timeout_ms: 100 }), context).action).toBe(
      "apply",
    );
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
