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
