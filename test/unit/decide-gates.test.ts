import { describe, expect, it } from "vitest";
import { decide } from "../../src/core/decide.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { aConfig, aShard, aShardWithStalePrimary, NOW } from "../support/builders.ts";

/** The gates of docs/safety.md that no row of decide.test.ts shows on its own. */
describe("decide: gates without a row elsewhere", () => {
  it.each<{ name: string; snapshot: () => ShardSnapshot; code: string; reason: string }>([
    {
      name: "fails closed on a malformed topology item (does not adopt a primary as if there were none)",
      snapshot: () => ({
        ...aShard().withTopology(undefined).build(),
        malformed: [{ sk: "TOPOLOGY", field: "epoch", reason: "Too small" }],
      }),
      code: "inconsistent_topology",
      reason: "the topology item is malformed (epoch: Too small)",
    },
    {
      name: "takes no action on a topology in the agents' partition (an older installation's layout)",
      snapshot: () => ({ ...aShardWithStalePrimary().build(), legacyTopology: true }),
      code: "legacy_layout",
      reason:
        "no failover, until an operator upgrades every agent of the shard and runs `shardguard migrate-layout --shard s1`",
    },
    {
      name: "leaves a shard without a topology to the controller that holds the lock",
      snapshot: () => aShard().withTopology(undefined).lockedBy("other").build(),
      code: "locked",
      reason: "no topology yet; another controller holds the shard's lock",
    },
    {
      name: "keeps an offline shard offline during cool-down, an eligible node notwithstanding",
      snapshot: () => aShardWithStalePrimary().offline().coolingDown(5000).build(),
      code: "cooldown",
      reason: "in cool-down for 5000 ms more",
    },
    {
      name: "leaves an offline shard to the controller that holds the lock",
      snapshot: () => aShardWithStalePrimary().offline().lockedBy("other").build(),
      code: "locked",
      reason: "shard offline and r1 is eligible, but another controller holds the lock",
    },
  ])("$name", ({ snapshot, code, reason }) => {
    // Act
    const decision = decide(snapshot(), aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "none", code, primaryStale: false });
    expect(decision.reason).toContain(reason);
  });
});
