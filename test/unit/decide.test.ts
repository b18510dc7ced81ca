import { describe, expect, it } from "vitest";
import type { FailoverConfigInput } from "../../src/core/config.ts";
import {
  type Decision,
  decide,
  LAST_COPY_GRACE,
  planSwitchover,
  sameDecision,
} from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { aConfig, aHealthyShard, aShard, aShardWithStalePrimary, LINEAGE, NOW } from "../support/builders.ts";

interface Row {
  readonly name: string;
  readonly snapshot: () => ShardSnapshot;
  readonly config?: FailoverConfigInput;
  readonly now?: number;
  readonly lockOwner?: string;
  readonly expected: Record<string, unknown>;
}

/** Summarises a decision for comparison: kind, target, code. */
function outcome(decision: Decision): Record<string, unknown> {
  switch (decision.kind) {
    case "none":
      return { kind: "none", code: decision.code, primaryStale: decision.primaryStale };
    case "failover":
    case "bring_online":
      return { kind: decision.kind, target: decision.target.node_id, epoch: decision.epoch };
    case "initialize":
      return { kind: "initialize", target: decision.primary.node_id, epoch: decision.epoch };
    case "mark_offline":
      return { kind: "mark_offline", epoch: decision.epoch };
    case "continue_failover":
      return {
        kind: "continue_failover",
        phase: decision.phase,
        target: decision.failover.new_primary_node_id,
      };
  }
}

/**
 * A node whose database restarted from its RDB in place of the dead process: its agent fences it
 * and reports it down (the dead process's `repl_id` and offset), with `prior` what the new process
 * holds (`master_replid2`, `second_repl_offset` - 1); its agent wrote `agentAgeMs` ago.
 */
/** How long an offline shard waits before its last resort, at aConfig's 3 s failure timeout. */
const LAST_RESORT_AFTER_MS = LAST_COPY_GRACE * 3000;

function restartedFromRdb(options: {
  node_id: string;
  prior: { repl_id: string; last_txn_id: number } | undefined;
  agentAgeMs?: number;
}) {
  return {
    node_id: options.node_id,
    role: "primary" as const,
    ageMs: 9000,
    agent_updated: (NOW - (options.agentAgeMs ?? 100)) * 1000,
    db_status: "down" as const,
    db_crash: {
      state: "restarted" as const,
      run_id: "dead",
      first_seen: (NOW - 8000) * 1000,
      last_seen: (NOW - 8000) * 1000,
    },
    last_txn_id: 1000,
    repl_id: LINEAGE,
    primary_node_id: undefined,
    primary_link: undefined,
    prior_lineage: options.prior,
  };
}

/**
 * An offline shard past the last resort's grace: r1 restarted from its RDB (up to 990), r2 long
 * gone, and p1, the old primary, last reported with 1200 and its database down; `p1` adds to it.
 */
