import { describe, expect, it } from "vitest";
import type { Decision } from "../../src/core/decide/decision.ts";
import { decide } from "../../src/core/decide.ts";
import type { LineageLink } from "../../src/core/identity.ts";
import { aConfig, aShard, LINEAGE, NOW, outcome } from "../support/builders.ts";

/**
 * Nemesis seed 5805 (guarantee 1, 296 acknowledged writes lost): the shard went offline judged by
 * the lineage a stale follower still showed (p1's before its promotion), while the one node that
 * held the writes acknowledged since had full-synced from p1 after that promotion: its replication
 * id was p1's new one. Judged "foreign", it was passed over and the shard came back on the stale
 * node, from which it resynced. The shard's lineage history (`topology.ancestry`, one link per
 * change of primary) shows the new id continues the old one: a node on it holds the lineage.
 */

const LATER = "lineage-c";

/** What each eligible candidate of a bring-online holds of the stored lineage. */
function heldBy(decision: Decision): Record<string, number> {
  if (decision.kind !== "bring_online") throw new Error(`expected a bring-online, got ${decision.kind}`);
  return Object.fromEntries(
    decision.candidates.filter((candidate) => candidate.eligible).map((c) => [c.node_id, c.last_txn_id]),
  );
}

/** Offline on LINEAGE up to 1000; p1 restarted empty; r1 on LINEAGE at 990; r2 on LATER at 1330. */
function anOfflineShard(options: { ancestry?: LineageLink[]; offlineForMs?: number } = {}) {
  const { ancestry, offlineForMs = 10_000 } = options;
  return aShard()
    .offline(1000)
    .withTopology({ updated_at: NOW - offlineForMs, ...(ancestry === undefined ? {} : { ancestry }) })
    .withNode({
      node_id: "p1",
      role: "replica",
      repl_id: "lineage-empty",
      last_txn_id: 0,
      primary_node_id: "r2",
      primary_link: "down",
    })
    .withNode({ node_id: "r1", last_txn_id: 990, primary_link: "down" })
    .withNode({ node_id: "r2", repl_id: LATER, last_txn_id: 1330, primary_link: "down", priority: 1 })
    .build();
}

describe("decide: an offline shard judged by a lineage the shard's history shows continued (nemesis seed 5805)", () => {
  it.each([
    {
      name: "brings it back on the node of the later lineage, which holds every write of the judged one and more",
      ancestry: [{ repl_id: LINEAGE, until: 1000, by: LATER }],
      expected: { kind: "bring_online", target: "r2" },
    },
    {
      name: "without the link (its read failed), that node's lineage is foreign as before",
      ancestry: undefined,
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "a later lineage off the main line (a promotion the shard moved on from) stays foreign",
      ancestry: [
        { repl_id: LINEAGE, until: 1000, by: LATER },
        { repl_id: LINEAGE, until: 1000, by: "lineage-d" },
      ],
      expected: { kind: "bring_online", target: "r1" },
    },
  ])("$name", ({ ancestry, expected }) => {
    // Act
    const decision = decide(anOfflineShard(ancestry === undefined ? {} : { ancestry }), aConfig(), NOW);

    // Assess
    expect(outcome(decision)).toEqual(expected);
  });

  it("ranks the later lineage's node by its own offset, priority only among equals", () => {
    // Act
    const decision = decide(
      anOfflineShard({ ancestry: [{ repl_id: LINEAGE, until: 1000, by: LATER }] }),
      aConfig(),
      NOW,
    );

    // Assess: r2 (priority 1, 1330) over r1 (priority 100, 990); the lag reference is r2's offset.
    expect(decision).toMatchObject({ kind: "bring_online", target: { node_id: "r2" } });
    expect(heldBy(decision)).toEqual({ r2: 1330, r1: 990 });
  });
});

