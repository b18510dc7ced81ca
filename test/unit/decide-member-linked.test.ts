import { describe, expect, it } from "vitest";
import { decideContinuation } from "../../src/core/continuation.ts";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import {
  aConfig,
  aHealthyShard,
  aShard,
  aShardWithStalePrimary,
  NOW,
  outcome,
  type ShardBuilder,
} from "../support/builders.ts";

/**
 * Gate `member_linked` (guarantee 1; `member_linked_retarget`, `member_linked_offline`). Nemesis
 * seed 7342 lost 77 replica-acknowledged writes: primary node-114r, cut from the store and from
 * members node-2 and node-239r, kept taking writes that member node-261b (fresh, its link to
 * node-114r up, its probe finding it taking writes) acknowledged; node-239r was promoted on "2 of 3
 * fresh replicas report the primary down" 1.4 s after the cut, past node-261b, whose reported offset
 * was no final one. Here p1 is node-114r, r1 and r2 the members cut off, r3 node-261b.
 */

const config = aConfig();

type Node = Partial<HeartbeatInput>;

/** p1 stale; r1 and r2 fresh, voting it down (link down); r3 fresh, linked, its probe finding p1 taking writes. */
function split(r3: Node = {}, shard: ShardBuilder = aShardWithStalePrimary()): ShardBuilder {
  return shard
    .guardedBy(["r1", "r2", "r3"])
    .withNode({ node_id: "r1", primary_link: "down", primary_probe: "unreachable", last_txn_id: 1000 })
    .withNode({ node_id: "r2", primary_link: "down", primary_probe: "unreachable", last_txn_id: 990 })
    .withNode({
      node_id: "r3",
      primary_link: "up",
      primary_probe: "ok",
      primary_probe_offset: 995,
      last_txn_id: 995,
      ...r3,
    });
}