function lastResortBehindHungPrimary(p1: Partial<HeartbeatInput>): ShardSnapshot {
  return aShardWithStalePrimary()
    .offline(1200)
    .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS - 60_000 })
    .withNode({ node_id: "p1", role: "primary", ageMs: 100_000, last_txn_id: 1200, db_status: "down", ...p1 })
    .withNode(restartedFromRdb({ node_id: "r1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
    .withNode({ node_id: "r2", ageMs: 900_000 })
    .build();
}

function runRows(rows: readonly Row[]) {
  it.each(rows)("$name", (row) => {
    // Prepare
    const snapshot = row.snapshot();
    // Act
    const decision = decide(snapshot, aConfig(row.config), row.now ?? NOW, { lockOwner: row.lockOwner });
    // Assess
    expect(outcome(decision)).toMatchObject(row.expected);
    expect(decision.reason.length).toBeGreaterThan(10);
  });
}

describe("decide: stale primary", () => {
  runRows([
    {
      name: "takes no action while the primary's database answered recently",
      snapshot: () => aHealthyShard().build(),
      expected: { kind: "none", code: "healthy", primaryStale: false },
    },
    {
      name: "counts a primary exactly failureTimeout old as fresh",
      snapshot: () => aShardWithStalePrimary(3000).build(),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "fails over a primary one millisecond past failureTimeout",
      snapshot: () => aShardWithStalePrimary(3001).build(),
      expected: { kind: "failover", target: "r1", epoch: 3 },
    },
    {
      name: "fails over a primary whose heartbeat item is missing",
      snapshot: () => aShardWithStalePrimary().without("p1").build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "marks offline a primary whose heartbeat is missing when its replicas disagree on the lineage",
      snapshot: () =>
        aShardWithStalePrimary().without("p1").withNode({ node_id: "r2", repl_id: "other" }).build(),
      expected: { kind: "mark_offline" },
    },
    {
      name: "fails over a primary whose agent is alive but reports the database down",
      snapshot: () =>
        aShardWithStalePrimary(5000)
          .withNode({ node_id: "p1", db_status: "down", agent_updated: NOW * 1000 })
          .build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "waits the full failureTimeout even when the agent already reports the database down",
      snapshot: () => aHealthyShard().withNode({ node_id: "p1", db_status: "down", ageMs: 1000 }).build(),
      expected: { kind: "none", code: "healthy" },
    },
  ]);
});

describe("decide: quorum", () => {
  runRows([
    {
      name: "counts a replica whose own probe gets no answer from the primary (hung: link still up)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", primary_link: "up", primary_probe: "unreachable" })
          .withNode({ node_id: "r2", primary_link: "up", primary_probe: "unreachable" })
          .build(),
      expected: { kind: "failover" },
    },
    {
      name: "counts a replica whose probe finds the stale primary refusing every write (its agent fenced it)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", primary_link: "up", primary_probe: "fenced" })
          .withNode({ node_id: "r2", primary_link: "up", primary_probe: "fenced" })
          .build(),
      expected: { kind: "failover" },
    },
    {
      name: "fails over a fresh primary that a majority of replicas find restarted on another lineage (its agent did not tell)",
      snapshot: () =>
        aHealthyShard()
          .withNode({ node_id: "p1", role: "primary", repl_id: "lineage-empty", last_txn_id: 10 })
          .withNode({
            node_id: "r1",
            primary_link: "down",
            primary_probe: "restarted",
            primary_node_id: undefined,
          })
          .withNode({
            node_id: "r2",
            primary_link: "down",
            primary_probe: "restarted",
            primary_node_id: undefined,
          })
          .build(),
      expected: { kind: "failover" },
    },
    {
      name: "keeps a fresh primary that only half of its replicas find restarted",
      snapshot: () =>
        aHealthyShard()
          .withNode({ node_id: "p1", role: "primary", repl_id: "lineage-empty", last_txn_id: 10 })
          .withNode({
            node_id: "r1",
            primary_link: "down",
            primary_probe: "restarted",
            primary_node_id: undefined,
          })
          .build(),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "keeps a fresh primary that a replica restarted from its RDB finds restarted, when the primary holds that replica's data (seed 3106)",
      snapshot: () =>
        aHealthyShard()
          .withNode({
            node_id: "p1",
            role: "primary",
            repl_id: "lineage-b",
            last_txn_id: 2000,
            prior_lineage: { repl_id: LINEAGE, last_txn_id: 1500 },
          })
          .withNode({
            node_id: "r1",
            repl_id: "after-rdb-load",
            last_txn_id: 1200,
            prior_lineage: { repl_id: LINEAGE, last_txn_id: 1200 },
            primary_link: "down",
            primary_probe: "restarted",
          })
          .without("r2")
          .build(),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "keeps a fresh primary that an empty replica finds restarted: an empty database has nothing to lose (seed 3110)",
      snapshot: () =>
        aHealthyShard()
          .withNode({ node_id: "p1", role: "primary", repl_id: "lineage-b", last_txn_id: 5_581_119 })
          .withNode({
            node_id: "r1",
            repl_id: "fresh-empty",
            last_txn_id: 0,
            primary_link: "down",
            primary_probe: "restarted",
          })
          .without("r2")
          .build(),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "keeps a fresh primary on the lineage recorded at its promotion that a replica on a lineage of its own finds restarted (seed 7039)",
      snapshot: () =>
        aHealthyShard()
          .withTopology({ ancestry: [{ repl_id: LINEAGE, until: 1500, by: "lineage-b" }] })
          .withNode({
            node_id: "p1",
            role: "primary",
            repl_id: "lineage-b",
            last_txn_id: 2000,
            prior_lineage: { repl_id: LINEAGE, last_txn_id: 1500 },
          })
          .withNode({
            node_id: "r1",
            repl_id: "orphan-branch",
            last_txn_id: 1200,
            primary_link: "down",
            primary_probe: "restarted",
            primary_node_id: undefined,
          })
          .without("r2")
          .build(),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "keeps a fresh primary whose replicas report it restarted but share its lineage (it continues theirs)",
      snapshot: () =>
        aHealthyShard()
          .withNode({ node_id: "r1", primary_probe: "restarted" })
          .withNode({ node_id: "r2", primary_probe: "restarted" })
          .build(),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "waits for a replica further ahead whose heartbeat went stale just now (it may hold acknowledged writes)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", primary_link: "down", last_txn_id: 1000 })
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 2000, ageMs: 5000 })
          .build(),
      expected: { kind: "none", code: "waiting_for_replica", primaryStale: true },
    },
    {
      name: "fails over without a replica further ahead that stayed silent past the grace",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", primary_link: "down", last_txn_id: 1000 })
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 2000, ageMs: 10_000 })
          .build(),
      expected: { kind: "failover" },
    },
    {
      name: "does not count a replica whose probe reaches the primary while its link is up",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", primary_link: "up", primary_probe: "ok" })
          .withNode({ node_id: "r2", primary_link: "up", primary_probe: "ok" })
          .build(),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "does not fail over under majority when the agent died but replicas still see the database",
      snapshot: () => aHealthyShard().withNode({ node_id: "p1", ageMs: 20_000 }).build(),
      expected: { kind: "none", code: "quorum_not_met", primaryStale: true },
    },
    {
      name: "fails over under majority when 2 of 3 fresh replicas see the link down",
      snapshot: () =>
        aShardWithStalePrimary().withNode({ node_id: "r3", primary_link: "up", last_txn_id: 900 }).build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "waits under majority when only 1 of 3 fresh replicas sees the link down",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r2", primary_link: "up" })
          .withNode({ node_id: "r3", primary_link: "up" })
          .build(),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "waits under all when one fresh replica still sees the link up",
      config: { quorum: "all" },
      snapshot: () => aShardWithStalePrimary().withNode({ node_id: "r2", primary_link: "up" }).build(),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "fails over under all when every fresh replica sees the link down",
      config: { quorum: "all" },
      snapshot: () => aShardWithStalePrimary().build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "fails over under none even when every replica sees the link up",
      config: { quorum: "none" },
      snapshot: () => aHealthyShard().withNode({ node_id: "p1", ageMs: 20_000 }).build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "ignores the votes of replicas whose own heartbeat is stale",
      snapshot: () =>
        aShardWithStalePrimary().withNode({ node_id: "r2", primary_link: "up", ageMs: 10_000 }).build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "does not promote when no fresh replica can confirm the failure (only a node claiming primary is fresh)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", role: "primary", primary_link: undefined })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "counts a replica with an unreported link as not down",
      config: { quorum: "all" },
      snapshot: () => aShardWithStalePrimary().withNode({ node_id: "r2", primary_link: undefined }).build(),
      expected: { kind: "none", code: "quorum_not_met" },
    },
  ]);
});

