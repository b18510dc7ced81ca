import { describe, expect, it } from "vitest";
import { DOWN_AHEAD_GRACE } from "../../src/core/decide/replacing.ts";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { aConfig, aShard, aShardWithStalePrimary, LINEAGE, NOW, outcome } from "../support/builders.ts";

/**
 * Nemesis seed 6803 (guarantee 1, 23 replica-acknowledged writes lost): primary node-1's only
 * replica node-2 acknowledged 23 writes, was killed and restarted from its RDB as a replica of
 * node-1 (same replication id, 1,837 bytes behind its last answer), and node-1 hung 200 ms later.
 * The shard went offline (node-2's database down, no fresh replica) and 1.6 s later was brought
 * back on node-2, its database answering again: no gate looked at what node-2's dead process had
 * answered, and node-1, the only copy left, later resynced from it. Now the agent reports a
 * restart behind its last answer (`restarted_behind`), and `replica_down_ahead` (online) and
 * `replica_down_ahead_offline` hold for it, the candidate itself included.
 */

const CONFIG = aConfig();
const GRACE_MS = DOWN_AHEAD_GRACE * CONFIG.failureTimeoutMs;

function behind(answeredAgoMs: number, offset = 1200): Partial<HeartbeatInput> {
  return {
    restarted_behind: { repl_id: LINEAGE, last_txn_id: offset, last_updated: (NOW - answeredAgoMs) * 1000 },
  };
}

/** Offline on p1's lineage up to 1200 (p1 hung: database down, its agent heard); r2, its one member, back at 1000. */
function offlineShard(r2: Partial<HeartbeatInput>) {
  return aShard()
    .offline(1200)
    .withTopology({ updated_at: NOW - 2_000 })
    .without("r1")
    .withNode({
      node_id: "p1",
      role: "primary",
      db_status: "down",
      ageMs: 3_000,
      agent_updated: (NOW - 500) * 1000,
      last_txn_id: 1200,
    })
    .withNode({ node_id: "r2", last_txn_id: 1000, primary_link: "down", ...r2 })
    .guardedBy(["r2"]);
}

/** Online, p1 stale; r2, its one member, back at 1000 with its link down. */
function onlineShard(r2: Partial<HeartbeatInput>) {
  return aShardWithStalePrimary(10_000)
    .without("r1")
    .withNode({ node_id: "p1", last_txn_id: 1200 })
    .withNode({ node_id: "r2", last_txn_id: 1000, primary_link: "down", ...r2 })
    .guardedBy(["r2"]);
}

describe("decide: a replica back from its RDB behind what it last answered (nemesis 6803)", () => {
  it.each([
    {
      name: "offline: does not bring the shard back on it within the grace (6803: node-2 brought online 2.9 s after its last answer)",
      build: () => offlineShard(behind(3_000)),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "offline: brings it back past the grace",
      build: () => offlineShard(behind(GRACE_MS + 1_000)),
      expected: { kind: "bring_online", target: "r2" },
    },
    {
      name: "offline: brings it back when its last answer held no more than it holds now",
      build: () => offlineShard(behind(3_000, 1000)),
      expected: { kind: "bring_online", target: "r2" },
    },
    {
      name: "offline: brings it back with no restart reported (a replica merely behind a hung primary)",
      build: () => offlineShard({}),
      expected: { kind: "bring_online", target: "r2" },
    },
    {
      name: "online: does not promote it within the grace (the candidate itself counts)",
      build: () => onlineShard(behind(3_000)),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "online: promotes it past the grace",
      build: () => onlineShard(behind(GRACE_MS + 1_000)),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "online: promotes it with no restart reported",
      build: () => onlineShard({}),
      expected: { kind: "failover", target: "r2" },
    },
  ])("$name", ({ build, expected }) => {
    expect(outcome(decide(build().build(), CONFIG, NOW))).toEqual(expected);
  });

  it("says what it waits for", () => {
    const decision = decide(offlineShard(behind(3_000)).build(), CONFIG, NOW);
    expect(decision.reason).toContain(
      "not bringing it back on r2 (last_txn_id 1000) while r2 (database restarted behind its last answer: up to 1000 now, 1200 3000 ms ago)",
    );
    expect(decision.reason).toContain("for the old primary p1 to return");
  });
});

/**
 * Nemesis seed 7214 (guarantee 1, 11 replica-acknowledged writes lost): primary p1's one replica,
 * r2 (priority 0, outside p1's empty replica set), acknowledged writes; p1's database came back from
 * its RDB as a replica, behind what it last answered, and r2's agent went stale under a slow store.
 * The shard, offline, was brought back on p1 itself: `replica_down_ahead_offline` skipped the old
 * primary even as the target, and every other gate counted fresh nodes or members only. r2 later
 * resynced from p1. Now the old primary as the target counts, as any candidate back behind its last
 * answer does.
 */
type NodeInput = Partial<HeartbeatInput> & { ageMs?: number };

function offlineOnOldPrimary(p1: NodeInput, r2: NodeInput = { ageMs: 8_000 }) {
  return aShard()
    .offline(1200)
    .withTopology({ updated_at: NOW - 2_000 })
    .without("r1")
    .withNode({
      node_id: "p1",
      role: "replica",
      primary_node_id: undefined,
      primary_link: "down",
      last_txn_id: 1000,
      ...p1,
    })
    .withNode({ node_id: "r2", priority: 0, last_txn_id: 1200, primary_link: "down", ...r2 })
    .guardedBy([]);
}

describe("decide: the old primary back from its RDB behind what it last answered, as the target (nemesis 7214)", () => {
  it.each([
    {
      name: "does not bring the shard back on it within the grace while the replica that followed it is stale (7214)",
      build: () => offlineOnOldPrimary(behind(3_000)),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "brings it back past the grace (the replica passed over)",
      build: () => offlineOnOldPrimary(behind(GRACE_MS + 1_000)),
      expected: { kind: "bring_online", target: "p1" },
    },
    {
      name: "brings it back at once when its last answer held no more than it holds now",
      build: () => offlineOnOldPrimary(behind(3_000, 1000), { ageMs: 8_000, last_txn_id: 1000 }),
      expected: { kind: "bring_online", target: "p1" },
    },
    {
      name: "holds for the priority-0 replica once it reports again (it holds more; an operator must act)",
      build: () => offlineOnOldPrimary(behind(GRACE_MS + 1_000), { ageMs: 100 }),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
  ])("$name", ({ build, expected }) => {
    expect(outcome(decide(build().build(), CONFIG, NOW))).toEqual(expected);
  });

  it("says what it waits for", () => {
    const decision = decide(offlineOnOldPrimary(behind(3_000)).build(), CONFIG, NOW);
    expect(decision.reason).toContain(
      "not bringing it back on p1 (last_txn_id 1000) while p1 (database restarted behind its last answer: up to 1000 now, 1200 3000 ms ago)",
    );
    expect(decision.reason).toContain("which only the replicas that followed it may still hold");
    const heard = decide(offlineOnOldPrimary(behind(GRACE_MS + 1_000), { ageMs: 100 }).build(), CONFIG, NOW);
    expect(heard.reason).toContain("priority 0 is never promoted");
  });
});
