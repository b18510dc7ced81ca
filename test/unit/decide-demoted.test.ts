import { describe, expect, it } from "vitest";
import { decide } from "../../src/core/decide.ts";
import { aConfig, aShard, LINEAGE, NOW } from "../support/builders.ts";

/**
 * Issue 30, finding 4 (guarantee 3): the node the topology names primary answers as a replica
 * (its redis restarted from a config with `replicaof`, or an operator's REPLICAOF). Its heartbeat
 * stays fresh, so it used to be judged healthy for ever while no node took writes.
 */

/** p1 answers as a replica of r1 (link down: r1 follows p1) since `sinceMs` before NOW. */
function aShardWhosePrimaryIsAReplica(
  options: { sinceMs?: number; replId?: string; offset?: number; roleSince?: boolean } = {},
) {
  const { sinceMs = 5_000, replId = "lineage-new", offset = 0, roleSince = true } = options;
  return aShard()
    .withNode({
      node_id: "p1",
      role: "replica",
      repl_id: replId,
      last_txn_id: offset,
      primary_node_id: "r1",
      primary_link: "down",
      ...(roleSince ? { role_since: (NOW - sinceMs) * 1000 } : {}),
    })
    .withNode({ node_id: "r1", primary_link: "down", last_txn_id: 980 })
    .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 990 });
}

describe("decide: a named primary whose database is a replica (gate primary_demoted_grace)", () => {
  it("fails over from a named primary that has answered as a replica for longer than the failure timeout", () => {
    // Prepare
    const snapshot = aShardWhosePrimaryIsAReplica({ sinceMs: 3_500 }).build();

    // Act
    const decision = decide(snapshot, aConfig(), NOW);

    // Assess: the replica holding the most of the followers' lineage, not the empty restart's.
    expect(decision).toMatchObject({
      kind: "failover",
      oldPrimary: "p1",
      target: { node_id: "r2" },
      lineage: { repl_id: LINEAGE, last_txn_id: 990 },
    });
    expect(decision.reason).toMatch(
      /p1's database is a replica \(of r1, link down\) for 3500 ms: it takes no writes/,
    );
  });

  it("waits while the named primary has answered as a replica for less than the failure timeout (a PROMOTE in flight)", () => {
    // Prepare
    const snapshot = aShardWhosePrimaryIsAReplica({ sinceMs: 2_000 }).build();

    // Act
    const decision = decide(snapshot, aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "primary_demoted", primaryStale: false });
    expect(decision.reason).toMatch(/waiting up to 3000 ms for it to be primary again/);
  });

  it("counts a demoted primary's time from the topology's last change when its agent reports no role_since (older agent)", () => {
    // Prepare: the topology changed 60 s ago (the builder's default).
    const snapshot = aShardWhosePrimaryIsAReplica({ roleSince: false }).build();

    // Act
    const decision = decide(snapshot, aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "failover", target: { node_id: "r2" } });
  });

  it("measures lag against a demoted primary that kept the lineage, and takes the shard offline when every replica is too far behind it", () => {
    // Prepare: an operator's REPLICAOF on a primary 4000 ahead of its replicas (beyond maxLagOnFailover 1000).
    const snapshot = aShardWhosePrimaryIsAReplica({ replId: LINEAGE, offset: 5_000 }).build();

    // Act
    const decision = decide(snapshot, aConfig(), NOW);

    // Assess: offline on the lineage up to 5000, from which the demoted node itself comes back.
    expect(decision).toMatchObject({
      kind: "mark_offline",
      lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: 5_000 },
    });
  });

  it("keeps the quorum rule: replicas that still see their link up to a demoted primary fed by a writer do not let it be replaced", () => {
    // Prepare: p1 follows x1 (no node of the shard), link up; r1 and r2 follow p1, links up.
    const snapshot = aShardWhosePrimaryIsAReplica()
      .withNode({ node_id: "p1", primary_node_id: "x1", primary_link: "up" })
      .withNode({ node_id: "r1", primary_link: "up" })
      .withNode({ node_id: "r2", primary_link: "up" })
      .build();

    // Act
    const decision = decide(snapshot, aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "quorum_not_met" });
  });

  // A replica whose link is up to a demoted primary fed by no writer votes it down.
  const fedByNoWriter = [
    {
      name: "replaces a demoted primary in a replication cycle with its replicas' links up (simulator seed 221327)",
      // p1 follows r1, which follows p1 back (Redis 7 keeps both links up).
      p1Link: "up",
      vote: "in a replication cycle",
    },
    {
      name: "replaces a demoted primary that hears no primary itself, its replicas' links up to it (simulator seed 110597)",
      // p1 follows r1 with its link down (r1 never promoted).
      p1Link: "down",
      vote: "a replica hearing no primary",
    },
  ] as const;
  for (const row of fedByNoWriter) {
    it(row.name, () => {
      // Prepare: r1 and r2 follow p1, links up, probes answered.
      const snapshot = aShardWhosePrimaryIsAReplica({ replId: LINEAGE, offset: 990 })
        .withNode({ node_id: "p1", primary_link: row.p1Link })
        .withNode({ node_id: "r1", primary_node_id: "p1", primary_link: "up", primary_probe: "ok" })
        .withNode({ node_id: "r2", primary_node_id: "p1", primary_link: "up", primary_probe: "ok" })
        .build();

      // Act
      const decision = decide(snapshot, aConfig(), NOW);

      // Assess
      expect(decision).toMatchObject({ kind: "failover", oldPrimary: "p1" });
      expect(decision.reason).toContain(
        `2 of 2 fresh replicas report the primary down (r1: follows p1, ${row.vote}`,
      );
    });
  }

  it("does not treat a fresh primary reporting itself primary as demoted", () => {
    // Prepare
    const snapshot = aShard()
      .withNode({ node_id: "p1", role_since: (NOW - 600_000) * 1000 })
      .build();

    // Act
    const decision = decide(snapshot, aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "healthy" });
  });
});