describe("decide: eligible candidates and their order", () => {
  runRows([
    {
      name: "promotes the highest last_txn_id over a better priority (issue 30 finding 2: the preferred node lacks writes a replica may have acknowledged)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", priority: 100, last_txn_id: 1000 })
          .withNode({ node_id: "r2", priority: 10, last_txn_id: 900 })
          .build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "lets priority choose among the candidates tied at the highest last_txn_id",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", priority: 100, last_txn_id: 1000 })
          .withNode({ node_id: "r2", priority: 10, last_txn_id: 1000 })
          .withNode({ node_id: "r3", priority: 1, last_txn_id: 900, primary_link: "down" })
          .build(),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "waits while a priority-0 replica holds more than the best candidate (passing it over would drop writes it may have acknowledged)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", priority: 0, last_txn_id: 1000 })
          .withNode({ node_id: "r2", priority: 10, last_txn_id: 900 })
          .build(),
      expected: { kind: "none", code: "waiting_for_replica", primaryStale: true },
    },
    {
      name: "prefers the highest last_txn_id within one priority",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", last_txn_id: 970 })
          .withNode({ node_id: "r2", last_txn_id: 995 })
          .build(),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "breaks a full tie by node_id",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r2", last_txn_id: 990 })
          .withNode({ node_id: "r0", last_txn_id: 990, primary_link: "down" })
          .build(),
      expected: { kind: "failover", target: "r0" },
    },
    {
      name: "skips a candidate whose heartbeat is stale (past the grace given to a replica further ahead)",
      snapshot: () => aShardWithStalePrimary().withNode({ node_id: "r1", ageMs: 10_000 }).build(),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "skips a candidate of a foreign replication lineage",
      snapshot: () =>
        aShardWithStalePrimary().withNode({ node_id: "r1", repl_id: "other", last_txn_id: 5000 }).build(),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "skips a candidate outside the old primary's guarded replica set (its write guard would not drop it)",
      snapshot: () =>
        aShardWithStalePrimary(10_000)
          .withNode({ node_id: "r0", priority: 10, last_txn_id: 980 })
          .guardedBy(["r1", "r2"])
          .build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "waits while a live replica outside the replica set holds more than the member to promote (it acknowledged writes the member lacks)",
      snapshot: () =>
        aShardWithStalePrimary(10_000)
          .withNode({ node_id: "r1", last_txn_id: 999 })
          .withNode({ node_id: "r2", last_txn_id: 500 })
          .guardedBy(["r2"])
          .build(),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "still waits for the replica outside the set once the primary has been stale long: promoting the member would drop what only that replica acknowledged (issue 30, finding 6)",
      snapshot: () =>
        aShardWithStalePrimary(60 * 3000)
          .withNode({ node_id: "r1", last_txn_id: 999 })
          .withNode({ node_id: "r2", last_txn_id: 500 })
          .guardedBy(["r2"])
          .build(),
      expected: { kind: "none", code: "waiting_for_replica" },
    },
    {
      name: "promotes the member once the replica outside the set stops answering (its data cannot be reached: the member holds the most of what may still answer)",
      snapshot: () =>
        aShardWithStalePrimary(60 * 3000)
          .withNode({ node_id: "r1", last_txn_id: 999, ageMs: 60 * 3000, db_status: "down" })
          .withNode({ node_id: "r2", last_txn_id: 500 })
          .guardedBy(["r2"])
          .build(),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "marks the shard offline when no node of the guarded replica set is eligible",
      snapshot: () => aShardWithStalePrimary().guardedBy([]).build(),
      expected: { kind: "mark_offline" },
    },
    {
      name: "keeps an offline shard offline while a priority-0 node holds more than the node to bring back",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withNode({ node_id: "p1", ageMs: 20_000 })
          .withNode({ node_id: "r1", priority: 0, last_txn_id: 1000 })
          .withNode({ node_id: "r2", last_txn_id: 990 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "skips a candidate with priority 0 when a node of another priority holds as much",
      snapshot: () =>
        aShardWithStalePrimary().withNode({ node_id: "r1", priority: 0, last_txn_id: 980 }).build(),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "skips a candidate lagging more than maxLagOnFailover behind the old primary",
      config: { maxLagOnFailover: 15 },
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", last_txn_id: 984 })
          .withNode({ node_id: "r2", last_txn_id: 985 })
          .build(),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "measures lag against the most advanced replica of the lineage",
      config: { maxLagOnFailover: 100 },
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", last_txn_id: 2000, priority: 200 })
          .withNode({ node_id: "r2", last_txn_id: 1800 })
          .build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      // As far as r2 (a down replica that held more holds the failover: decide-down-ahead.test.ts).
      name: "skips a candidate whose agent reports its database down",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", db_status: "down" })
          .withNode({ node_id: "r2", primary_link: "down", last_txn_id: 990 })
          .build(),
      expected: { kind: "failover", target: "r2" },
    },
  ]);

  it("lists every node with the reason it is or is not eligible", () => {
    // Prepare
    const snapshot = aShardWithStalePrimary()
      .withNode({ node_id: "r1", priority: 0, last_txn_id: 980 })
      .withNode({ node_id: "r3", repl_id: "other", primary_link: "down" })
      .build();
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision.kind).toBe("failover");
    if (decision.kind !== "failover") return;
    expect(decision.candidates.map((c) => [c.node_id, c.eligible, c.reason])).toEqual([
      ["r2", true, "eligible"],
      ["r3", false, `foreign replication lineage other, expected ${LINEAGE}`],
      ["r1", false, "priority 0 (never promote)"],
    ]);
    expect(decision.lineage).toEqual({ node_id: "p1", repl_id: LINEAGE, last_txn_id: 1000 });
  });
});

