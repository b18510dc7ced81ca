import { describe, expect, it } from "vitest";
import { decide, planSwitchover } from "../../src/core/decide.ts";
import { planDrain, planUndrain, withDrainedNeverPromoted } from "../../src/core/drain.ts";
import { aConfig, aShard, NOW, type ShardBuilder } from "../support/builders.ts";

/**
 * Node maintenance (issue 34, item 3): `shardguard drain` keeps a node out of every promotion until
 * undrained; bad requests are refused with one sentence saying why.
 */

const config = aConfig();

describe("planDrain", () => {
  it.each([
    {
      name: "drains a replica, recording it in the topology",
      shard: () => aShard(),
      node: "r1",
      expected: { kind: "drain", drained: ["r1"] },
    },
    {
      name: "adds to the nodes already drained, sorted",
      shard: () =>
        aShard()
          .withNode({ node_id: "r3" })
          .withTopology({ drained: ["r3"] }),
      node: "r1",
      expected: { kind: "drain", drained: ["r1", "r3"] },
    },
    {
      name: "switches over away from the primary first",
      shard: () => aShard(),
      node: "p1",
      expected: { kind: "switchover_first" },
    },
    {
      name: "changes nothing for a node already drained",
      shard: () =>
        aShard()
          .withNode({ node_id: "r3" })
          .withTopology({ drained: ["r1"] }),
      node: "r1",
      expected: { kind: "unchanged", reason: "r1 is already drained" },
    },
    {
      name: "drains on a paused shard (maintenance)",
      shard: () => aShard().paused(),
      node: "r2",
      expected: { kind: "drain", drained: ["r2"] },
    },
    {
      name: "refuses an unknown node, naming the shard's nodes",
      shard: () => aShard(),
      node: "r9",
      expected: { kind: "refused", reason: "unknown node r9: shard s1 has p1, r1, r2" },
    },
    {
      name: "refuses draining the last eligible replica",
      shard: () => aShard().withTopology({ drained: ["r2"] }),
      node: "r1",
      expected: {
        kind: "refused",
        reason:
          "draining r1 would leave no node to fail over to (eligible besides the primary p1: none; drained: r2)",
      },
    },
    {
      name: "refuses draining a replica when the only other one has priority 0",
      shard: () => aShard().withNode({ node_id: "r2", priority: 0 }),
      node: "r1",
      expected: { kind: "refused" },
    },
    {
      name: "refuses draining a replica when the only other one is stale",
      shard: () => aShard().withNode({ node_id: "r2", ageMs: 10_000 }),
      node: "r1",
      expected: { kind: "refused" },
    },
    {
      name: "counts a quiet replica whose report stands (written 10 s ago, keepalive 20 s)",
      shard: () => aShard().withNode({ node_id: "r2", ageMs: 10_000, keepalive_ms: 20_000 }),
      node: "r1",
      expected: { kind: "drain", drained: ["r1"] },
    },
    {
      name: "refuses when the only other replica reports its database down",
      shard: () => aShard().withNode({ node_id: "r2", db_status: "down" }),
      node: "r1",
      expected: { kind: "refused" },
    },
    {
      name: "refuses draining the primary of a two-node shard (nobody left after the switchover)",
      shard: () => aShard().without("r2"),
      node: "p1",
      expected: {
        kind: "refused",
        reason:
          "draining p1 would leave no replica to fail over to after the switchover away from it (eligible besides it: r1)",
      },
    },
    {
      name: "refuses during a failover",
      shard: () => aShard().failingOver("promote"),
      node: "r2",
      expected: {
        kind: "refused",
        reason: "the shard is failing_over (epoch 4, phase promote); drain after it is online",
      },
    },
    {
      name: "refuses on an offline shard",
      shard: () => aShard().offline(),
      node: "r2",
      expected: { kind: "refused", reason: "the shard is offline; drain after it is online" },
    },
    {
      name: "refuses a shard with no topology",
      shard: () => aShard().withTopology(undefined),
      node: "r1",
      expected: { kind: "refused", reason: "the shard has no topology yet" },
    },
  ])("$name", ({ shard, node, expected }) => {
    expect(planDrain(shard().build(), config, NOW, node)).toMatchObject(expected);
  });
});

describe("planUndrain", () => {
  it.each([
    {
      name: "removes the node from the drained list",
      drained: ["r1", "r2"],
      node: "r1",
      expected: { kind: "drain", drained: ["r2"] },
    },
    {
      name: "leaves an empty list when the last goes",
      drained: ["r1"],
      node: "r1",
      expected: { kind: "drain", drained: [] },
    },
    {
      name: "changes nothing for a node not drained",
      drained: undefined,
      node: "r1",
      expected: { kind: "unchanged" },
    },
  ])("$name", ({ drained, node, expected }) => {
    const topology = aShard().withTopology({ drained }).build().topology;
    expect(planUndrain(topology, node)).toMatchObject(expected);
  });
});

function drainedShard(drained: readonly string[]): ShardBuilder {
  return aShard().withTopology({ drained: [...drained] });
}

describe("a drained node in the decision", () => {
  it("ranks a drained node at priority 0 and leaves the others as they are", () => {
    const snapshot = withDrainedNeverPromoted(drainedShard(["r1"]).build());
    expect(snapshot.nodes.map((node) => [node.node_id, node.priority])).toEqual([
      ["p1", 100],
      ["r1", 0],
      ["r2", 100],
    ]);
  });

  it("fails over to a replica that is not drained, though the drained one holds as much", () => {
    const shard = drainedShard(["r1"]).withStalePrimary().withNode({ node_id: "r1", last_txn_id: 1000 });
    shard.withNode({ node_id: "r2", last_txn_id: 1000 });
    const decision = decide(shard.build(), config, NOW);
    expect(decision).toMatchObject({ kind: "failover", target: { node_id: "r2" } });
  });

  it("holds the failover while only the drained replica holds the newest writes (they may be acknowledged)", () => {
    const shard = drainedShard(["r1"]).withStalePrimary().withNode({ node_id: "r1", last_txn_id: 1000 });
    shard.withNode({ node_id: "r2", last_txn_id: 900 });
    const decision = decide(shard.build(), config, NOW);
    expect(decision).toMatchObject({ kind: "none", code: "waiting_for_replica" });
    expect(decision.reason).toMatch(/r1 \(drained, ranked priority 0, last_txn_id 1000\)/);
    expect(decision.reason).toContain("undrain r1 (shardguard undrain --shard s1 --node r1)");
  });

  it("refuses a switchover to a drained node, saying how to bring it back", () => {
    const plan = planSwitchover(drainedShard(["r2"]).build(), config, NOW, { to: "r2" });
    expect(plan).toEqual({ kind: "refused", reason: "r2 is drained; shardguard undrain it first" });
  });

  it("switches over to the best replica that is not drained", () => {
    const plan = planSwitchover(drainedShard(["r1"]).build(), config, NOW, {});
    expect(plan).toMatchObject({ kind: "switchover", target: { node_id: "r2" } });
  });
});