describe("decide: a member linked to a stale primary that takes writes (gate member_linked, nemesis 7342)", () => {
  it.each([
    {
      name: "holds the failover while r3, fresh, follows p1 with its link up and its probe finds p1 taking writes (7342: was a failover to r1)",
      shard: () => split(),
      expected: { kind: "none", code: "awaiting_reports" },
    },
    {
      name: "holds also when r3 reports no more than the candidate: its offset is no final one",
      shard: () => split({ last_txn_id: 900, primary_probe_offset: 900 }),
      expected: { kind: "none", code: "awaiting_reports" },
    },
    {
      name: "under quorum all, r3's vote of p1 up stops the failover first (gate quorum, not member_linked)",
      shard: () => split(),
      config: aConfig({ quorum: "all" }),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "r3's probe finds p1 refusing every write at an offset the candidate holds: failover to r1",
      shard: () => split({ primary_probe: "fenced", primary_probe_offset: 1000, last_txn_id: 995 }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "r3's probe finds p1 refusing at an offset past the candidate's: r3, holding it, ranks first",
      shard: () => split({ primary_probe: "fenced", primary_probe_offset: 1010, last_txn_id: 1010 }),
      expected: { kind: "failover", target: "r3" },
    },
    {
      name: "r3's link drops: its offset is final and ranks, the failover goes to the node holding the most",
      shard: () => split({ primary_link: "down", primary_probe: "unreachable", last_txn_id: 1005 }),
      expected: { kind: "failover", target: "r3" },
    },
    {
      name: "p1 heard fresh as a replica of r3 (a replication cycle): it takes no write, r3 is not waited for",
      shard: () =>
        split().withNode({
          node_id: "p1",
          ageMs: 0,
          role: "replica",
          primary_node_id: "r3",
          primary_link: "up",
        }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "r3's link drops behind the candidate: failover to r1",
      shard: () => split({ primary_link: "down", primary_probe: "unreachable", last_txn_id: 900 }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "r3's probe goes down with its link up: a down vote, failover ranked by offset",
      shard: () => split({ primary_probe: "unreachable" }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "the candidate itself linked does not hold its own promotion",
      shard: () =>
        split({ primary_link: "down", primary_probe: "unreachable", last_txn_id: 900 }).withNode({
          node_id: "r1",
          primary_link: "up",
          primary_probe: "ok",
          primary_probe_offset: 1000,
        }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "a linked replica outside the set, its probe finding p1 taking writes, is follower_unheard's, not member_linked's",
      shard: () => split().guardedBy(["r1", "r2"]),
      expected: { kind: "none", code: "follower_unheard" },
    },
    {
      name: "a healthy shard, every member linked and probing ok: healthy",
      shard: () =>
        aHealthyShard()
          .guardedBy(["r1", "r2", "r3"])
          .withNode({ node_id: "r1", primary_probe: "ok" })
          .withNode({ node_id: "r2", primary_probe: "ok" })
          .withNode({ node_id: "r3", primary_probe: "ok", last_txn_id: 995 }),
      expected: { kind: "none", code: "healthy" },
    },
  ])("$name", ({ shard, expected, ...row }) => {
    const rowConfig = "config" in row && row.config !== undefined ? row.config : config;
    expect(outcome(decide(shard().build(), rowConfig, NOW))).toEqual(expected);
  });

  it("names the linked member, asks it to report, and says what ends the wait", () => {
    const decision = decide(split().build(), config, NOW);
    expect(decision).toMatchObject({
      kind: "none",
      code: "awaiting_reports",
      awaiting: ["r3"],
      primaryStale: true,
    });
    expect(decision.reason).toContain(
      "not promoting r1 (last_txn_id 1000) while member r3 of p1's replica set (its fresh report: following p1 with its link up, its probe found it taking writes, last_txn_id 995)",
    );
    expect(decision.reason).toContain("waiting for its probe to find p1 refusing every write");
  });

  it("says the refusing-primary proof let the candidate past the linked member's earlier report", () => {
    const decision = decide(
      split({ primary_probe: "fenced", primary_probe_offset: 1000 })
        .withNode({ node_id: "r2", primary_link: "up", primary_probe: "ok" })
        .build(),
      config,
      NOW,
    );
    expect(decision).toMatchObject({ kind: "failover", target: expect.objectContaining({ node_id: "r1" }) });
    expect(decision.reason).toContain("r3's probe found p1 refusing every write at offset 1000");
  });
});

describe("decide: the crash fast path with a member linked (gate crash_unconfirmed first)", () => {
  /** p1 fresh, its agent confirming its process dead. */
  const crashed = {
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
  } as const;

  it.each([
    {
      name: "a fresh member with its link up holds the fast path as crash_unconfirmed, never member_linked",
      shard: () => split({}, aShard().withNode(crashed)),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "every fresh member sees the link down: the crash failover goes ahead, ranked by offset",
      shard: () => split({ primary_link: "down", primary_probe: "unreachable" }, aShard().withNode(crashed)),
      expected: { kind: "failover", target: "r1" },
    },
  ])("$name", ({ shard, expected }) => {
    expect(outcome(decide(shard().build(), config, NOW))).toEqual(expected);
  });
});

describe("decide: an offline shard and a member linked to the old primary (gate member_linked_offline)", () => {
  /** The shard offline on p1's lineage; p1's agent cut off (its heartbeat stale), its database still serving r3. */
  const offline = (r3: Node = {}) => split(r3, aShardWithStalePrimary(30_000).offline(1000));

  it.each([
    {
      name: "not brought back on r1 while r3 follows p1 with its link up and finds it taking writes",
      shard: () => offline(),
      expected: { kind: "none", code: "awaiting_reports" },
    },
    {
      name: "brought back on r1 once r3's probe finds p1 refusing at an offset r1 holds",
      shard: () => offline({ primary_probe: "fenced", primary_probe_offset: 1000 }),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "brought back on r1 once r3's link drops behind it",
      shard: () => offline({ primary_link: "down", primary_probe: "unreachable" }),
      expected: { kind: "bring_online", target: "r1" },
    },
  ])("$name", ({ shard, expected }) => {
    expect(outcome(decide(shard().build(), config, NOW))).toEqual(expected);
  });
});

describe("decideContinuation: a retarget past a member linked to the old primary (gate member_linked_retarget)", () => {
  /** p1 stale; the failover to r1 past PROMOTE, r1's database died (its agent still reports). */
  const targetDown = (r3: Node = {}) =>
    split(r3)
      .failingOver("confirm")
      .withNode({ node_id: "r1", ageMs: 10_000, db_status: "down", agent_updated: (NOW - 200) * 1000 });

  it.each([
    {
      name: "waits while r3, behind r2, follows p1 with its link up and finds it taking writes",
      shard: () => targetDown({ last_txn_id: 900, primary_probe_offset: 900 }),
      expected: { kind: "wait", code: "awaiting_reports", awaiting: ["r3"] },
    },
    {
      name: "r3 holding the most is the replacement itself: it holds what it acknowledged",
      shard: () => targetDown(),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r3" }) },
    },
    {
      name: "retargets to r2 once r3's link drops behind it",
      shard: () => targetDown({ primary_link: "down", primary_probe: "unreachable", last_txn_id: 900 }),
      expected: { kind: "replan" },
    },
  ])("$name", ({ shard, expected }) => {
    expect(decideContinuation(shard().build(), config, NOW, { confirmTimeoutMs: 7000 })).toMatchObject(
      expected,
    );
  });
});