describe("decide: no eligible candidate and offline shards", () => {
  runRows([
    {
      name: "marks the shard offline when no node is eligible",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", db_status: "down" })
          .withNode({ node_id: "r2", repl_id: "x" })
          .build(),
      expected: { kind: "mark_offline", epoch: 3 },
    },
    {
      name: "marks the shard offline when the primary is stale and the other agents report their databases down",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", ageMs: 9000, db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .withNode({ node_id: "r2", ageMs: 9000, db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .build(),
      expected: { kind: "mark_offline" },
    },
    {
      name: "waits instead of marking offline while a replica's agent was just heard with its database up (stale only by its cycle's latency): it is asked to report",
      snapshot: () =>
        aShardWithStalePrimary(4000)
          .withNode({ node_id: "r1", ageMs: 3400, agent_updated: (NOW - 1000) * 1000 })
          .withNode({ node_id: "r2", ageMs: 3600 })
          .build(),
      expected: { kind: "none", code: "awaiting_reports", primaryStale: true },
    },
    {
      name: "a heard replica is asked to report however old its report's database answer (its next report is fresh, or it turns unheard)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", ageMs: 9001, agent_updated: (NOW - 100) * 1000 })
          .withNode({ node_id: "r2", ageMs: 9001, db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .build(),
      expected: { kind: "none", code: "awaiting_reports", primaryStale: true },
    },
    {
      name: "marks the shard offline when every heard replica reports its database down",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", ageMs: 9001, db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .withNode({ node_id: "r2", ageMs: 9001, db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .build(),
      expected: { kind: "mark_offline" },
    },
    {
      name: "neither fails over nor marks the shard offline when no agent at all was heard (agents cut off or stalled)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "no_agent_heard", primaryStale: true },
    },
    {
      name: "marks the shard offline with no agent heard when the quorum mode is none",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      config: { quorum: "none" },
      expected: { kind: "mark_offline" },
    },
    {
      name: "does not mark the shard offline while the quorum is not met",
      snapshot: () =>
        aHealthyShard()
          .withNode({ node_id: "p1", ageMs: 9000 })
          .withNode({ node_id: "r1", priority: 0 })
          .withNode({ node_id: "r2", priority: 0 })
          .build(),
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "keeps an offline shard offline while no node is eligible",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "brings an offline shard online with a node that returns eligible",
      snapshot: () => aShardWithStalePrimary().offline().withNode({ node_id: "r1", ageMs: 9000 }).build(),
      expected: { kind: "bring_online", target: "r2", epoch: 3 },
    },
    {
      name: "brings an offline shard online with its old primary when it returns with its data",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withNode({ node_id: "p1", ageMs: 100 })
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "bring_online", target: "p1" },
    },
    {
      name: "keeps an offline shard offline when a node returns with a foreign lineage (empty restart)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withNode({ node_id: "p1", ageMs: 100, repl_id: "fresh-start", last_txn_id: 0 })
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "brings an offline shard online on its old primary restarted from its RDB (fenced, holding the lineage under replid2)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 100, repl_id: "fresh-start", last_txn_id: 0 })
          .build(),
      expected: { kind: "bring_online", target: "p1" },
    },
    {
      name: "waits LAST_COPY_GRACE failure timeouts before the last resort, a restarted primary's RDB (a hung primary may return)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS + 1 })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "takes the last resort at once when every node, the restarted old primary included, is alive and heard (simulator seeds 45033, 44216: none can return with more)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - 2000 })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
          .withNode({ node_id: "r1", ageMs: 100, repl_id: "rdb-run", last_txn_id: 990, primary_link: "up" })
          .withNode({ node_id: "r2", ageMs: 100, repl_id: "rdb-run", last_txn_id: 990, primary_link: "up" })
          .build(),
      expected: { kind: "bring_online", target: "p1" },
    },
    {
      name: "takes the last resort at once when the old primary restarted empty, its agent heard, and every other node is alive (simulator seed 71251: its writes died with the old process)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - 2000 })
          .withNode(restartedFromRdb({ node_id: "p1", prior: undefined }))
          .withNode(restartedFromRdb({ node_id: "r1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
          .withNode({ node_id: "r2", ageMs: 100, repl_id: "fresh-start", last_txn_id: 0 })
          .build(),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "waits out the grace before the last resort while the old primary's database is down without a new process (its RDB may return with more)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - 2000 })
          .withNode({
            ...restartedFromRdb({ node_id: "p1", prior: undefined }),
            db_crash: {
              state: "refused",
              run_id: "dead",
              first_seen: (NOW - 8000) * 1000,
              last_seen: (NOW - 100) * 1000,
            },
          })
          .withNode(restartedFromRdb({ node_id: "r1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
          .withNode({ node_id: "r2", ageMs: 100, repl_id: "fresh-start", last_txn_id: 0 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "waits out the grace before the last resort while one node is not heard (it may return with more)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - 2000 })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
          .withNode({ node_id: "r1", ageMs: 100, repl_id: "rdb-run", last_txn_id: 990, primary_link: "up" })
          .withNode({ node_id: "r2", ageMs: 9000, agent_updated: (NOW - 9000) * 1000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "waits out the grace before the last resort when the old primary the lineage names has no heartbeat",
      snapshot: () =>
        aShard()
          .offline()
          .withTopology({
            updated_at: NOW - 2000,
            lineage: { node_id: "p0", repl_id: LINEAGE, last_txn_id: 1000 },
          })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: LINEAGE, last_txn_id: 990 } }))
          .withNode({ node_id: "r1", ageMs: 100, repl_id: "rdb-run", last_txn_id: 990, primary_link: "up" })
          .withNode({ node_id: "r2", ageMs: 100, repl_id: "rdb-run", last_txn_id: 990, primary_link: "up" })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "does not bring an offline shard online on a node outside the old primary's replica set while that primary's agent is unheard (seed 3113)",
      snapshot: () =>
        aShardWithStalePrimary().offline().guardedBy(["r1"]).withNode({ node_id: "r1", ageMs: 9000 }).build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "brings an offline shard online on a member of the old primary's replica set, its agent unheard",
      snapshot: () =>
        aShardWithStalePrimary().offline().guardedBy(["r2"]).withNode({ node_id: "r1", ageMs: 9000 }).build(),
      expected: { kind: "bring_online", target: "r2" },
    },
    {
      name: "brings an offline shard online on a non-member once the old primary's agent is heard (it read the offline topology)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .guardedBy(["r1"])
          .withNode({ node_id: "p1", db_status: "down", agent_updated: (NOW - 100) * 1000 })
          // r1's agent reports its database dead: its offset is known (an unheard member holds the shard: decide-unheard-member.test.ts).
          .withNode({ node_id: "r1", ageMs: 9000, db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .build(),
      expected: { kind: "bring_online", target: "r2" },
    },
    {
      name: "brings an offline shard online on a non-member when the old primary's last report is a confirmed crash",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .guardedBy(["r1"])
          .withNode({
            node_id: "p1",
            db_status: "down",
            db_crash: {
              state: "refused",
              run_id: "dead",
              first_seen: (NOW - 10_500) * 1000,
              last_seen: (NOW - 10_000) * 1000,
            },
          })
          // r1's agent reports its database dead: its offset is known (an unheard member holds the shard: decide-unheard-member.test.ts).
          .withNode({ node_id: "r1", ageMs: 9000, db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .build(),
      expected: { kind: "bring_online", target: "r2" },
    },
    {
      name: "does not take the last resort while the old primary's agent reports its database hung, not dead, with more (seed 3109)",
      snapshot: () => lastResortBehindHungPrimary({ agent_updated: (NOW - 100) * 1000 }),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "takes the last resort once the old primary's agent confirms its database died (refused)",
      snapshot: () =>
        lastResortBehindHungPrimary({
          agent_updated: (NOW - 100) * 1000,
          db_crash: {
            state: "refused",
            run_id: "dead",
            first_seen: (NOW - 99_000) * 1000,
            last_seen: (NOW - 100) * 1000,
          },
        }),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "does not take the last resort while the hung node's agent was silent for less than the grace (paused too: seed 3109's rerun)",
      snapshot: () => lastResortBehindHungPrimary({ agent_updated: (NOW - 8000) * 1000 }),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "takes the last resort when the hung node's agent was silent for the grace too (gone for all it can tell)",
      snapshot: () => lastResortBehindHungPrimary({}),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "never promotes a replica restarted from its RDB in an online failover (its snapshot may lack acknowledged writes)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({
            node_id: "r1",
            role: "primary",
            repl_id: "after-rdb-load",
            last_txn_id: 980,
            prior_lineage: { repl_id: LINEAGE, last_txn_id: 980 },
          })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "mark_offline" },
    },
    {
      name: "keeps an offline shard offline when the restarted primary's RDB is further behind than maxLagOnFailover",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline(5000)
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: LINEAGE, last_txn_id: 1 } }))
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "keeps an offline shard offline when the restarted primary holds another lineage",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: "lineage-z", last_txn_id: 1000 } }))
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "keeps an offline shard offline when the restarted primary's agent is no longer heard",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS })
          .withNode(
            restartedFromRdb({
              node_id: "p1",
              prior: { repl_id: LINEAGE, last_txn_id: 1000 },
              agentAgeMs: 4000,
            }),
          )
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "never counts a restarted primary's own repl_id (the dead process's) as data it holds",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS })
          .withNode(restartedFromRdb({ node_id: "p1", prior: undefined }))
          .withNode({ node_id: "r1", ageMs: 9000 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
    {
      name: "prefers a node further ahead on the lineage to a restarted primary holding less of it",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS })
          .withNode(restartedFromRdb({ node_id: "p1", prior: { repl_id: LINEAGE, last_txn_id: 900 } }))
          .withNode({ node_id: "r1", ageMs: 100, last_txn_id: 950 })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "brings an offline shard online on a replica restarted from its RDB (new replid, the lineage as replid2)",
      snapshot: () =>
        aShardWithStalePrimary()
          .offline()
          .withTopology({ updated_at: NOW - LAST_RESORT_AFTER_MS })
          .withNode({
            node_id: "r1",
            ageMs: 100,
            role: "primary",
            repl_id: "after-rdb-load",
            last_txn_id: 980,
            prior_lineage: { repl_id: LINEAGE, last_txn_id: 980 },
          })
          .withNode({ node_id: "r2", ageMs: 9000 })
          .build(),
      expected: { kind: "bring_online", target: "r1" },
    },
    {
      name: "keeps an offline shard offline when its lineage was never recorded",
      snapshot: () => aShard().offline().withTopology({ lineage: undefined }).build(),
      expected: { kind: "none", code: "offline_no_candidate" },
    },
  ]);
});

