import { describe, expect, it } from "vitest";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { aConfig, aShard, aShardWithStalePrimary, NOW, outcome } from "../support/builders.ts";

/**
 * Issue 30, finding 1 (guarantee 1): a member of the old primary's replica set whose agent is
 * unheard (neither fresh nor current: past its keepalive plus the failure timeout) may still
 * replicate and acknowledge `WAIT`: an agent killed by the OOM killer, an AZ split that cut it from
 * the store but not from the primary. Its offset is unknown, so no replica is promoted in the old
 * primary's place until it reports again or leaves the set. Before the gate, only fresh replicas
 * voted and were ranked, the "ahead replica" wait looked back 3 failure timeouts, and the replica
 * behind was promoted (nemesis seed 29003: 129 replica-acknowledged writes lost).
 */

const KEEPALIVE = 20_000;

/** A replica whose agent (and database answer) was last heard `ageMs` ago, with the default keepalive. */
function silent(nodeId: string, ageMs: number, extra: Partial<HeartbeatInput> = {}) {
  return { node_id: nodeId, ageMs, agent_updated: (NOW - ageMs) * 1000, keepalive_ms: KEEPALIVE, ...extra };
}

/** p1's own agent confirms its database died just now (the crash fast path). */
function crashedPrimary(): Partial<HeartbeatInput> & { node_id: string; ageMs: number } {
  return {
    node_id: "p1",
    ageMs: 600,
    db_status: "down",
    agent_updated: (NOW - 250) * 1000,
    db_crash: {
      state: "refused",
      run_id: "run-1",
      first_seen: (NOW - 400) * 1000,
      last_seen: (NOW - 250) * 1000,
    },
  };
}

describe("decide: a member of the replica set whose agent is unheard (issue 30, finding 1)", () => {
  it.each([
    {
      name: "holds a crash failover while a member's agent is dead (it may hold writes only it acknowledged)",
      build: () =>
        aShard()
          .guardedBy(["r1", "r2"])
          .withNode(crashedPrimary())
          .withNode(silent("r1", 26_000, { last_txn_id: 990 }))
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE }),
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "holds the failover in an AZ split: primary stale, member r1 unheard, r2 fresh with its link down",
      build: () =>
        aShardWithStalePrimary(8000)
          .guardedBy(["r1", "r2"])
          .withNode(silent("r1", KEEPALIVE + 3500, { primary_link: "up", last_txn_id: 995 }))
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE }),
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "fails over to the highest offset once the member reports again",
      build: () =>
        aShardWithStalePrimary(30_000)
          .guardedBy(["r1", "r2"])
          .withNode({ node_id: "r1", primary_link: "down", last_txn_id: 1000, keepalive_ms: KEEPALIVE })
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "a member that reports again behind the other is not the target: the offset ranks",
      build: () =>
        aShardWithStalePrimary(30_000)
          .guardedBy(["r1", "r2"])
          .withNode({ node_id: "r1", primary_link: "down", last_txn_id: 970, keepalive_ms: KEEPALIVE })
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE }),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "an unheard node outside the replica set does not hold the failover",
      build: () =>
        aShardWithStalePrimary(8000)
          .guardedBy(["r2"])
          .withNode(silent("r1", KEEPALIVE + 3500, { last_txn_id: 970 }))
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE }),
      expected: { kind: "failover", target: "r2" },
    },
    {
      // Its offset no more than r2's (one that held more holds the failover: decide-down-ahead.test.ts).
      name: "a member whose agent reports its database dead is heard: its offset is known, no hold",
      build: () =>
        aShardWithStalePrimary(8000)
          .guardedBy(["r1", "r2"])
          .withNode({
            node_id: "r1",
            ageMs: 30_000,
            db_status: "down",
            last_txn_id: 980,
            agent_updated: (NOW - 500) * 1000,
          })
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE }),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "a member without any heartbeat stored holds the failover too",
      build: () =>
        aShardWithStalePrimary(8000)
          .guardedBy(["r2", "r3"])
          .without("r1")
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE }),
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "a healthy primary with an unheard member is healthy (the rule costs nothing while nothing fails)",
      build: () => aShard().guardedBy(["r1", "r2"]).withNode(silent("r1", 60_000)),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "an offline shard is not brought back on a member while another member is unheard",
      build: () =>
        aShardWithStalePrimary(60_000)
          .offline()
          .guardedBy(["r1", "r2"])
          .withNode(silent("r1", 40_000, { last_txn_id: 995 }))
          .withNode({ node_id: "r2", last_txn_id: 1000, keepalive_ms: KEEPALIVE }),
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "an offline shard comes back on the old primary itself on its own run, members unheard or not",
      build: () =>
        aShardWithStalePrimary(60_000)
          .offline()
          .guardedBy(["r1", "r2"])
          .withNode({ node_id: "p1", ageMs: 100, role: "primary", last_txn_id: 1000 })
          .withNode(silent("r1", 40_000, { last_txn_id: 995 })),
      expected: { kind: "bring_online", target: "p1" },
    },
    {
      name: "an old primary back from its RDB as a replica (its replication id, an older offset) is not on its own run: held while a member is unheard (nemesis seed 4202)",
      build: () =>
        aShardWithStalePrimary(60_000)
          .offline()
          .guardedBy(["r1", "r2"])
          .withNode({
            node_id: "p1",
            ageMs: 100,
            role: "replica",
            primary_node_id: "r1",
            primary_link: "down",
            last_txn_id: 1000,
          })
          .withNode(silent("r1", 40_000, { last_txn_id: 1200 })),
      expected: { kind: "none", code: "member_unheard" },
    },
  ])("$name", ({ build, expected }) => {
    // Act
    const decision = decide(build().build(), aConfig(), NOW);
    // Assess
    expect(outcome(decision)).toMatchObject(expected);
    expect(decision.reason.length).toBeGreaterThan(10);
  });

  it("names the member, how long it has been unheard and the assumption in the reason", () => {
    // Prepare
    const snapshot = aShardWithStalePrimary(8000)
      .guardedBy(["r1", "r2"])
      .withNode(silent("r1", 42_000, { last_txn_id: 995 }))
      .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 980, keepalive_ms: KEEPALIVE })
      .build();
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "member_unheard", primaryStale: true });
    expect(decision.reason).toContain("not promoting r2");
    expect(decision.reason).toContain("member r1 of p1's replica set unheard for 42 s");
    expect(decision.reason).toContain("it may hold acknowledged writes");
    expect(decision.reason).toContain("docs/safety.md");
  });
});
