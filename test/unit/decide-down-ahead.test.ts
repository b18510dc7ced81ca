import { describe, expect, it } from "vitest";
import { DOWN_AHEAD_GRACE } from "../../src/core/decide/replacing.ts";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { aConfig, aShardWithStalePrimary, NOW, outcome } from "../support/builders.ts";

/**
 * Nemesis seed 5301 (guarantee 1): an AZ split cut primary p1 and member r2 off from the store and
 * from member r1; p1 took writes r2 alone acknowledged (`WAIT 1`) while Redis still counted r1 good
 * for its lag. p1's agent was then killed, and r2's database killed and restarted. When the split
 * healed, r2's agent reported its database down and r1, 1 of 1 fresh voters, was promoted: what r2
 * had acknowledged was on p1 alone, and p1 resynced from r1. Now a replica whose database is down
 * but whose last answer held more than the best candidate holds the failover for up to
 * `DOWN_AHEAD_GRACE` failure timeouts (gate `replica_down_ahead`); its agent reports the dead
 * process's last offset, written or not (src/agent/heartbeat-report.ts).
 */

const CONFIG = aConfig();
const GRACE_MS = DOWN_AHEAD_GRACE * CONFIG.failureTimeoutMs;

/** p1's agent killed 60 s ago; r1 (member, cut off from it) the best candidate at 1000; `r2` a member too. */
function shardWith(r2: Partial<HeartbeatInput> & { ageMs?: number }) {
  return aShardWithStalePrimary(60_000)
    .guardedBy(["r1", "r2"])
    .withNode({ node_id: "p1", ageMs: 60_000, agent_updated: (NOW - 60_000) * 1000, last_txn_id: 1000 })
    .withNode({ node_id: "r1", primary_link: "down", last_txn_id: 1000 })
    .withNode({
      node_id: "r2",
      db_status: "down",
      primary_link: "down",
      last_txn_id: 1200,
      agent_updated: (NOW - 100) * 1000,
      ...r2,
    });
}

/** r2 back from its RDB under a new id, answering as a replica for \`forMs\`, holding lineage-a to 1150 as its earlier one. */
function restartedR2(forMs: number) {
  return shardWith({
    ageMs: 200,
    db_status: "up",
    primary_link: "down",
    repl_id: "lineage-new",
    last_txn_id: 1150,
    prior_lineage: { repl_id: "lineage-a", last_txn_id: 1150 },
    role_since: (NOW - forMs) * 1000,
  });
}

describe("decide: a replica whose database went down holding more than the candidate (nemesis 5301)", () => {
  it.each([
    {
      name: "holds the failover while its database answered within the grace",
      build: () => shardWith({ ageMs: 5_000 }),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "holds it for a priority-0 replica too (5301's r2: never promoted, never passed over)",
      build: () => shardWith({ ageMs: 5_000, priority: 0 }),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "holds it for a restarted process its agent keeps fenced (the dead process's offset counts)",
      build: () =>
        shardWith({
          ageMs: 8_000,
          db_crash: { state: "restarted", run_id: "new", first_seen: NOW - 8_000, last_seen: NOW - 100 },
          prior_lineage: { repl_id: "lineage-a", last_txn_id: 1150 },
        }),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "holds it with the old primary's agent confirming its crash (the data is the question)",
      build: () =>
        shardWith({ ageMs: 5_000 }).withNode({
          node_id: "p1",
          ageMs: 5_000,
          db_status: "down",
          role: "primary",
          primary_node_id: undefined,
          primary_link: undefined,
          db_crash: { state: "refused", run_id: "p1run", first_seen: NOW - 5_000, last_seen: NOW - 100 },
        }),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "holds it for a database back from its RDB under a new id, answering, that holds the lineage as its earlier one further (a CI run promoted node-3 the moment node-2 answered again)",
      build: () => restartedR2(2_000),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "fails over once such a database has answered in its role past the grace",
      build: () => restartedR2(GRACE_MS + 1_000),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over past the grace, naming the node passed over",
      build: () => shardWith({ ageMs: GRACE_MS + 1_000 }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over when the down replica held no more than the candidate",
      build: () => shardWith({ ageMs: 5_000, last_txn_id: 1000 }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over when the down replica is on another lineage",
      build: () => shardWith({ ageMs: 5_000, repl_id: "lineage-b" }),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "promotes the replica once its database answers again holding more",
      build: () => shardWith({ ageMs: 200, db_status: "up", last_txn_id: 1200 }),
      expected: { kind: "failover", target: "r2" },
    },
  ])("$name", ({ build, expected }) => {
    expect(outcome(decide(build().build(), CONFIG, NOW))).toEqual(expected);
  });

  it("says which replica it waits for, what it held, and what ends the wait", () => {
    const decision = decide(shardWith({ ageMs: 5_000 }).build(), CONFIG, NOW);
    expect(decision.kind).toBe("none");
    expect(decision.reason).toContain(
      "not promoting r1 (last_txn_id 1000) while r2 (database down, last answered 5000 ms ago, last_txn_id 1200)",
    );
    expect(decision.reason).toContain(
      `waiting up to ${DOWN_AHEAD_GRACE} failure timeouts for its database to answer again`,
    );
    expect(decision.reason).toContain("or for the primary to return");
  });

  it("names the replica passed over past the grace in the failover's reason (its event)", () => {
    const decision = decide(shardWith({ ageMs: GRACE_MS + 1_000 }).build(), CONFIG, NOW);
    expect(decision.kind).toBe("failover");
    expect(decision.reason).toContain(
      `passing over r2 (database down, last answered ${GRACE_MS + 1_000} ms ago, last_txn_id 1200), down longer than ${DOWN_AHEAD_GRACE} failure timeouts`,
    );
  });
});