describe("decide: a demoted primary no replica follows any more (simulator seed 7008)", () => {
  /** p1 restarted from an old RDB as a replica of a node on a new lineage; r1, r2 parked (no primary). */
  function aShardWithNoFollowers(ancestry?: { repl_id: string; until: number; by: string }[]) {
    return aShard()
      .withTopology(ancestry === undefined ? {} : { ancestry })
      .withNode({
        node_id: "p1",
        role: "replica",
        repl_id: "lineage-restarted",
        last_txn_id: 500,
        primary_node_id: "r1",
        primary_link: "down",
        role_since: (NOW - 5_000) * 1000,
      })
      .withNode({
        node_id: "r1",
        repl_id: "lineage-restarted",
        last_txn_id: 500,
        primary_node_id: undefined,
        primary_link: "down",
      })
      .withNode({
        node_id: "r2",
        repl_id: "lineage-b",
        last_txn_id: 1300,
        primary_node_id: undefined,
        primary_link: "down",
      });
  }

  it("judges the replacement by the newest lineage of the shard's history, not by the demoted node's new one", () => {
    // Act: LINEAGE -> lineage-b at 1000 (p1's promotion) is the last link recorded.
    const decision = decide(
      aShardWithNoFollowers([{ repl_id: LINEAGE, until: 1000, by: "lineage-b" }]).build(),
      aConfig(),
      NOW,
    );

    // Assess: r2, holding lineage-b to 1300, is promoted; r1 (the restarted lineage) is not.
    expect(decision).toMatchObject({
      kind: "failover",
      target: { node_id: "r2" },
      lineage: { repl_id: "lineage-b", last_txn_id: 1300 },
    });
  });

  it("without a recorded history it judges by the demoted node's own lineage, as before", () => {
    // Act
    const decision = decide(aShardWithNoFollowers().build(), aConfig(), NOW);

    // Assess: r2 is foreign to that lineage.
    expect(decision.kind === "failover" ? decision.target.node_id : undefined).not.toBe("r2");
  });
});

