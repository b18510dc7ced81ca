import { describe, expect, it } from "vitest";
import { MAX_ISSUED_AHEAD_MS, type ScreenContext, screenCommand } from "../../src/agent/command-screen.ts";
import { type Command, commandSchema, MAX_COMMAND_TIMEOUT_MS, type Topology } from "../../src/core/model.ts";
import type { ReceivedCommand } from "../../src/core/ports.ts";

const NOW = 1_700_000_000_000;

function aMessage(command: Partial<Command> | undefined, error?: string): ReceivedCommand {
  const full =
    command === undefined
      ? undefined
      : ({
          type: "PROMOTE",
          shard: "s1",
          epoch: 5,
          command_id: "c-5",
          issued_at: NOW - 1000,
          ...command,
        } as Command);
  return { command: full, error, receiptHandle: "r", receiveCount: 1, body: JSON.stringify(full ?? "junk") };
}

const context: ScreenContext = {
  shard: "s1",
  nodeId: "n1",
  address: "10.0.0.1:6379",
  highestEpoch: 4,
  hasApplied: (id) => id === "c-old",
  topology: undefined,
  now: NOW,
};

const ADDRESSES: Record<string, string> = {
  n0: "10.0.0.9:6379",
  n1: "10.0.0.1:6379",
  n2: "10.0.0.2:6379",
  n3: "10.0.0.3:6379",
};

/** A topology at `epoch` failing over to `target` (or online with it as primary). */
function aTopology(epoch: number, target: string, status: Topology["status"] = "failing_over"): Topology {
  return {
    shard: "s1",
    epoch,
    status,
    primary_node_id: status === "failing_over" ? "n0" : target,
    primary_address: status === "failing_over" ? ADDRESSES.n0 : ADDRESSES[target],
    updated_at: 1,
    ...(status === "failing_over"
      ? {
          phase: "promote",
          failover: {
            kind: "failover",
            old_primary_node_id: "n0",
            new_primary_node_id: target,
            new_primary_address: ADDRESSES[target] as string,
            reason: "r",
            started_at: 1,
            candidates: [],
            phase_started: {},
          },
        }
      : {}),
  };
}

/** A switchover at `epoch` from `from` (the primary, whose writes are paused) to `to`. */
function aSwitchover(epoch: number, from: string, to: string): Topology {
  const topology = aTopology(epoch, to);
  return {
    ...topology,
    primary_node_id: from,
    primary_address: ADDRESSES[from],
    phase: "catch_up",
    failover: {
      ...(topology.failover as NonNullable<Topology["failover"]>),
      kind: "switchover",
      old_primary_node_id: from,
    },
  };
}

const replicaOf = (node: string, extra: Partial<Command> = {}): Partial<Command> => ({
  type: "REPLICAOF",
  primary: { node_id: node, address: ADDRESSES[node] as string },
  ...extra,
});