describe("decide: agents coming back from a coordination-store outage", () => {
  /** µs of a `store_resumed_at` `agoMs` before NOW. */
  const resumed = (agoMs: number) => (NOW - agoMs) * 1000;
  runRows([
    {
      name: "waits while the first agent back reports the primary down and the primary's agent is not heard yet (seed 3108)",
      snapshot: () =>
        aShardWithStalePrimary(45_000)
          .withNode({ node_id: "r1", ageMs: 100, store_resumed_at: resumed(300) })
          .withNode({ node_id: "r2", ageMs: 45_000 })
          .build(),
      expected: { kind: "none", code: "store_recovering", primaryStale: true },
    },
    {
      name: "fails over once the failure timeout since the last agent came back has passed without the others",
      snapshot: () =>
        aShardWithStalePrimary(45_000)
          .withNode({ node_id: "r1", ageMs: 100, store_resumed_at: resumed(3001) })
          .withNode({ node_id: "r2", ageMs: 45_000 })
          .build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "does not wait when every agent is heard (the primary's reports its database down)",
      snapshot: () =>
        aShardWithStalePrimary(45_000)
          .withNode({ node_id: "p1", db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .withNode({ node_id: "r1", ageMs: 100, store_resumed_at: resumed(300) })
          .withNode({ node_id: "r2", ageMs: 100 })
          .build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "keeps an offline shard offline while an agent back from the outage is the only one heard",
      snapshot: () =>
        aShardWithStalePrimary(45_000)
          .offline()
          .withNode({ node_id: "r1", ageMs: 100, store_resumed_at: resumed(300) })
          .withNode({ node_id: "r2", ageMs: 45_000 })
          .build(),
      expected: { kind: "none", code: "store_recovering" },
    },
    {
      name: "brings an offline shard online on the best node once the others are heard",
      snapshot: () =>
        aShardWithStalePrimary(45_000)
          .offline()
          .withNode({ node_id: "p1", db_status: "down", agent_updated: (NOW - 100) * 1000 })
          .withNode({ node_id: "r1", ageMs: 100, store_resumed_at: resumed(300) })
          .withNode({ node_id: "r2", ageMs: 100, last_txn_id: 995 })
          .build(),
      expected: { kind: "bring_online", target: "r2" },
    },
  ]);
});

describe("decide: paused shards, cool-down and locks", () => {
  runRows([
    {
      name: "takes no action on a paused shard even with a stale primary",
      snapshot: () => aShardWithStalePrimary().paused().build(),
      expected: { kind: "none", code: "paused" },
    },
    {
      name: "takes no action during cool-down but reports the stale primary",
      snapshot: () => aShardWithStalePrimary().coolingDown(60_000).build(),
      expected: { kind: "none", code: "cooldown", primaryStale: true },
    },
    {
      name: "replaces a stale primary whose own agent confirmed its database restarted without its data, cool-down notwithstanding (simulator seed 117581)",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({
            node_id: "p1",
            db_status: "down",
            agent_updated: (NOW - 200) * 1000,
            db_crash: {
              state: "restarted",
              run_id: "run-1",
              first_seen: (NOW - 9_000) * 1000,
              last_seen: (NOW - 200) * 1000,
            },
          })
          .coolingDown(30_000)
          .build(),
      expected: { kind: "failover" },
    },
    {
      name: "fails over once the cool-down has passed",
      snapshot: () => aShardWithStalePrimary().coolingDown(1000).build(),
      now: NOW + 1000,
      expected: { kind: "failover" },
    },
    {
      name: "leaves a stale primary to the controller that holds the lock",
      snapshot: () => aShardWithStalePrimary().lockedBy("someone-else").build(),
      expected: { kind: "none", code: "locked", primaryStale: true },
    },
    {
      name: "ignores an expired lock",
      snapshot: () => aShardWithStalePrimary().lockedBy("someone-else", -1).build(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "is not blocked by the caller's own lock",
      snapshot: () => aShardWithStalePrimary().lockedBy("me").build(),
      lockOwner: "me",
      expected: { kind: "failover", target: "r1" },
    },
  ]);
});

describe("decide: a shard already failing over", () => {
  runRows([
    {
      name: "continues from the stored phase once the lock is free",
      snapshot: () => aShardWithStalePrimary().failingOver("confirm", "r2").build(),
      expected: { kind: "continue_failover", phase: "confirm", target: "r2" },
    },
    {
      name: "continues after the previous controller's lock expired",
      snapshot: () => aShardWithStalePrimary().failingOver("promote").lockedBy("dead-controller", -5).build(),
      expected: { kind: "continue_failover", phase: "promote", target: "r1" },
    },
    {
      name: "continues even during cool-down (an interrupted failover must finish)",
      snapshot: () => aShardWithStalePrimary().failingOver("repoint").coolingDown().build(),
      expected: { kind: "continue_failover", phase: "repoint" },
    },
    {
      name: "leaves a failover in progress to the controller holding the lock",
      snapshot: () => aShardWithStalePrimary().failingOver("confirm").lockedBy("other").build(),
      expected: { kind: "none", code: "locked" },
    },
    {
      name: "reports a failing_over topology without failover state as inconsistent",
      snapshot: () => aShard().withTopology({ status: "failing_over" }).build(),
      expected: { kind: "none", code: "inconsistent_topology" },
    },
  ]);
});

describe("decide: shards without a topology", () => {
  runRows([
    {
      name: "adopts the only node reporting itself primary, at the highest epoch any agent applied",
      snapshot: () => aShard().withTopology(undefined).withNode({ node_id: "r2", epoch: 7 }).build(),
      expected: { kind: "initialize", target: "p1", epoch: 7 },
    },
    {
      name: "refuses to pick between two nodes reporting themselves primary",
      snapshot: () => aShard().withTopology(undefined).withNode({ node_id: "r1", role: "primary" }).build(),
      expected: { kind: "none", code: "ambiguous_primary" },
    },
    {
      name: "waits while no node reports itself primary",
      snapshot: () => aShard().withTopology(undefined).without("p1").build(),
      expected: { kind: "none", code: "no_topology" },
    },
    {
      name: "does not adopt a primary whose heartbeat is stale",
      snapshot: () => aShardWithStalePrimary().withTopology(undefined).build(),
      expected: { kind: "none", code: "no_topology" },
    },
  ]);
});

describe("sameDecision", () => {
  it("treats the same target at the same epoch as the same answer", () => {
    const a = decide(aShardWithStalePrimary().build(), aConfig(), NOW);
    const b = decide(aShardWithStalePrimary().build(), aConfig(), NOW + 500);
    expect(sameDecision(a, b)).toBe(true);
  });

  it("treats another target as a changed answer", () => {
    const a = decide(aShardWithStalePrimary().build(), aConfig(), NOW);
    const b = decide(
      aShardWithStalePrimary().withNode({ node_id: "r1", ageMs: 9000 }).build(),
      aConfig(),
      NOW,
    );
    expect(sameDecision(a, b)).toBe(false);
  });

  it("treats a primary that came back as a changed answer", () => {
    const a = decide(aShardWithStalePrimary().build(), aConfig(), NOW);
    const b = decide(aShardWithStalePrimary().withNode({ node_id: "p1", ageMs: 10 }).build(), aConfig(), NOW);
    expect(sameDecision(a, b)).toBe(false);
  });

  it("treats another epoch as a changed answer", () => {
    const a = decide(aShardWithStalePrimary().build(), aConfig(), NOW);
    const b = decide(aShardWithStalePrimary().withTopology({ epoch: 4 }).build(), aConfig(), NOW);
    expect(sameDecision(a, b)).toBe(false);
  });
});

describe("planSwitchover", () => {
  it("picks the best eligible replica when no target is named", () => {
    const plan = planSwitchover(aHealthyShard().build(), aConfig(), NOW, {});
    expect(plan).toMatchObject({
      kind: "switchover",
      target: { node_id: "r1" },
      oldPrimary: { node_id: "p1" },
    });
  });

  it("uses the named target when it is eligible", () => {
    const plan = planSwitchover(aHealthyShard().build(), aConfig(), NOW, { to: "r2" });
    expect(plan).toMatchObject({ kind: "switchover", target: { node_id: "r2" } });
  });

  it("refuses a named target that is not eligible, saying why", () => {
    const plan = planSwitchover(
      aHealthyShard().withNode({ node_id: "r2", priority: 0 }).build(),
      aConfig(),
      NOW,
      {
        to: "r2",
      },
    );
    expect(plan).toEqual({ kind: "refused", reason: "r2 is not eligible: priority 0 (never promote)" });
  });

  it("refuses when the primary is not alive (that is a failover's job)", () => {
    const plan = planSwitchover(aShardWithStalePrimary().build(), aConfig(), NOW, {});
    expect(plan).toMatchObject({ kind: "refused", reason: "primary p1 is not alive" });
  });

  it("refuses while a failover is in progress", () => {
    const plan = planSwitchover(aShardWithStalePrimary().failingOver("confirm").build(), aConfig(), NOW, {});
    expect(plan.kind).toBe("refused");
  });

  it("refuses to switch over to the current primary", () => {
    const plan = planSwitchover(aHealthyShard().build(), aConfig(), NOW, { to: "p1" });
    expect(plan).toEqual({ kind: "refused", reason: "p1 is already the primary" });
  });

  it("ignores the cool-down (an operator asked)", () => {
    const plan = planSwitchover(aHealthyShard().coolingDown().build(), aConfig(), NOW, {});
    expect(plan.kind).toBe("switchover");
  });
});
