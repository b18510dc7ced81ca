import { describe, expect, it } from "vitest";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { aConfig, aShard, aShardWithStalePrimary, NOW, outcome } from "../support/builders.ts";

/**
 * Nemesis seed 4401 (guarantee 1; issue 30, finding 1 family): the primary's agent dropped r2 from
 * its replica set while r2 lagged for a moment, and was killed a second later. r2 resumed
 * acknowledging the primary's writes: Redis counts it in `WAIT` and in `min-replicas-to-write`,
 * and nobody was left to demand it or record it. An AZ split then cut r1 from the primary, r2's
 * agent fell unheard, and r1, the one member, was promoted: 139 acknowledged writes lost. Now a
 * replica outside the set whose agent is unheard and whose last report, written after the old
 * primary's agent's last one, followed it with its link up holds the change of primary (gates
 * `follower_unheard`, `follower_unheard_offline`, `follower_unheard_retarget`).
 */

const KEEPALIVE = 20_000;

/** A replica whose agent wrote `ageMs` ago, following p1 with its link as given. */
function follower(nodeId: string, ageMs: number, extra: Partial<HeartbeatInput> = {}) {
  return {
    node_id: nodeId,
    ageMs,
    agent_updated: (NOW - ageMs) * 1000,
    primary_link: "up" as const,
    last_txn_id: 1010,
    keepalive_ms: KEEPALIVE,
    ...extra,
  };
}

/** A member whose link to p1 is down (cut off from it), heard this cycle. */
function member(nodeId: string, lastTxnId: number, extra: Partial<HeartbeatInput> = {}) {
  return {
    node_id: nodeId,
    primary_link: "down" as const,
    last_txn_id: lastTxnId,
    keepalive_ms: KEEPALIVE,
    ...extra,
  };
}

/** p1's agent last wrote 60 s ago (killed); r1 its one member, cut off from it. */
function split(followerAgeMs: number, extra: Partial<HeartbeatInput> = {}) {
  return aShardWithStalePrimary(60_000)
    .guardedBy(["r1"])
    .withNode({ node_id: "p1", ageMs: 60_000, agent_updated: (NOW - 60_000) * 1000 })
    .withNode(member("r1", 1000))
    .withNode(follower("r2", followerAgeMs, extra));
}

/** Offline, p1's agent killed 60 s ago, r1 its one member and the target, cut off from it; `r2` outside the set. */
function offlineOnMember(r2: Partial<HeartbeatInput> & { node_id: string; ageMs?: number }) {
  return aShardWithStalePrimary(60_000)
    .offline()
    .guardedBy(["r1"])
    .withNode({ node_id: "p1", ageMs: 60_000, agent_updated: (NOW - 60_000) * 1000 })
    .withNode(member("r1", 1000))
    .withNode(r2);
}

