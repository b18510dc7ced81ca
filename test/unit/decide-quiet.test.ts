import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  awaitingReports,
  type Decision,
  decide,
  isReportCurrent,
  planSwitchover,
  reportsPending,
  switchoverReporters,
} from "../../src/core/decide.ts";
import type { Heartbeat, HeartbeatInput } from "../../src/core/model.ts";
import { aConfig, aHealthyShard, aHeartbeat, aShardWithStalePrimary, NOW } from "../support/builders.ts";

/**
 * Quiet replicas (issue 18): a replica following a fresh primary writes its heartbeat only on a
 * change and at its keepalive (`keepalive_ms`, 20 s by default). Its report stands that long plus
 * the failure timeout, but its offset and its view of the primary are as old as the write: no
 * decision that changes the primary is taken while such a node has not reported within the
 * failure timeout. Before this rule a quiet replica was simply stale: a failover went ahead
 * ranking only the others, and could promote a replica behind the quiet one.
 */

const KEEPALIVE = 20_000;

/** A replica whose agent last wrote `ageMs` ago (database and agent alike) with a keepalive. */
function quiet(nodeId: string, ageMs: number, extra: Partial<HeartbeatInput> = {}) {
  return {
    node_id: nodeId,
    ageMs,
    agent_updated: (NOW - ageMs) * 1000,
    keepalive_ms: KEEPALIVE,
    ...extra,
  };
}

function summary(decision: Decision) {
  return decision.kind === "none"
    ? { kind: "none", code: decision.code, awaiting: decision.awaiting }
    : { kind: decision.kind, target: "target" in decision ? decision.target.node_id : undefined };
}