describe("command screening", () => {
  it("applies a command of the current or a newer epoch that the topology names", () => {
    expect(screenCommand(aMessage({ epoch: 4 }), { ...context, topology: aTopology(4, "n1") }).action).toBe(
      "apply",
    );
    expect(screenCommand(aMessage({ epoch: 9 }), { ...context, topology: aTopology(9, "n1") }).action).toBe(
      "apply",
    );
  });

  it("refuses a PROMOTE once the change is over: a replay would close writes for a fence window", () => {
    expect(
      screenCommand(aMessage({ epoch: 9 }), { ...context, topology: aTopology(9, "n1", "online") }),
    ).toMatchObject({
      action: "refuse",
      reason: "command c-5 promotes n1, but no change to it is under way (the topology is online at epoch 9)",
    });
  });

  it("ignores a PROMOTE whose epoch the topology has left, with the reason", () => {
    // Act: a controller paused past its lease sends the PROMOTE of its abandoned plan (epoch 5).
    const screening = screenCommand(aMessage({ epoch: 5 }), { ...context, topology: aTopology(6, "n2") });

    // Assess
    expect(screening).toMatchObject({
      action: "ignore",
      reason: "command c-5 has epoch 5, the topology is at epoch 6",
    });
  });

  it("refuses a PROMOTE of the current epoch that names another node than the topology", () => {
    const screening = screenCommand(aMessage({ epoch: 5 }), { ...context, topology: aTopology(5, "n2") });
    expect(screening).toMatchObject({
      action: "refuse",
      reason: "command c-5 names n1 as primary, the topology names n2 at epoch 5",
    });
  });

  it("follows a REPLICAOF only to the primary the topology names at its epoch, at its address", () => {
    // Prepare
    const toN2 = aMessage(replicaOf("n2", { epoch: 5 }));
    const toN3 = aMessage(replicaOf("n3", { epoch: 5 }));
    const toN2Elsewhere = aMessage({
      type: "REPLICAOF",
      epoch: 5,
      primary: { node_id: "n2", address: "203.0.113.7:6379" },
    });

    // Act + Assess
    expect(screenCommand(toN2, { ...context, topology: aTopology(5, "n2") }).action).toBe("apply");
    expect(screenCommand(toN2, { ...context, topology: aTopology(5, "n2", "online") }).action).toBe("apply");
    expect(screenCommand(toN3, { ...context, topology: aTopology(5, "n2") })).toMatchObject({
      action: "refuse",
      reason: "command c-5 names n3 as primary, the topology names n2 at epoch 5",
    });
    expect(screenCommand(toN2Elsewhere, { ...context, topology: aTopology(5, "n2") })).toMatchObject({
      action: "refuse",
      reason: "command c-5 names n2 at 203.0.113.7:6379, the topology has it at 10.0.0.2:6379 at epoch 5",
    });
    expect(screenCommand(toN2, { ...context, topology: aTopology(6, "n2") }).action).toBe("ignore");
  });

  it("refuses a forged PAUSE_WRITES at the largest safe epoch (issue 38) and keeps no trace of it", () => {
    // Prepare: the proved attack, on a primary of an online shard at epoch 4.
    const forged = aMessage({
      type: "PAUSE_WRITES",
      epoch: Number.MAX_SAFE_INTEGER,
      timeout_ms: MAX_COMMAND_TIMEOUT_MS,
    });

    // Act
    const screening = screenCommand(forged, { ...context, topology: aTopology(4, "n1", "online") });

    // Assess
    expect(screening).toMatchObject({
      action: "refuse",
      reason: `command c-5 has epoch ${Number.MAX_SAFE_INTEGER}, the topology is at epoch 4`,
    });
  });

  it("refuses every command but a REPORT at epoch 0 on a shard that has no topology", () => {
    expect(screenCommand(aMessage({ epoch: 5 }), context)).toMatchObject({
      action: "refuse",
      reason: "command c-5 has epoch 5, the shard has no topology (epoch 0)",
    });
    expect(screenCommand(aMessage({ epoch: 0 }), { ...context, highestEpoch: 0 })).toMatchObject({
      action: "refuse",
      reason: "command c-5 names n1 as primary, the topology names none at epoch 0",
    });
    expect(
      screenCommand(aMessage({ type: "REPORT", epoch: 0, timeout_ms: 5000 }), { ...context, highestEpoch: 0 })
        .action,
    ).toBe("apply");
  });

  it("ignores a command whose epoch is below the highest applied", () => {
    // Act
    const screening = screenCommand(aMessage({ epoch: 3 }), { ...context, topology: aTopology(3, "n1") });

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

/** One row: a command (over the PROMOTE at epoch 5 of `aMessage`), the topology, what happens. */
interface Row {
  readonly name: string;
  readonly command: Partial<Command>;
  readonly topology: Topology | undefined;
  readonly action: "apply" | "ignore" | "refuse";
  readonly reason?: RegExp;
}

const switchoverFromN1 = aSwitchover(5, "n1", "n2");
const online = aTopology(5, "n1", "online");
const report = (extra: Partial<Command> = {}): Partial<Command> => ({
  type: "REPORT",
  timeout_ms: 60_000,
  ...extra,
});
const pause = (extra: Partial<Command> = {}): Partial<Command> => ({
  type: "PAUSE_WRITES",
  timeout_ms: 19_000,
  ...extra,
});

const ROWS: readonly Row[] = [
  // PROMOTE
  { name: "PROMOTE of the plan's target", command: {}, topology: aTopology(5, "n1"), action: "apply" },
  { name: "PROMOTE after the change completed (a replay)", command: {}, topology: online, action: "refuse" },
  {
    name: "PROMOTE above the topology's epoch",
    command: { epoch: 6 },
    topology: online,
    action: "refuse",
    reason: /epoch 6, the topology is at epoch 5/,
  },
  { name: "PROMOTE of another node's plan", command: {}, topology: aTopology(5, "n2"), action: "refuse" },
  // REPLICAOF
  {
    name: "REPLICAOF to the plan's target",
    command: replicaOf("n2"),
    topology: aTopology(5, "n2"),
    action: "apply",
  },
  {
    name: "REPLICAOF above the topology's epoch",
    command: replicaOf("n2", { epoch: 7 }),
    topology: aTopology(5, "n2"),
    action: "refuse",
  },
  {
    name: "REPLICAOF to the plan's target, another address",
    command: { type: "REPLICAOF", primary: { node_id: "n2", address: "10.0.0.3:6379" } },
    topology: aTopology(5, "n2"),
    action: "refuse",
    reason: /the topology has it at 10\.0\.0\.2:6379/,
  },
  // PAUSE_WRITES
  {
    name: "PAUSE_WRITES of a switchover away from this node",
    command: pause(),
    topology: switchoverFromN1,
    action: "apply",
  },
  {
    name: "PAUSE_WRITES on an online shard",
    command: pause(),
    topology: online,
    action: "refuse",
    reason: /no switchover away from n1 at epoch 5/,
  },
  {
    name: "PAUSE_WRITES of a failover (not a switchover)",
    command: pause(),
    topology: aTopology(5, "n2"),
    action: "refuse",
  },
  {
    name: "PAUSE_WRITES of a switchover away from another node",
    command: pause(),
    topology: aSwitchover(5, "n2", "n3"),
    action: "refuse",
  },
  {
    name: "PAUSE_WRITES above the topology's epoch",
    command: pause({ epoch: 6 }),
    topology: switchoverFromN1,
    action: "refuse",
  },
  {
    name: "PAUSE_WRITES of an abandoned switchover (epoch left)",
    command: pause({ epoch: 5 }),
    topology: aTopology(6, "n1", "online"),
    action: "ignore",
  },
  {
    name: "PAUSE_WRITES whose time is over",
    command: pause({ issued_at: NOW - 20_000 }),
    topology: switchoverFromN1,
    action: "ignore",
    reason: /expired 1000 ms ago/,
  },
  {
    name: "PAUSE_WRITES with no topology",
    command: pause({ epoch: 4 }),
    topology: undefined,
    action: "refuse",
  },
  // REPORT
  { name: "REPORT at the topology's epoch", command: report(), topology: online, action: "apply" },
  {
    name: "REPORT to a replica during a failover",
    command: report(),
    topology: aTopology(5, "n2"),
    action: "apply",
  },
  {
    name: "REPORT above the topology's epoch",
    command: report({ epoch: Number.MAX_SAFE_INTEGER }),
    topology: online,
    action: "refuse",
  },
  {
    name: "REPORT at an epoch the topology left",
    command: report({ epoch: 4 }),
    topology: online,
    action: "ignore",
  },
  {
    name: "REPORT whose time is over",
    command: report({ issued_at: NOW - 60_000 }),
    topology: online,
    action: "ignore",
    reason: /expired/,
  },
  // issued_at
  {
    name: "a command issued just within the allowed clock difference",
    command: report({ issued_at: NOW + MAX_ISSUED_AHEAD_MS }),
    topology: online,
    action: "apply",
  },
  {
    name: "a command issued in the future",
    command: { issued_at: NOW + MAX_ISSUED_AHEAD_MS + 1 },
    topology: aTopology(5, "n1"),
    action: "refuse",
    reason: /in the future/,
  },
];

describe("every command type fits the topology or is not obeyed", () => {
  it.each(ROWS)("$name: $action", (row) => {
    // Act
    const screening = screenCommand(aMessage(row.command), { ...context, topology: row.topology });

    // Assess
    expect(screening.action).toBe(row.action);
    if (row.reason) expect(screening.action !== "apply" && screening.reason).toMatch(row.reason);
  });
});

describe("the command schema's bounds", () => {
  const valid = {
    type: "PAUSE_WRITES",
    shard: "s1",
    epoch: 5,
    command_id: "c-5",
    issued_at: NOW,
    timeout_ms: 1000,
  };

  it.each([
    ["an epoch past 2^53 - 1", { epoch: 2 ** 53 }, "epoch"],
    ["a negative epoch", { epoch: -1 }, "epoch"],
    ["a fractional epoch", { epoch: 1.5 }, "epoch"],
    ["a pause of 1,000 days (issue 38)", { timeout_ms: 86_400_000_000 }, "timeout_ms"],
    ["a timeout one ms above the maximum", { timeout_ms: MAX_COMMAND_TIMEOUT_MS + 1 }, "timeout_ms"],
    ["a zero timeout", { timeout_ms: 0 }, "timeout_ms"],
    ["a PAUSE_WRITES without a timeout", { timeout_ms: undefined }, "timeout_ms"],
    ["a negative issued_at", { issued_at: -1 }, "issued_at"],
    ["an issued_at past 2^53 - 1", { issued_at: 2 ** 60 }, "issued_at"],
  ])("rejects %s", (_name, change, field) => {
    // Act
    const parsed = commandSchema.safeParse({ ...valid, ...change });

    // Assess
    expect(parsed.success).toBe(false);
    expect(parsed.error?.issues.map((issue) => issue.path[0])).toContain(field);
  });

  it("accepts the largest timeout and the largest safe epoch", () => {
    expect(
      commandSchema.safeParse({
        ...valid,
        timeout_ms: MAX_COMMAND_TIMEOUT_MS,
        epoch: Number.MAX_SAFE_INTEGER,
      }).success,
    ).toBe(true);
  });
});