describe("decide: a replica outside the set followed the old primary after its agent's last report (nemesis 4401)", () => {
  it.each([
    {
      name: "holds the failover while that replica's agent is unheard",
      build: () => split(40_000),
      expected: { kind: "none", code: "follower_unheard" },
    },
    {
      name: "fails over when the follower's report is dated even 2 s before the primary's last (that report dropped or never saw it; deposed-primary.test.ts's shape)",
      build: () => split(62_000),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over when the primary's agent reported after the follower's last report (it would have demanded it)",
      build: () => split(70_000),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over when the follower's last report had its link down",
      build: () => split(40_000, { primary_link: "down" }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over when the follower's last report followed another node",
      build: () => split(40_000, { primary_node_id: "r1" }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "waits for the follower's report, not this gate, while it is quiet within its keepalive",
      build: () => split(10_000),
      expected: { kind: "none", code: "awaiting_reports" },
    },
    {
      name: "holds while the follower's agent is heard but its last report, behind the member's offset and not a fresh vote, had its link up (no final offset: a fresh-clone CI run promoted the member 0.9 s after such a report), and heard on an old database answer it is asked to report first (gate quiet_replicas, nemesis 7335)",
      build: () => split(40_000).withNode({ ...follower("r2", 900, { last_txn_id: 990 }), ageMs: 3_500 }),
      expected: { kind: "none", code: "awaiting_reports" },
    },
    {
      name: "a heard follower fewer than the members cut off from the primary cannot meet its guard: failover",
      build: () =>
        split(40_000)
          .guardedBy(["r1", "r3"])
          .withNode(member("r3", 1000))
          .withNode({ ...follower("r2", 200, { last_txn_id: 990 }), ageMs: 1_500 }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "a heard follower fewer than the members cut off holds while its fresh probe finds the primary taking writes (the guard met within the lag window, nemesis 7342)",
      build: () =>
        split(40_000)
          .guardedBy(["r1", "r3"])
          .withNode(member("r3", 1000))
          .withNode({ ...follower("r2", 200, { last_txn_id: 990, primary_probe: "ok" }), ageMs: 1_500 }),
      expected: { kind: "none", code: "follower_unheard" },
    },
    {
      name: "an unheard follower holds however many members are cut off (its acknowledgements are unknown)",
      build: () => split(40_000).guardedBy(["r1", "r3"]).withNode(member("r3", 1000)),
      expected: { kind: "none", code: "follower_unheard" },
    },
    {
      name: "once its agent reports again this gate lets go: ahead of the member and outside the set, gate outside_set_ahead waits",
      build: () => split(40_000).withNode(follower("r2", 200, { primary_link: "down" })),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "a member's probe found the primary refusing every write at an offset the candidate holds: failover",
      build: () =>
        split(40_000).withNode(
          member("r1", 1000, { primary_link: "up", primary_probe: "fenced", primary_probe_offset: 1000 }),
        ),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "a member is the member gate's, not this one's",
      build: () => split(40_000).guardedBy(["r1", "r2"]),
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "without a replica set under the guard nothing is outside it (as for members)",
      build: () =>
        aShardWithStalePrimary(60_000)
          .withNode({ node_id: "p1", ageMs: 60_000, agent_updated: (NOW - 60_000) * 1000 })
          .withNode(member("r1", 1000))
          .withNode(follower("r2", 40_000)),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "an offline shard is not brought back on a replica while such a follower is unheard",
      build: () =>
        aShardWithStalePrimary(60_000)
          .offline()
          .guardedBy(["r1"])
          .withNode({ node_id: "p1", ageMs: 60_000, agent_updated: (NOW - 60_000) * 1000 })
          .withNode({ node_id: "r1", last_txn_id: 1000, keepalive_ms: KEEPALIVE })
          .withNode(follower("r2", 40_000)),
      expected: { kind: "none", code: "follower_unheard" },
    },
    {
      name: "an offline shard is not brought back on a member while a heard follower's last report, on an old database answer, had its link up: it is asked to report",
      build: () => offlineOnMember({ ...follower("r2", 900, { last_txn_id: 990 }), ageMs: 3_500 }),
      expected: { kind: "none", code: "awaiting_reports" },
    },
    {
      name: "an offline shard is brought back on the member once that heard follower reports its link down",
      build: () => offlineOnMember(follower("r2", 200, { last_txn_id: 990, primary_link: "down" })),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "an offline shard is brought back on a deposing target past a heard follower",
      build: () =>
        aShardWithStalePrimary(60_000)
          .offline()
          .guardedBy([])
          .withNode({ node_id: "p1", ageMs: 60_000, agent_updated: (NOW - 60_000) * 1000 })
          .withNode({
            node_id: "r1",
            last_txn_id: 1000,
            primary_link: "up",
            primary_probe: "ok",
            keepalive_ms: KEEPALIVE,
          })
          .withNode({ ...follower("r2", 200, { last_txn_id: 990 }), ageMs: 1_500 }),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "a healthy primary with an unheard follower is healthy (the rule costs nothing while nothing fails)",
      build: () =>
        aShard()
          .guardedBy(["r1"])
          .withNode(member("r1", 1000, { primary_link: "up" }))
          .withNode(follower("r2", 40_000)),
      expected: { kind: "none", code: "healthy" },
    },
  ])("$name", ({ build, expected }) => {
    // Act
    const decision = decide(build().build(), aConfig(), NOW);
    // Assess
    expect(outcome(decision)).toMatchObject(expected);
    expect(decision.reason.length).toBeGreaterThan(10);
  });

  it("names the follower, its last report, the ways the hold ends and the assumption in the reason", () => {
    // Prepare
    const snapshot = split(40_000).build();
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "follower_unheard", primaryStale: true });
    expect(decision.reason).toContain("not promoting r1");
    expect(decision.reason).toContain("r2, outside p1's replica set, its agent last heard 40 s ago");
    expect(decision.reason).toContain("following p1 with its link up, last_txn_id 1010");
    expect(decision.reason).toContain("waiting for its agent to report its link down");
    expect(decision.reason).toContain("docs/safety.md");
  });
});