describe("decide: quiet replicas", () => {
  it.each([
    {
      name: "a healthy shard with quiet replicas is healthy (the rule costs nothing while nothing fails)",
      build: () => aHealthyShard().withNode(quiet("r1", 15_000)).withNode(quiet("r2", 9_000)),
      expected: { kind: "none", code: "healthy" },
    },
    {
      name: "a stale primary waits for a quiet replica's report, even when another replica is ready",
      build: () =>
        aShardWithStalePrimary(5000)
          .withNode({ node_id: "r1", last_txn_id: 990 })
          .withNode(quiet("r2", 10_000, { last_txn_id: 980 })),
      expected: { kind: "none", code: "awaiting_reports", awaiting: ["r2"] },
    },
    {
      name: "the crash fast path waits for a quiet replica too",
      build: () =>
        aHealthyShard()
          .withNode({
            node_id: "p1",
            ageMs: 1000,
            db_status: "down",
            agent_updated: NOW * 1000,
            db_crash: {
              state: "refused",
              run_id: "x",
              first_seen: (NOW - 900) * 1000,
              last_seen: NOW * 1000,
            },
          })
          .withNode({ node_id: "r1", primary_link: "down" })
          .withNode(quiet("r2", 10_000)),
      expected: { kind: "none", code: "awaiting_reports", awaiting: ["r2"] },
    },
    {
      name: "a replica silent past its keepalive and the failure timeout is stale: the failover goes on",
      build: () =>
        aShardWithStalePrimary(30_000)
          .withNode({ node_id: "r1", last_txn_id: 990 })
          .withNode(quiet("r2", KEEPALIVE + 3001, { last_txn_id: 980 })),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "once the quiet replica reported, the one furthest ahead is promoted",
      build: () =>
        aShardWithStalePrimary(5000)
          .withNode({ node_id: "r1", last_txn_id: 990 })
          .withNode({ node_id: "r2", last_txn_id: 995, keepalive_ms: 1000 }),
      expected: { kind: "failover", target: "r2" },
    },
    {
      name: "an offline shard waits for a quiet node before bringing one back",
      build: () =>
        aShardWithStalePrimary(60_000)
          .offline()
          .withNode({ node_id: "r1", last_txn_id: 1000 })
          .withNode(quiet("r2", 8_000, { last_txn_id: 1000 })),
      expected: { kind: "none", code: "awaiting_reports", awaiting: ["r2"] },
    },
    {
      name: "heartbeats without a keepalive (older agents) are judged as before",
      build: () =>
        aShardWithStalePrimary(5000)
          .withNode({ node_id: "r1", last_txn_id: 990 })
          .withNode({ node_id: "r2", ageMs: 10_000, last_txn_id: 980 }),
      expected: { kind: "failover", target: "r1" },
    },
  ])("$name", ({ build, expected }) => {
    // Act
    const decision = decide(build().build(), aConfig(), NOW);
    // Assess
    expect(summary(decision)).toMatchObject(expected);
    expect(decision.reason.length).toBeGreaterThan(10);
  });

  it("names the quiet nodes, their silence and keepalive in the reason", () => {
    // Prepare
    const snapshot = aShardWithStalePrimary(5000).withNode(quiet("r2", 10_000)).build();
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision.reason).toContain(
      "r2 heard 10000 ms ago, database answered 10000 ms ago, keepalive 20000 ms",
    );
  });

  /**
   * Nemesis 7335 (incident B): an AZ split {p1, r3} | {r1, r2, AWS} with p1's agent killed. Member
   * r3's agent wrote a report just before the cut, but that cycle's INFO read was more than the
   * failure timeout old by the write. r3 was heard, so not quiet; its report was current, so not
   * unheard (gate member_unheard); its database answer was not fresh, so no voter: nothing waited
   * for it, and r1 was promoted on "2 of 2 fresh replicas" while r3 acknowledged 162 writes on p1's
   * side. Such a replica is waited for as a quiet one (asked to report): its next report either
   * votes with a final offset or, cut off, turns it unheard.
   */
  /** p1 stale 4 s, members r1 and r2 fresh with their links down, member r3 as given. */
  const split = (r3: Partial<HeartbeatInput> & { ageMs?: number }) =>
    aShardWithStalePrimary(4_000)
      .guardedBy(["r1", "r2", "r3"])
      .withNode({ node_id: "r1", last_txn_id: 1000, primary_link: "down" })
      .withNode({ node_id: "r2", last_txn_id: 990, primary_link: "down" })
      .withNode({ node_id: "r3", last_txn_id: 980, ...r3 });
  it.each([
    {
      name: "a member heard on an old database answer is waited for, not passed over (nemesis 7335: was a failover to r1)",
      build: () =>
        split({
          ageMs: 3_500,
          agent_updated: (NOW - 1_500) * 1000,
          primary_link: "up",
          keepalive_ms: KEEPALIVE,
        }),
      expected: { kind: "none", code: "awaiting_reports", awaiting: ["r3"] },
    },
    {
      name: "the same without a keepalive (an agent that writes every cycle)",
      build: () => split({ ageMs: 3_500, agent_updated: (NOW - 100) * 1000 }),
      expected: { kind: "none", code: "awaiting_reports", awaiting: ["r3"] },
    },
    {
      name: "once it reports a fresh answer it votes and is ranked: failover to the most advanced",
      build: () => split({ ageMs: 100, last_txn_id: 1200, primary_link: "down" }),
      expected: { kind: "failover", target: "r3" },
    },
    {
      name: "a heard node whose database is reported down is no holder to wait for: failover",
      build: () => split({ ageMs: 9_000, agent_updated: (NOW - 100) * 1000, db_status: "down" }),
      expected: { kind: "failover", target: "r1" },
    },
  ])("$name", ({ build, expected }) => {
    // Act
    const decision = decide(build().build(), aConfig(), NOW);
    // Assess
    expect(summary(decision)).toMatchObject(expected);
    expect(decision.reason.length).toBeGreaterThan(10);
  });

  it("counts a report current for exactly its keepalive plus the failure timeout", () => {
    // Prepare
    const at = (ageMs: number): Heartbeat => aHeartbeat(quiet("r1", ageMs));
    // Assess
    expect(isReportCurrent(at(KEEPALIVE + 3000), aConfig(), NOW)).toBe(true);
    expect(isReportCurrent(at(KEEPALIVE + 3001), aConfig(), NOW)).toBe(false);
    expect(isReportCurrent(at(-10_000), aConfig(), NOW)).toBe(false);
  });

  it("refuses a switchover to a quiet replica until it reports (the controller asks first)", () => {
    // Prepare
    const snapshot = aHealthyShard().withNode(quiet("r1", 10_000)).build();
    // Act
    const plan = planSwitchover(snapshot, aConfig(), NOW, { to: "r1" });
    // Assess
    expect(plan).toMatchObject({ kind: "refused" });
    expect(awaitingReports(snapshot, aConfig(), NOW, "p1").map((node) => node.node_id)).toEqual(["r1"]);
  });

  it.each([
    // A replica heard 900 ms ago (a write on a change) is no quiet node, yet a switchover that
    // waits for another one turns it stale unless it too is asked (CI: "heartbeat stale (3052 ms old)").
    { name: "heard just now", ageMs: 900, asked: true, pending: false },
    { name: "heard at half the failure timeout", ageMs: 1500, asked: true, pending: false },
    { name: "heard past half the failure timeout", ageMs: 1501, asked: true, pending: true },
    { name: "quiet within its keepalive", ageMs: 10_000, asked: true, pending: true },
    { name: "silent past its keepalive", ageMs: KEEPALIVE + 3001, asked: false, pending: true },
  ])(
    "a switchover asks a replica $name to report: asked $asked, pending $pending",
    ({ ageMs, asked, pending }) => {
      // Prepare
      const snapshot = aHealthyShard().withNode(quiet("r1", ageMs)).build();
      const config = aConfig();
      // Act
      const reporters = switchoverReporters(snapshot, config, NOW, "p1").map((node) => node.node_id);
      const waiting = reportsPending(snapshot, ["r1"], config, NOW).map((node) => node.node_id);
      // Assess
      expect(reporters.includes("r1")).toBe(asked);
      expect(reporters).not.toContain("p1");
      expect(waiting).toEqual(pending ? ["r1"] : []);
    },
  );

  it("a switchover leaves a replica that writes every cycle (no keepalive) unasked, however old its report", () => {
    // Prepare
    const snapshot = aHealthyShard().withNode({ node_id: "r1", ageMs: 2000 }).build();
    // Act
    const waiting = reportsPending(snapshot, ["r1"], aConfig(), NOW);
    // Assess
    expect(waiting).toEqual([]);
  });

  it("never changes the primary while some node is quiet within its keepalive (property)", () => {
    const nodeArb = fc.record({
      ageMs: fc.integer({ min: 0, max: 40_000 }),
      keepalive: fc.constantFrom(undefined, 1000, KEEPALIVE),
      last_txn_id: fc.integer({ min: 900, max: 1100 }),
      link: fc.constantFrom("up" as const, "down" as const),
      db_status: fc.constantFrom("up" as const, "up" as const, "down" as const),
    });
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 20_000 }),
        fc.array(nodeArb, { minLength: 1, maxLength: 4 }),
        fc.boolean(),
        (primaryAge, replicas, offline) => {
          let builder = aShardWithStalePrimary(primaryAge).without("r1").without("r2");
          if (offline) builder = builder.offline();
          replicas.forEach((replica, index) => {
            builder = builder.withNode({
              node_id: `r${index + 1}`,
              ageMs: replica.ageMs,
              agent_updated: (NOW - replica.ageMs) * 1000,
              keepalive_ms: replica.keepalive,
              last_txn_id: replica.last_txn_id,
              primary_link: replica.link,
              db_status: replica.db_status,
            });
          });
          const snapshot = builder.build();
          const config = aConfig({ quorum: "none" });
          const decision = decide(snapshot, config, NOW);
          const someQuiet = awaitingReports(snapshot, config, NOW, offline ? undefined : "p1").length > 0;
          if (someQuiet) {
            expect(["failover", "bring_online", "mark_offline"]).not.toContain(decision.kind);
          }
        },
      ),
      { seed: 18, numRuns: 500 },
    );
  });
});
