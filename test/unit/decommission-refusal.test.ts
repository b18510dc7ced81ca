import { describe, expect, it } from "vitest";
import { retirementOf, retirementRefusal } from "../../src/cli/commands/decommission.ts";
import { aConfig, aShard, NOW, type ShardBuilder } from "../support/builders.ts";

/**
 * `shardguard decommission --shard S --node N` retires N from the store only when nothing still
 * needs it (nemesis seed 2905: a retired node left in the primary's set held the shard for good).
 * Each refusal is one sentence; a node whose agent is unheard, outside any change of primary, is retired.
 */

const config = aConfig({ failureTimeoutMs: 3000 });
/** r2's last report past its keepalive (20 s) plus the failure timeout (3 s). */
const unheard = (shard: ShardBuilder) =>
  shard.withNode({ node_id: "r2", ageMs: 30_000, keepalive_ms: 20_000 });

describe("retirementRefusal", () => {
  it.each([
    {
      name: "a node whose agent is unheard",
      shard: () => unheard(aShard()),
      node: "r2",
      refusal: undefined,
    },
    {
      name: "a node without a heartbeat (never started, or retired already)",
      shard: () => aShard(),
      node: "r9",
      refusal: undefined,
    },
    {
      name: "a shard without a topology",
      shard: () => unheard(aShard()).withTopology(undefined),
      node: "r2",
      refusal: undefined,
    },
    {
      name: "a quiet replica within its keepalive: its agent may run",
      shard: () => aShard().withNode({ node_id: "r2", ageMs: 15_000, keepalive_ms: 20_000 }),
      node: "r2",
      refusal:
        /^r2's agent reported 15000 ms ago and its report stands for 23000 ms .*stop its agent and redis-server/,
    },
    {
      name: "the primary, even with its agent dead",
      shard: () => aShard().withNode({ node_id: "p1", ageMs: 60_000 }),
      node: "p1",
      refusal: /^p1 is the primary of shard s1; drain it first/,
    },
    {
      name: "the target of a failover under way, its agent unheard",
      shard: () => unheard(aShard()).failingOver("promote", "r2"),
      node: "r2",
      refusal: /^r2 is the target of the failover under way in shard s1 \(epoch 4\)/,
    },
    {
      name: "the old primary of a failover under way",
      shard: () => aShard().withNode({ node_id: "p1", ageMs: 60_000 }).failingOver("promote", "r1"),
      node: "p1",
      refusal: /^p1 is the old primary of the failover under way/,
    },
    {
      name: "the old primary an offline shard's lineage names",
      shard: () => aShard().withNode({ node_id: "p1", ageMs: 60_000 }).offline(),
      node: "p1",
      refusal: /^p1 is the old primary of offline shard s1 .*shardguard recover/,
    },
    {
      name: "any node of a shard not migrated to node partitions",
      shard: () => unheard(aShard()),
      node: "r2",
      legacy: true,
      refusal: /^shard s1 is in the older layout.*migrate-layout --shard s1/,
    },
  ])("$name", ({ shard, node, refusal, legacy }) => {
    const snapshot = { ...shard().build(), ...(legacy ? { legacyTopology: true } : {}) };

    const said = retirementRefusal(snapshot, node, config, NOW);

    if (refusal === undefined) expect(said).toBeUndefined();
    else expect(said).toMatch(refusal);
    expect(said ?? "").not.toContain("\n");
  });
});

describe("retirementOf", () => {
  it("conditions the retirement on the epoch, the node's last report and every set listing it, at the versions read", () => {
    const snapshot = unheard(aShard()).guardedBy(["r1", "r2"], 7).build();
    const withOthers = {
      ...snapshot,
      replicaSets: { ...snapshot.replicaSets, r1: ["r2"], r2: ["r1"], old: ["r1"] },
      replicaSetVersions: { ...snapshot.replicaSetVersions, r2: 3 },
    };

    const judged = retirementOf(withOthers, "r2");

    expect(judged).toEqual({
      epoch: 3,
      heartbeatWrittenAt: (NOW - 30_000) * 1000,
      // r1's set was written before the guard: no version. r2's own set goes with its items.
      replicaSets: [
        { primary: "p1", version: 7 },
        { primary: "r1", version: undefined },
      ],
    });
  });
});