describe("decide: a named primary whose last report, now stale, is an empty replica's (nemesis seed 6302)", () => {
  /**
   * p1, promoted at epoch 8, restarted empty as a replica (its new lineage, offset 0), then was cut
   * off from the store: its last report is stale. r1 and r2 parked when it went, holding LINEAGE.
   */
  function aShardWithAStaleEmptyPrimary(lineage?: { node_id: string; repl_id: string; last_txn_id: number }) {
    return aShard()
      .withTopology(lineage === undefined ? {} : { lineage })
      .withNode({
        node_id: "p1",
        role: "replica",
        repl_id: "lineage-empty",
        last_txn_id: 0,
        primary_node_id: undefined,
        primary_link: "down",
        ageMs: 20_000,
      })
      .withNode({ node_id: "r1", primary_node_id: undefined, primary_link: "down", last_txn_id: 990 })
      .withNode({ node_id: "r2", primary_node_id: undefined, primary_link: "down", last_txn_id: 1000 });
  }

  it("judges by the stored lineage, not the empty process's: the replica holding the most is promoted", () => {
    // Act
    const decision = decide(
      aShardWithAStaleEmptyPrimary({ node_id: "p1", repl_id: LINEAGE, last_txn_id: 1000 }).build(),
      aConfig(),
      NOW,
    );

    // Assess: the code before took lineage-empty from p1's stale report, found r1 and r2 foreign and
    // took the shard offline on it (then back on p1, and both replicas resynced from it empty).
    expect(decision).toMatchObject({
      kind: "failover",
      target: { node_id: "r2" },
      lineage: { repl_id: LINEAGE },
    });
  });

  it("with no stored lineage it judges by the newest lineage of the shard's history (p1's promotion)", () => {
    // Act: LINEAGE-0 -> LINEAGE at 900: the link recorded when p1 was promoted.
    const decision = decide(
      aShardWithAStaleEmptyPrimary()
        .withTopology({ ancestry: [{ repl_id: "lineage-0", until: 900, by: LINEAGE }] })
        .build(),
      aConfig(),
      NOW,
    );

    // Assess
    expect(decision).toMatchObject({
      kind: "failover",
      target: { node_id: "r2" },
      lineage: { repl_id: LINEAGE },
    });
  });
});

describe("decide: a named primary whose last report, now stale or its database down, is a replica's restarted from an RDB (simulator seed 193077)", () => {
  it("judges by the newest lineage of the shard's history, not the restarted process's own: the replica holding the most is promoted", () => {
    // Prepare: p1 killed, back from its RDB (a new id continuing LINEAGE at 900, behind r1 and r2),
    // stepped down as a replica, then hung: its last report stale, its database down.
    const shard = aShard()
      .withTopology({ ancestry: [{ repl_id: "lineage-0", until: 500, by: LINEAGE }] })
      .withNode({
        node_id: "p1",
        role: "replica",
        repl_id: "lineage-p1-rdb",
        last_txn_id: 900,
        prior_lineage: { repl_id: LINEAGE, last_txn_id: 900 },
        primary_node_id: "r1",
        primary_link: "down",
        db_status: "down",
        ageMs: 20_000,
      })
      .withNode({ node_id: "r1", primary_node_id: undefined, primary_link: "down", last_txn_id: 990 })
      .withNode({ node_id: "r2", primary_node_id: undefined, primary_link: "down", last_txn_id: 1000 });

    // Act
    const decision = decide(shard.build(), aConfig(), NOW);

    // Assess: the code before took lineage-p1-rdb from p1's report, found r1 and r2 foreign and took
    // the shard offline on it, then back on p1 (128 writes only r1 and r2 held lost).
    expect(decision).toMatchObject({
      kind: "failover",
      target: { node_id: "r2" },
      lineage: { repl_id: LINEAGE },
    });
  });
});

