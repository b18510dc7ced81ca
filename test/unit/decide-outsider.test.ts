import { describe, expect, it } from "vitest";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { aConfig, aShard, aShardWithStalePrimary, NOW, outcome } from "../support/builders.ts";

/**
 * Issue 30, findings 1(b) and 3 (guarantee 1): `WAIT` and the write guard count every replica that
 * acknowledges, with an agent or not. A replica without one (attached before its agent, a
 * scale-out, an agent without its IAM grant) may hold writes no node with an agent has: the old
 * primary's heartbeat lists such replicas (`outsiders`), and no replica is promoted in its place
 * while its last report lists one that no current heartbeat names (gates `outsider_unheard`,
 * `outsider_unheard_offline`, `outsider_unheard_retarget`). Before the gate, the best member was
 * promoted and what only the outsider acknowledged was lost (nemesis seed 4202: 133 writes in an
 * AZ split with one attached).
 */

const KEEPALIVE = 20_000;
const OUTSIDER = "10.0.0.9:6379";

/** p1's own agent confirms its database died just now (the crash fast path). */
function crashedPrimary(extra: Partial<HeartbeatInput> = {}) {
  return {
    node_id: "p1",
    ageMs: 600,
    db_status: "down" as const,
    agent_updated: (NOW - 250) * 1000,
    db_crash: {
      state: "refused" as const,
      run_id: "run-1",
      first_seen: (NOW - 400) * 1000,
      last_seen: (NOW - 250) * 1000,
    },
    ...extra,
  };
}

/** A replica with its link to the primary down, reporting every cycle's keepalive. */
function linkDown(
  nodeId: string,
  lastTxnId: number,
  extra: Partial<HeartbeatInput> & { ageMs?: number } = {},
) {
  return {
    node_id: nodeId,
    primary_link: "down" as const,
    last_txn_id: lastTxnId,
    keepalive_ms: KEEPALIVE,
    ...extra,
  };
}

/** p1 crashed (its agent confirms it), r1 (1000) and r2 (990) its members with their links down. */
function crashed(primary: Partial<HeartbeatInput> = {}) {
  return aShard()
    .guardedBy(["r1", "r2"])
    .withNode(crashedPrimary(primary))
    .withNode(linkDown("r1", 1000))
    .withNode(linkDown("r2", 990));
}

/**
 * p1 stale, its last report listing the outsider; r1's probe found it refusing every write at
 * offset 1000, which r1 holds (gate member_unheard's proof).
 */
function refusingPrimary() {
  return aShardWithStalePrimary(8000)
    .guardedBy(["r1", "r2"])
    .withNode({ node_id: "p1", ageMs: 8000, outsiders: [OUTSIDER] })
    .withNode({
      node_id: "r1",
      primary_link: "up",
      primary_probe: "fenced",
      primary_probe_offset: 1000,
      last_txn_id: 1000,
      keepalive_ms: KEEPALIVE,
    })
    .withNode(linkDown("r2", 990));
}

describe("decide: a replica without an agent acknowledged the old primary's writes (issue 30, finding 1(b))", () => {
  it.each([
    {
      name: "holds a crash failover while the primary's last report lists a replica no node names",
      build: () => crashed({ outsiders: [OUTSIDER] }),
      expected: { kind: "none", code: "outsider_unheard" },
    },
    {
      name: "holds the failover in an AZ split: primary stale, its last report lists an outsider",
      build: () =>
        aShardWithStalePrimary(8000)
          .guardedBy(["r1", "r2"])
          .withNode({ node_id: "p1", ageMs: 8000, outsiders: [OUTSIDER] })
          .withNode(linkDown("r1", 1000))
          .withNode(linkDown("r2", 990)),
      expected: { kind: "none", code: "outsider_unheard" },
    },
    {
      name: "fails over as before when the primary's last report lists none",
      build: () => crashed(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "an agent started on the outsider names it: its offset ranks, and the most advanced is promoted",
      build: () =>
        crashed({ outsiders: [OUTSIDER] }).withNode(linkDown("r3", 1010, { node_address: OUTSIDER })),
      expected: { kind: "failover", target: "r3" },
    },
    {
      name: "a heartbeat at the outsider's address whose report no longer stands names nothing: held",
      build: () =>
        crashed({ outsiders: [OUTSIDER] }).withNode(
          linkDown("r3", 1010, {
            node_address: OUTSIDER,
            ageMs: 60_000,
            agent_updated: (NOW - 60_000) * 1000,
          }),
        ),
      expected: { kind: "none", code: "outsider_unheard" },
    },
    {
      name: "a member's probe found the primary refusing every write at an offset the candidate holds: failover",
      build: () => refusingPrimary(),
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "an offline shard is not brought back on a replica while the old primary's last report lists an outsider",
      build: () =>
        aShardWithStalePrimary(60_000)
          .offline()
          .guardedBy(["r1", "r2"])
          .withNode({ node_id: "p1", ageMs: 60_000, outsiders: [OUTSIDER] })
          .withNode({ node_id: "r1", last_txn_id: 1000, keepalive_ms: KEEPALIVE })
          .withNode({ node_id: "r2", last_txn_id: 990, keepalive_ms: KEEPALIVE }),
      expected: { kind: "none", code: "outsider_unheard" },
    },
    {
      name: "a healthy primary with an outsider is healthy (the rule costs nothing while nothing fails)",
      build: () => aShard().withNode({ node_id: "p1", outsiders: [OUTSIDER] }),
      expected: { kind: "none", code: "healthy" },
    },
  ])("$name", ({ build, expected }) => {
    // Act
    const decision = decide(build().build(), aConfig(), NOW);
    // Assess
    expect(outcome(decision)).toMatchObject(expected);
    expect(decision.reason.length).toBeGreaterThan(10);
  });

  it("names the outsider, the ways the hold ends and the assumption in the reason", () => {
    // Prepare
    const snapshot = crashed({ outsiders: [OUTSIDER] }).build();
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "outsider_unheard", primaryStale: true });
    expect(decision.reason).toContain("not promoting r1");
    expect(decision.reason).toContain(`acknowledging its writes (${OUTSIDER})`);
    expect(decision.reason).toContain("for an agent on each");
    expect(decision.reason).toContain("docs/safety.md");
  });

  it("says why the outsider was set aside when the refusing-primary proof lets the failover through", () => {
    // Prepare
    const snapshot = refusingPrimary().build();
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision.kind).toBe("failover");
    expect(decision.reason).toContain("r1's probe found p1 refusing every write at offset 1000");
  });
});