describe("decide: the offline last resort and a node on an earlier lineage of the stored one (ancestor case)", () => {
  /**
   * Offline on LATER up to `stored` (LINEAGE -> LATER at 1000: a promotion); only r1 left, on
   * LINEAGE at `offset` (restarted from an RDB saved before the promotion).
   */
  function anAncestorShard(offset: number, offlineForMs: number, stored = 1000) {
    return aShard()
      .without("r2")
      .withTopology({
        status: "offline",
        primary_node_id: undefined,
        primary_address: undefined,
        lineage: { node_id: "p1", repl_id: LATER, last_txn_id: stored },
        ancestry: [{ repl_id: LINEAGE, until: 1000, by: LATER }],
        updated_at: NOW - offlineForMs,
      })
      .withNode({ node_id: "p1", ageMs: 600_000 })
      .withNode({ node_id: "r1", last_txn_id: offset, primary_link: "down" })
      .build();
  }

  it("waits through the grace for a node with more to return", () => {
    // Act
    const decision = decide(anAncestorShard(1000, 10_000), aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "none" });
  });

  it("brings it back on that node past the grace, holding the stored lineage up to its offset", () => {
    // Act: the later lineage took nothing past the promotion (stored at 1000); r1 holds to 1000.
    const decision = decide(anAncestorShard(1000, 100_000), aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "bring_online", target: { node_id: "r1" } });
    expect(heldBy(decision)).toEqual({ r1: 1000 });
  });

  it("takes a database restarted from that RDB as a primary (a new id, the RDB's as its earlier one) past the grace", () => {
    // Prepare: Redis 7 loads an RDB into a master under a new replication id, keeping the RDB's as replid2.
    const restarted = (offlineForMs: number) =>
      aShard()
        .without("r2")
        .withTopology({
          status: "offline",
          primary_node_id: undefined,
          primary_address: undefined,
          lineage: { node_id: "p1", repl_id: LATER, last_txn_id: 1000 },
          ancestry: [{ repl_id: LINEAGE, until: 1000, by: LATER }],
          updated_at: NOW - offlineForMs,
        })
        .withNode({ node_id: "p1", ageMs: 600_000 })
        .withNode({
          node_id: "r1",
          role: "primary",
          repl_id: "lineage-rdb",
          last_txn_id: 1000,
          prior_lineage: { repl_id: LINEAGE, last_txn_id: 1000 },
          primary_node_id: undefined,
          primary_link: undefined,
        })
        .build();

    // Act
    const before = decide(restarted(10_000), aConfig(), NOW);
    const after = decide(restarted(100_000), aConfig(), NOW);

    // Assess
    expect(before).toMatchObject({ kind: "none" });
    expect(after).toMatchObject({ kind: "bring_online", target: { node_id: "r1" } });
    expect(heldBy(after)).toEqual({ r1: 1000 });
  });

  it("ranks one short of the stored lineage's offset by what it holds, within the lag bound (the last resort's trade)", () => {
    // Act: r1 10 bytes short of the stored offset; then 500 short under a lag bound of 300.
    const short = decide(anAncestorShard(990, 600_000), aConfig(), NOW);
    const beyond = decide(anAncestorShard(1000, 600_000, 1500), aConfig({ maxLagOnFailover: 300 }), NOW);

    // Assess
    expect(short).toMatchObject({ kind: "bring_online", target: { node_id: "r1" } });
    expect(heldBy(short)).toEqual({ r1: 990 });
    expect(beyond).toMatchObject({ kind: "none" });
    expect(beyond.reason).toMatch(/r1: lag 500 exceeds maxLagOnFailover 300/);
  });
});

describe("decide: the offline last resort ranks a node by the most of the stored lineage any of its lineages holds (simulator seed 7135)", () => {
  const EARLIER = "lineage-p";
  /**
   * Offline on LATER up to 1100 (EARLIER -> LINEAGE at 400: r1's promotion; LINEAGE -> LATER at
   * 1000: p1's). r1, the primary deposed at 1000, now a replica parked on LINEAGE at 1000 with
   * EARLIER as its earlier lineage; r2 restarted from an RDB of LINEAGE saved at 900, a primary
   * under a new id. p1, which took LATER past 1000, restarted empty and is unheard since.
   */
  function aShardOfTwoRestarts(offlineForMs: number) {
    return aShard()
      .withTopology({
        status: "offline",
        primary_node_id: undefined,
        primary_address: undefined,
        lineage: { node_id: "p1", repl_id: LATER, last_txn_id: 1100 },
        ancestry: [
          { repl_id: EARLIER, until: 400, by: LINEAGE },
          { repl_id: LINEAGE, until: 1000, by: LATER },
        ],
        updated_at: NOW - offlineForMs,
      })
      .withNode({ node_id: "p1", repl_id: "lineage-empty", last_txn_id: 0, ageMs: 600_000 })
      .withNode({
        node_id: "r1",
        repl_id: LINEAGE,
        last_txn_id: 1000,
        prior_lineage: { repl_id: EARLIER, last_txn_id: 400 },
        primary_link: "down",
      })
      .withNode({
        node_id: "r2",
        role: "primary",
        repl_id: "lineage-rdb",
        last_txn_id: 900,
        prior_lineage: { repl_id: LINEAGE, last_txn_id: 900 },
        primary_node_id: undefined,
        primary_link: undefined,
      })
      .build();
  }

  it("brings it back past the grace on the node whose own lineage holds the most, not by its earlier one", () => {
    // Act
    const decision = decide(aShardOfTwoRestarts(100_000), aConfig(), NOW);

    // Assess: on the code before, r1 ranked 400 (its earlier lineage) and r2 (900) was brought back.
    expect(decision).toMatchObject({ kind: "bring_online", target: { node_id: "r1" } });
    expect(heldBy(decision)).toEqual({ r1: 1000, r2: 900 });
  });

  it("waits through the grace, naming that node as the last resort", () => {
    // Act
    const decision = decide(aShardOfTwoRestarts(10_000), aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "none" });
    expect(decision.reason).toMatch(/r1 holds the lineage up to 1000 as its earlier one/);
  });
});