describe("decide: a demoted primary on the lineage of its promotion that a voter on an earlier lineage's branch finds restarted (simulator seed 7094)", () => {
  /**
   * Seed 7094: n3 (p1 here), promoted on lineage-c, was killed and came back from its RDB holding
   * every write, as a replica (its config's `replicaof`), parked by its agent. n1 (r1), the one
   * fresh voter, was back from an older RDB of lineage-a, the lineage two promotions before
   * (`rdb-branch`, continuing lineage-a up to 2286), and reported p1 "restarted". r2, a member
   * holding every write too, was hung. The shard went offline on r1's lineage, came back on r1,
   * and the full syncs from it wiped p1 and r2: 1,023 acknowledged writes lost.
   */
  function the7094Shard(sinceMs: number) {
    return aShard()
      .withTopology({
        ancestry: [
          { repl_id: LINEAGE, until: 2609, by: "lineage-b" },
          { repl_id: "lineage-b", until: 2655, by: "lineage-c" },
        ],
      })
      .withNode({
        node_id: "p1",
        role: "replica",
        repl_id: "lineage-c",
        last_txn_id: 2777,
        primary_node_id: undefined,
        primary_link: "down",
        primary_probe: "restarted",
        role_since: (NOW - sinceMs) * 1000,
      })
      .withNode({
        node_id: "r1",
        repl_id: "rdb-branch",
        last_txn_id: 2286,
        prior_lineage: { repl_id: LINEAGE, last_txn_id: 2286 },
        primary_node_id: undefined,
        primary_link: "down",
        primary_probe: "restarted",
      })
      .withNode({
        node_id: "r2",
        repl_id: "lineage-c",
        last_txn_id: 2777,
        db_status: "down",
        ageMs: 7600,
        agent_updated: (NOW - 500) * 1000,
        primary_node_id: undefined,
        primary_link: "down",
        primary_probe: "unreachable",
      })
      .guardedBy(["r2"]);
  }

  it("does not take the voter's lineage for the shard's: p1 holds all of r1's data through the shard's history", () => {
    // Act
    const decision = decide(the7094Shard(3_500).build(), aConfig(), NOW);

    // Assess: judged as a demoted primary on its own lineage (the newest of the history), not as a
    // process restarted without its data; on the code before, offline on r1's rdb-branch @ 2286.
    expect(decision.reason).not.toMatch(/restarted on another lineage/);
    expect(decision).toMatchObject({
      kind: "mark_offline",
      lineage: { repl_id: "lineage-c", last_txn_id: 2777 },
    });
  });

  it("brings the offline shard back on p1, which holds every write, not on r1", () => {
    // Prepare: offline on p1's lineage, as the row above marks it.
    const snapshot = the7094Shard(4_500)
      .withTopology({
        status: "offline",
        epoch: 4,
        primary_node_id: undefined,
        primary_address: undefined,
        lineage: { node_id: "p1", repl_id: "lineage-c", last_txn_id: 2777 },
        cooldown_until: NOW - 1000,
      })
      .build();

    // Act
    const decision = decide(snapshot, aConfig(), NOW);

    // Assess
    expect(decision).toMatchObject({ kind: "bring_online", target: { node_id: "p1" } });
  });
});

