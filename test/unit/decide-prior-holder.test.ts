import { describe, expect, it } from "vitest";
import { decide } from "../../src/core/decide.ts";
import { aConfig, aShard, LINEAGE, NOW } from "../support/builders.ts";

/**
 * Simulator seed 7007 (guarantee 1, 262 acknowledged writes lost): the primary restarted from its
 * RDB takes a new replication id and keeps the old one as `replid2` (Redis 7), its replica adopts
 * the new id, and the shard went offline judging that replica's lineage foreign. A node cut off
 * earlier, behind but on the stored lineage itself, came back and was brought online at once; the
 * replica that held everything full-synced from it. Gate `prior_holder_ahead` holds the shard until
 * the last-resort grace, when the node continuing the lineage is ranked by what it holds.
 */

/**
 * Offline on LINEAGE (up to 1000); r1 on it up to 900; r2 continues it under lineage-b up to `prior`,
 * its report `r2AgeMs` old.
 */
function anOfflineShard(prior: number, offlineForMs = 60_000, r2AgeMs?: number) {
  return aShard()
    .offline()
    .withTopology({ updated_at: NOW - offlineForMs })
    .withNode({ node_id: "p1", ageMs: 10_000 })
    .withNode({ node_id: "r1", last_txn_id: 900, primary_link: "down" })
    .withNode({
      node_id: "r2",
      repl_id: "lineage-b",
      last_txn_id: prior + 100,
      prior_lineage: { repl_id: LINEAGE, last_txn_id: prior },
      ...(r2AgeMs === undefined ? {} : { ageMs: r2AgeMs }),
    })
    .guardedBy(["r1", "r2"])
    .build();
}

describe("decide: an offline shard and a node continuing its lineage under another replication id", () => {
  it("does not bring the shard back on a node behind it before the last-resort grace", () => {
    // Act
    const decision = decide(anOfflineShard(1000), aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "offline_no_candidate" });
    expect(decision.reason).toMatch(
      /not bringing it back on r1 \(last_txn_id 900\) while r2 \(up to 1000 of the lineage, now on lineage-b\) continues the lineage/,
    );
  });

  it("holds it too while that node's report is late (a loaded host), until the grace", () => {
    // Arrange: r2's report older than the failure timeout (3 s), its agent and data not known gone.
    const late = anOfflineShard(1000, 60_000, 5_000);
    // Act
    const decision = decide(late, aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "offline_no_candidate" });
    expect(decision.reason).toMatch(/not bringing it back on r1 \(last_txn_id 900\) while r2 \(up to 1000/);
  });

  it("brings it back on that node, ranked by what it holds, once the grace is over", () => {
    // Act
    const decision = decide(anOfflineShard(1000, 100_000), aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "bring_online", target: { node_id: "r2" } });
  });

  it("brings it back at once on the node of the lineage itself when the other one holds less", () => {
    // Act
    const decision = decide(anOfflineShard(800), aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "bring_online", target: { node_id: "r1" } });
  });
});
