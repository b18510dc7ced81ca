import { describe, expect, it } from "vitest";
import { History } from "../../src/dev/nemesis/history.ts";
import { OnCallOperator, priorityZeroHolder, recoverCandidates } from "../../src/dev/nemesis/on-call.ts";
import { aConfig, aShardWithStalePrimary, NOW } from "../support/builders.ts";

/**
 * The nemesis's on-call operator (seeds 4601 and 4711): a priority-0 node alone holding the data
 * kept a shard offline until the settle step's `recover` kept a node with less (549 and 3 writes
 * lost). The operator is paged by that hold only and gives the node a priority.
 */

/** Offline; r1, priority 0, holds more than r2. */
function heldForPriorityZero() {
  return aShardWithStalePrimary()
    .offline()
    .withNode({ node_id: "p1", ageMs: 20_000 })
    .withNode({ node_id: "r1", priority: 0, last_txn_id: 1000 })
    .withNode({ node_id: "r2", last_txn_id: 990 })
    .build();
}

describe("the nemesis's on-call operator", () => {
  it.each([
    { name: "a priority-0 node alone holding the data", build: heldForPriorityZero, expected: "r1" },
    {
      name: "a priority-0 node the only one on the shard's lineage (no eligible node)",
      build: () =>
        aShardWithStalePrimary()
          .offline()
          .withNode({ node_id: "p1", ageMs: 20_000 })
          .withNode({ node_id: "r1", priority: 0, last_txn_id: 1000 })
          .withNode({ node_id: "r2", repl_id: "other", primary_link: "down" })
          .build(),
      expected: "r1",
    },
    {
      name: "a drained node alone holding the data (nemesis 7351)",
      build: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ drained: ["r1"] })
          .withNode({ node_id: "p1", ageMs: 20_000 })
          .withNode({ node_id: "r1", last_txn_id: 1000 })
          .withNode({ node_id: "r2", last_txn_id: 990 })
          .build(),
      expected: "r1",
    },
    {
      name: "a priority-0 node behind the others (no hold)",
      build: () =>
        aShardWithStalePrimary().withNode({ node_id: "r1", priority: 0, last_txn_id: 980 }).build(),
      expected: undefined,
    },
  ])("names the node the controller holds for: $name", ({ build, expected }) => {
    // Act
    const holder = priorityZeroHolder(build(), aConfig(), NOW);
    // Assess
    expect(holder).toBe(expected);
  });

  it("undrains a drained holder, without restarting its agent when it has a priority (nemesis 7351)", async () => {
    // Prepare
    const history = new History();
    const given: string[] = [];
    const undrained: string[] = [];
    const snapshot = aShardWithStalePrimary()
      .offline()
      .withTopology({ drained: ["r1"] })
      .withNode({ node_id: "p1", ageMs: 20_000 })
      .withNode({ node_id: "r1", last_txn_id: 1000 })
      .withNode({ node_id: "r2", last_txn_id: 990 })
      .build();
    const onCall = new OnCallOperator({
      history,
      snapshot: async () => snapshot,
      now: () => NOW,
      config: aConfig(),
      givePriority: (id) => given.push(id),
      undrain: async (id) => {
        undrained.push(id);
      },
      pageAfterMs: 0,
      log: () => {},
    });
    // Act
    await onCall.tick();
    await onCall.tick();
    // Assess
    expect(undrained).toEqual(["r1"]);
    expect(given).toEqual([]);
    expect(history.ops.map((op) => op.f)).toEqual(["inject", "heal"]);
  });

  it("records the page as a fault, gives the node a priority once the page delay passed, and records the act as its heal", async () => {
    // Prepare
    const history = new History();
    const given: string[] = [];
    const snapshot = heldForPriorityZero();
    const onCall = new OnCallOperator({
      history,
      snapshot: async () => snapshot,
      now: () => NOW,
      config: aConfig(),
      givePriority: (id) => given.push(id),
      pageAfterMs: 0,
      log: () => {},
    });
    // Act
    await onCall.tick();
    const afterPage = history.ops.map((op) => op.f);
    await onCall.tick();
    // Assess
    expect(afterPage).toEqual(["inject"]);
    expect(given).toEqual(["r1"]);
    expect(history.ops.map((op) => `${op.f} ${(op.value as { kind: string }).kind}`)).toEqual([
      "inject operator-paged",
      "heal operator-paged",
    ]);
    expect(onCall.pages).toBe(1);
  });
});

describe("the nodes the nemesis's operator recovers on mid-run (seed 6303)", () => {
  it.each([
    {
      name: "not a node on another lineage, whatever its offset, while the holder's agent is dead",
      nodes: [
        { node_id: "p1", ageMs: 600_000 },
        { node_id: "r1", repl_id: "other", last_txn_id: 5000, primary_link: "down" as const },
      ],
      expected: [],
    },
    {
      name: "the live holders of the stored lineage, the most data first",
      nodes: [
        { node_id: "p1", ageMs: 600_000 },
        { node_id: "r1", last_txn_id: 1000 },
        { node_id: "r2", last_txn_id: 1200 },
        { node_id: "r3", repl_id: "other", last_txn_id: 9000, primary_link: "down" as const },
      ],
      expected: ["r2", "r1"],
    },
    {
      name: "not a live node behind the stored offset",
      nodes: [
        { node_id: "p1", ageMs: 600_000 },
        { node_id: "r1", last_txn_id: 999 },
      ],
      expected: [],
    },
  ])("$name", ({ nodes, expected }) => {
    // Prepare
    let shard = aShardWithStalePrimary().offline(1000);
    for (const node of nodes) shard = shard.withNode(node);
    // Act
    const candidates = recoverCandidates(shard.build(), aConfig(), NOW);
    // Assess
    expect(candidates.map((node) => node.node_id)).toEqual(expected);
  });
});