describe("decide: a demoted primary followed only by a deposed primary on an earlier lineage (nemesis seed 6808)", () => {
  /**
   * Seed 6808, scaled: r2 (node-212r), primary on lineage-a, hung with its agent dead; r1
   * (node-253r) was promoted from lineage-a at 1000 (lineage-b), then p1 (node-2) from lineage-b
   * at 1400 (lineage-c). p1 acknowledged writes with r1, which had full-synced from it, up to 1500;
   * then p1's redis came back from its RDB as a replica (1450, behind), parked by its agent; r1
   * parked when p1's connection closed. r2's agent, back, had it step down to follow p1, the
   * topology's primary: p1, a replica with its link down, refuses its sync, so r2 stays on
   * lineage-a at 1050, past the point (1000) the shard's history left it. The only follower of
   * p1, r2 gave the shard its lineage: r1, holding every write, counted 1000 of lineage-a, r2
   * 1050, and gate outside_set_ahead held for ever (no writable primary for 70 s after heal-all).
   */
  function the6808Shard(r2: { repl_id?: string; last_txn_id?: number } = {}) {
    return aShard()
      .withTopology({
        ancestry: [
          { repl_id: LINEAGE, until: 1000, by: "lineage-b" },
          { repl_id: "lineage-b", until: 1400, by: "lineage-c" },
        ],
      })
      .withNode({
        node_id: "p1",
        role: "replica",
        repl_id: "lineage-c",
        last_txn_id: 1450,
        restarted_behind: { repl_id: "lineage-c", last_txn_id: 1500, last_updated: (NOW - 5_000) * 1000 },
        primary_node_id: undefined,
        primary_link: "down",
        role_since: (NOW - 5_000) * 1000,
      })
      .withNode({
        node_id: "r1",
        repl_id: "lineage-c",
        last_txn_id: 1500,
        primary_node_id: undefined,
        primary_link: "down",
        priority: 50,
      })
      .withNode({
        node_id: "r2",
        repl_id: r2.repl_id ?? LINEAGE,
        last_txn_id: r2.last_txn_id ?? 1050,
        primary_node_id: "p1",
        primary_link: "down",
      })
      .guardedBy(["r1"]);
  }

  it("judges the replacement by the lineage of p1's promotion, not the deposed follower's: the member holding every write is promoted", () => {
    // Act
    const decision = decide(the6808Shard().build(), aConfig(), NOW);

    // Assess: on the code before, `none` / waiting_for_replica (outside_set_ahead) on lineage-a, for ever.
    expect(decision).toMatchObject({
      kind: "failover",
      oldPrimary: "p1",
      target: { node_id: "r1" },
      lineage: { repl_id: "lineage-c", last_txn_id: 1500 },
    });
  });

  it("never promotes the deposed follower in the member's place: with no node holding p1's lineage, no failover to r2", () => {
    // Prepare: r1's heartbeat is gone; r2 holds lineage-a only, none of what p1 acknowledged.
    const snapshot = the6808Shard().build();
    const decision = decide(
      { ...snapshot, nodes: snapshot.nodes.filter((node) => node.node_id !== "r1") },
      aConfig(),
      NOW,
    );

    // Assess
    expect(decision.kind === "failover" ? decision.target.node_id : undefined).toBeUndefined();
    expect(decision.kind === "mark_offline" ? decision.lineage : { repl_id: "lineage-c" }).toMatchObject({
      repl_id: "lineage-c",
    });
  });

  it("still judges by the followers' lineage when the shard's history never continued it (a follower on p1's own lineage ahead is waited for)", () => {
    // Prepare: r2 follows p1 on lineage-c, ahead of r1, outside p1's set.
    const decision = decide(
      the6808Shard({ repl_id: "lineage-c", last_txn_id: 1600 }).build(),
      aConfig(),
      NOW,
    );

    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "waiting_for_replica" });
    expect(decision.reason).toMatch(/r2 \(last_txn_id 1600\), outside p1's replica set, holds more/);
  });
});

describe("decide: a demoted primary on the tip of the shard's history whose only follower never synced from it (simulator seed 7064)", () => {
  it("judges by the history's tip, not the follower's own new id: the parked replica holding every write is promoted", () => {
    // Prepare: p1, promoted on LINEAGE, back from its RDB as a replica still on LINEAGE and parked;
    // r1 back from an RDB far behind (a new id, none of the later writes) stepped down to p1, which
    // refuses its sync (a replica with its link down): r1 names p1, link down, on its own id. r2,
    // parked on LINEAGE, holds every write.
    const shard = aShard()
      .withTopology({ ancestry: [{ repl_id: "lineage-0", until: 500, by: LINEAGE }] })
      .withNode({
        node_id: "p1",
        role: "replica",
        repl_id: LINEAGE,
        last_txn_id: 980,
        primary_node_id: undefined,
        primary_link: "down",
        role_since: (NOW - 10_000) * 1000,
      })
      .withNode({
        node_id: "r1",
        repl_id: "lineage-r1-rdb",
        last_txn_id: 400,
        prior_lineage: { repl_id: "lineage-0", last_txn_id: 400 },
        primary_node_id: "p1",
        primary_link: "down",
      })
      .withNode({ node_id: "r2", primary_node_id: undefined, primary_link: "down", last_txn_id: 1000 });

    // Act
    const decision = decide(shard.build(), aConfig(), NOW);

    // Assess: the code before took lineage-r1-rdb (the lineage p1's followers agree on) and chose r1,
    // r2 "foreign" (in the seed: offline, then back on r1; 1,786 writes only p1 and r2 held lost).
    expect(decision).toMatchObject({
      kind: "failover",
      target: { node_id: "r2" },
      lineage: { repl_id: LINEAGE },
    });
  });
});
