import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  type Continuation,
  decideContinuation,
  FailoverStateMissing,
  MAX_CONFIRM_ROUNDS,
  planTarget,
  targetConfirmed,
} from "../../src/core/continuation.ts";
import { decide } from "../../src/core/decide.ts";
import type { FailoverPhase, HeartbeatInput, Topology } from "../../src/core/model.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { aConfig, aShard, LINEAGE, NOW, type ShardBuilder } from "../support/builders.ts";

/**
 * decideContinuation: what a controller does with a change it finds `failing_over`. The table
 * covers every answer; the properties check the epoch rule over random histories.
 */

const config = aConfig();
const CONFIRM_MS = 7000;
const options = { confirmTimeoutMs: CONFIRM_MS };

function continuation(shard: ShardBuilder): Continuation {
  return decideContinuation(shard.build(), config, NOW, options);
}

/**
 * r2 as far as the target r1 (990): replacing a live r1 by it drops nothing, so an overdue live
 * target is replaced (rule `live_target_ahead` keeps a live target that holds more).
 */
const R2_AS_FAR = { node_id: "r2", last_txn_id: 990 } as const;

/** p1 dead, replicas see it; a failover to r1 left at `phase`. */
const interrupted = (phase: FailoverPhase, target = "r1") =>
  aShard().withStalePrimary().failingOver(phase, target);

describe("decideContinuation: every case", () => {
  const rows: ReadonlyArray<{
    readonly name: string;
    readonly shard: () => ShardBuilder;
    readonly expected: Partial<Continuation> & { kind: Continuation["kind"] };
  }> = [
    {
      name: "before PROMOTE, the plan still holds: continue from promote, same epoch",
      shard: () => interrupted("epoch_bumped"),
      expected: { kind: "continue", from: "promote" },
    },
    {
      name: "before PROMOTE, a better target now: replan (a new epoch)",
      shard: () => interrupted("epoch_bumped", "r2"),
      expected: { kind: "replan" },
    },
    {
      name: "before PROMOTE, the target died: replan to the other replica",
      shard: () => interrupted("epoch_bumped").withNode({ node_id: "r1", ageMs: 10_000 }),
      expected: { kind: "replan" },
    },
    {
      name: "before PROMOTE, nobody eligible: offline",
      shard: () =>
        interrupted("epoch_bumped")
          .withNode({ node_id: "r1", priority: 0 })
          .withNode({ node_id: "r2", priority: 0 }),
      expected: { kind: "offline", oldPrimary: "p1" },
    },
    {
      name: "before PROMOTE, the primary is back: abandon",
      shard: () =>
        interrupted("epoch_bumped")
          .withNode({ node_id: "p1", ageMs: 100 })
          .withNode({ node_id: "r1", primary_link: "up" })
          .withNode({ node_id: "r2", primary_link: "up" }),
      expected: { kind: "abandon" },
    },
    {
      name: "an interrupted switchover before PROMOTE: abandon",
      shard: () => {
        const shard = interrupted("catch_up");
        const topology = shard.build().topology as Topology;
        return shard.withTopology({
          failover: { ...(topology.failover as NonNullable<Topology["failover"]>), kind: "switchover" },
        });
      },
      expected: {
        kind: "abandon",
        reason: "resumed before PROMOTE and abandoned: an interrupted switchover is not resumed",
      },
    },
    {
      name: "repoint: continue there",
      shard: () => interrupted("repoint"),
      expected: { kind: "continue", from: "repoint" },
    },
    {
      name: "cleanup: continue there",
      shard: () => interrupted("cleanup"),
      expected: { kind: "continue", from: "cleanup" },
    },
    {
      name: "confirm, target confirmed at the epoch: continue from repoint",
      shard: () => interrupted("confirm").withNode({ node_id: "r1", role: "primary", epoch: 4 }),
      expected: { kind: "continue", from: "repoint" },
    },
    {
      // Simulator seed 282758: the target restarted empty 0.5 s after its PROMOTE; its agent's down
      // report keeps the last answer's role, epoch and last_updated (fresh for a failure timeout).
      name: "confirm, the target's database died after PROMOTE (its down report still reads primary at the epoch, fresh): not confirmed, replan",
      shard: () =>
        interrupted("confirm").withNode({
          node_id: "r1",
          role: "primary",
          epoch: 4,
          ageMs: 700,
          db_status: "down",
          db_crash: {
            state: "restarted",
            run_id: "r1-run",
            first_seen: (NOW - 500) * 1000,
            last_seen: (NOW - 50) * 1000,
          },
        }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
    {
      name: "promote, target alive and not overdue: the same PROMOTE again",
      shard: () => interrupted("promote"),
      expected: { kind: "continue", from: "promote" },
    },
    {
      name: "confirm, target alive but overdue: replan",
      shard: () => {
        const shard = interrupted("confirm").withNode(R2_AS_FAR);
        const topology = shard.build().topology as Topology;
        const failover = topology.failover as NonNullable<Topology["failover"]>;
        return shard.withTopology({
          failover: {
            ...failover,
            phase_started: { epoch_bumped: NOW - MAX_CONFIRM_ROUNDS * CONFIRM_MS - 1 },
          },
        });
      },
      expected: { kind: "replan" },
    },
    {
      // Simulator seed 320092: the controller froze 42 s between recording promote and sending
      // PROMOTE, then had no time left to confirm; 24 ms after the target applied PROMOTE the next
      // invocation judged it overdue from the epoch bump and took the shard offline.
      name: "confirm, overdue since the epoch bump but PROMOTE sent within a confirm timeout (simulator seed 320092): the same PROMOTE again",
      shard: () => {
        const shard = interrupted("confirm");
        const topology = shard.build().topology as Topology;
        const failover = topology.failover as NonNullable<Topology["failover"]>;
        return shard.withTopology({
          failover: {
            ...failover,
            phase_started: {
              epoch_bumped: NOW - 42_000,
              promote: NOW - 42_000,
              confirm: NOW - 30,
            },
          },
        });
      },
      expected: { kind: "continue", from: "promote" },
    },
    {
      name: "confirm, overdue, the confirm start an earlier plan's (before this plan's bump): replan",
      shard: () => {
        const shard = interrupted("confirm").withNode(R2_AS_FAR);
        const topology = shard.build().topology as Topology;
        const failover = topology.failover as NonNullable<Topology["failover"]>;
        return shard.withTopology({
          failover: {
            ...failover,
            phase_started: {
              confirm: NOW - MAX_CONFIRM_ROUNDS * CONFIRM_MS - 10,
              epoch_bumped: NOW - MAX_CONFIRM_ROUNDS * CONFIRM_MS - 1,
            },
          },
        });
      },
      expected: { kind: "replan" },
    },
    {
      name: "confirm, overdue, PROMOTE sent more than a confirm timeout ago: replan",
      shard: () => {
        const shard = interrupted("confirm").withNode(R2_AS_FAR);
        const topology = shard.build().topology as Topology;
        const failover = topology.failover as NonNullable<Topology["failover"]>;
        return shard.withTopology({
          failover: {
            ...failover,
            phase_started: {
              epoch_bumped: NOW - MAX_CONFIRM_ROUNDS * CONFIRM_MS - 1,
              confirm: NOW - CONFIRM_MS - 1,
            },
          },
        });
      },
      expected: { kind: "replan" },
    },
    {
      name: "confirm, target dead: replan to the next eligible node",
      shard: () => interrupted("confirm").withNode({ node_id: "r1", ageMs: 10_000 }),
      expected: { kind: "replan" },
    },
    {
      name: "confirm, target without heartbeat and nobody else eligible: offline",
      shard: () => interrupted("confirm").without("r1").withNode({ node_id: "r2", priority: 0 }),
      expected: { kind: "offline" },
    },
  ];

  for (const row of rows) {
    it(row.name, () => {
      expect(continuation(row.shard())).toMatchObject(row.expected);
    });
  }

  it("names the new target of a replan and keeps the old primary and lineage", () => {
    const next = continuation(interrupted("confirm").withNode({ node_id: "r1", ageMs: 10_000 }));
    expect(next.kind === "replan" && next.failover).toMatchObject({
      kind: "failover",
      old_primary_node_id: "p1",
      new_primary_node_id: "r2",
      lineage: { node_id: "p1" },
    });
    expect(next.reason).toMatch(/target r1 is no longer alive after PROMOTE; promoting r2 instead/);
  });

  it("records the target's new lineage when it died after applying PROMOTE, so its repointed replicas can bring the shard back", () => {
    // Prepare: r1 applied PROMOTE at epoch 4 (a new replication id) and took writes; r2 follows it; then r1 died.
    const shard = interrupted("confirm")
      .withNode({
        node_id: "r1",
        role: "primary",
        epoch: 4,
        repl_id: "r1-promoted",
        last_txn_id: 1500,
        ageMs: 10_000,
      })
      .withNode({ node_id: "r2", epoch: 4, repl_id: "r1-promoted", last_txn_id: 1490, primary_node_id: "r1" })
      .guardedBy(["r1"]);

    // Act
    const next = continuation(shard);

    // Assess: offline on r1's lineage (r2 is not in p1's set), and r2 continues it.
    expect(next).toMatchObject({ kind: "offline", lineage: { node_id: "r1", repl_id: "r1-promoted" } });
    const offline = aShard()
      .withNode({ node_id: "p1", ageMs: 60_000 })
      .withNode({
        node_id: "r1",
        role: "primary",
        epoch: 4,
        repl_id: "r1-promoted",
        last_txn_id: 1500,
        ageMs: 10_000,
      })
      .withNode({ node_id: "r2", epoch: 4, repl_id: "r1-promoted", last_txn_id: 1490, primary_node_id: "r1" })
      .withTopology({
        status: "offline",
        epoch: 5,
        primary_node_id: undefined,
        primary_address: undefined,
        lineage: next.kind === "offline" ? next.lineage : undefined,
      });
    expect(decide(offline.build(), config, NOW)).toMatchObject({
      kind: "bring_online",
      target: { node_id: "r2" },
    });
  });

  it("throws FailoverStateMissing, not LockLost, for failing_over without a plan", () => {
    const shard = aShard().withTopology({ status: "failing_over", phase: "promote", failover: undefined });
    expect(() => continuation(shard)).toThrow(FailoverStateMissing);
    expect(() => continuation(aShard())).toThrow(FailoverStateMissing);
  });

  it("confirms a target only from a database that answers: a fresh down report saying primary at the epoch is no confirmation", () => {
    const up = interrupted("confirm").withNode({ node_id: "r1", role: "primary", epoch: 4, ageMs: 700 });
    expect(targetConfirmed(up.build(), "r1", 4, config, NOW)).toBe(true);
    const down = up.withNode({ node_id: "r1", db_status: "down" });
    expect(targetConfirmed(down.build(), "r1", 4, config, NOW)).toBe(false);
  });

  it("reads the plan's target while failing over and the primary otherwise", () => {
    expect(planTarget(interrupted("promote", "r2").build().topology as Topology)).toBe("r2");
    expect(planTarget(aShard().build().topology as Topology)).toBe("p1");
  });
});

/**
 * Simulator seed 420097 (guarantee 1, 3,182 replica-acknowledged writes lost): p1, the primary of
 * LINEAGE (promoted from lineage-0 at 500, the shard's recorded history), restarted empty; its
 * agent stepped it down to the failover's target, which was never promoted, and it answers as a
 * replica of nowhere on the empty process's lineage at offset 0. r1 and r2 hold every write and
 * are parked (no primary, link down). A controller resumes the failover before PROMOTE and judges
 * the shard as it was: the history must come with it, or the demoted p1 is judged by its own
 * (empty) lineage, r1 and r2 are "foreign", the shard goes offline on that lineage, and it is
 * brought back on p1 at offset 0.
 */
const emptyDemotedPrimary = (ancestry: Topology["ancestry"]) => {
  const shard = aShard()
    .withNode({
      node_id: "p1",
      role: "replica",
      repl_id: "lineage-empty",
      last_txn_id: 0,
      primary_node_id: undefined,
      primary_link: "down",
      role_since: (NOW - 120_000) * 1000,
    })
    .withNode({ node_id: "r1", last_txn_id: 1000, primary_node_id: undefined, primary_link: "down" })
    .withNode({ node_id: "r2", last_txn_id: 990, primary_node_id: undefined, primary_link: "down" })
    .failingOver("epoch_bumped", "r1");
  return ancestry === undefined ? shard : shard.withTopology({ ancestry });
};

describe("decideContinuation: before PROMOTE, the shard is judged with its lineage history (simulator seed 420097)", () => {
  const HISTORY = [{ repl_id: "lineage-0", until: 500, by: LINEAGE }];
  const rows: ReadonlyArray<{
    readonly name: string;
    readonly shard: () => ShardBuilder;
    readonly expected: Partial<Continuation> & { kind: Continuation["kind"] };
  }> = [
    {
      name: "the demoted primary restarted empty, the holders parked: the plan to r1 holds",
      shard: () => emptyDemotedPrimary(HISTORY),
      expected: { kind: "continue", from: "promote" },
    },
    {
      name: "the same with the target gone: another holder of the lineage, never the empty node",
      shard: () => emptyDemotedPrimary(HISTORY).withNode({ node_id: "r1", ageMs: 10_000 }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
    {
      name: "the same with both holders gone: offline on the history's lineage, not the empty one",
      shard: () =>
        emptyDemotedPrimary(HISTORY)
          .withNode({ node_id: "r1", ageMs: 10_000 })
          .withNode({ node_id: "r2", ageMs: 10_000 }),
      expected: { kind: "offline", lineage: expect.objectContaining({ repl_id: LINEAGE }) },
    },
    // No history at all (the shard's only primary the initial one; simulator seed 171726, 374 lost):
    // the plan's stored lineage is what decide judged, never the empty process's own.
    {
      name: "no history, the demoted primary restarted empty: the plan to r1 holds on the plan's stored lineage (seed 171726)",
      shard: () => emptyDemotedPrimary(undefined),
      expected: { kind: "continue", from: "promote" },
    },
    {
      name: "no history, the target gone: another holder of the plan's lineage, never offline on the empty one (seed 171726)",
      shard: () => emptyDemotedPrimary(undefined).withNode({ node_id: "r1", ageMs: 10_000 }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
  ];

  it.each(rows)("$name", ({ shard, expected }) => {
    // Act
    const result = continuation(shard());

    // Assess
    expect(result).toMatchObject(expected);
  });
});

/** p1 dead; the failover to r1 is past PROMOTE and r1's database died (its agent still reports). */
const targetDown = () =>
  interrupted("confirm").withNode({
    node_id: "r1",
    ageMs: 10_000,
    db_status: "down",
    agent_updated: (NOW - 200) * 1000,
  });

describe("decideContinuation: a retarget passes the gates a failover passes (RETARGET_GATES)", () => {
  const rows: ReadonlyArray<{
    readonly name: string;
    readonly shard: () => ShardBuilder;
    readonly expected: Partial<Continuation> & { kind: Continuation["kind"] };
    readonly reason: string;
  }> = [
    {
      name: "waits for a quiet replica's report before ranking on its old offset",
      shard: () =>
        targetDown().withNode({
          node_id: "r3",
          ageMs: 5000,
          agent_updated: (NOW - 5000) * 1000,
          keepalive_ms: 30_000,
          last_txn_id: 995,
        }),
      expected: { kind: "wait", code: "awaiting_reports", awaiting: ["r3"] },
      reason: "waiting for r3 to report",
    },
    {
      name: "waits while a member of the old primary's set is unheard (it may hold writes only it acknowledged)",
      shard: () => targetDown().guardedBy(["r1", "r2", "r3"]),
      expected: { kind: "wait", code: "member_unheard" },
      reason: "member r3 of p1's replica set has no heartbeat stored",
    },
    {
      name: "waits while the dead target, a member, is unheard itself (it held the most)",
      shard: () => interrupted("confirm").withNode({ node_id: "r1", ageMs: 10_000 }).guardedBy(["r1", "r2"]),
      expected: { kind: "wait", code: "member_unheard" },
      reason: "member r1 of p1's replica set unheard for 10 s",
    },
    {
      name: "waits while the old primary's last report lists a replica no node names (it may hold writes only it acknowledged)",
      shard: () =>
        targetDown()
          .withNode({ node_id: "p1", ageMs: 10_000, outsiders: ["10.0.0.9:6379"] })
          .guardedBy(["r1", "r2"]),
      expected: { kind: "wait", code: "outsider_unheard" },
      reason: "p1's last report lists replicas no node id names acknowledging its writes (10.0.0.9:6379)",
    },
    {
      name: "waits while a replica outside the set followed the old primary after its agent's last report, its own agent unheard since",
      shard: () =>
        targetDown()
          .withNode({ node_id: "p1", ageMs: 30_000 })
          .withNode({ node_id: "r3", ageMs: 10_000, primary_link: "up", last_txn_id: 900 })
          .guardedBy(["r1", "r2"]),
      expected: { kind: "wait", code: "follower_unheard" },
      reason: "r3, outside p1's replica set, its agent last heard 10 s ago",
    },
    {
      name: "waits for a replica further ahead that went stale only just now",
      shard: () => targetDown().withNode({ node_id: "r3", ageMs: 5000, last_txn_id: 995 }),
      expected: { kind: "wait", code: "waiting_for_replica" },
      reason: "r3 (last_txn_id 995, heartbeat 5000 ms old), further ahead, may still answer",
    },
    {
      name: "waits for a live replica outside the old primary's set that holds more",
      shard: () => targetDown().withNode({ node_id: "r3", last_txn_id: 995 }).guardedBy(["r1", "r2"]),
      expected: { kind: "wait", code: "waiting_for_replica" },
      reason: "r3 (last_txn_id 995), outside p1's replica set, holds more",
    },
    {
      name: "waits for a priority-0 replica that holds more (never promoted, never passed over)",
      shard: () => targetDown().withNode({ node_id: "r3", priority: 0, last_txn_id: 995 }),
      expected: { kind: "wait", code: "waiting_for_replica" },
      reason: "r3 (priority 0, last_txn_id 995) holds more",
    },
    {
      name: "judges the replicas that followed the target through the link the plan was decided on (sim 340561)",
      shard: () => {
        const shard = targetDown()
          .guardedBy(["r1", "r2"])
          .withNode({ node_id: "r2", repl_id: "lineage-b", last_txn_id: 1200 });
        const topology = shard.build().topology as Topology;
        return shard.withTopology({
          failover: {
            ...(topology.failover as NonNullable<Topology["failover"]>),
            target_link: { repl_id: LINEAGE, until: 1000, by: "lineage-b" },
          },
        });
      },
      expected: { kind: "replan" },
      reason: "target r1 is no longer alive after PROMOTE; promoting r2 instead",
    },
    {
      name: "retargets once no gate holds: the dead target's agent reports, the other member is heard",
      shard: () => targetDown().guardedBy(["r1", "r2"]),
      expected: { kind: "replan" },
      reason: "target r1 is no longer alive after PROMOTE; promoting r2 instead",
    },
  ];

  for (const row of rows) {
    it(row.name, () => {
      // Act
      const next = continuation(row.shard());

      // Assess
      expect(next).toMatchObject(row.expected);
      expect(next.reason).toContain(row.reason);
    });
  }
});

/**
 * Simulator seed 72080 (guarantee 3; offline for good, 1,426 writes held by a parked replica): the
 * failover from p1 to r1 applied its PROMOTE (r1: a new replication id continuing LINEAGE from
 * 1000, no replica yet, writes acknowledged by r1 alone) and its controller froze in \`confirm\`.
 * r1's database was then killed and restarted empty (fenced); r2, parked on LINEAGE at 1000, holds
 * every write a replica acknowledged but was cut off from the store when the thawed controller
 * went on. The continuation stored r1's new lineage and nothing linked it to LINEAGE (the change
 * never completed, so its link was never recorded), and from then on r2 was "foreign". Now the
 * offline mark records the link the target's own report shows, from its last answer
 * (\`answered_prior_lineage\`), and rule 7's ancestor last resort takes r2.
 */
const PROMOTED = "lineage-r1";

/** r1 promoted (PROMOTED from LINEAGE at 1000, to 1384 alone), then restarted empty; r2 parked, cut off. */
const promotedThenEmpty = (r1: Partial<HeartbeatInput> & { ageMs?: number } = {}) =>
  interrupted("confirm")
    .withNode({
      node_id: "r1",
      role: "primary",
      epoch: 4,
      repl_id: PROMOTED,
      last_txn_id: 1384,
      primary_node_id: undefined,
      primary_link: undefined,
      ageMs: 55_000,
      db_status: "down",
      db_crash: {
        state: "restarted",
        run_id: "r1-run",
        first_seen: (NOW - 55_000) * 1000,
        last_seen: NOW * 1000,
      },
      agent_updated: (NOW - 200) * 1000,
      answered_prior_lineage: { repl_id: LINEAGE, last_txn_id: 1000 },
      ...r1,
    })
    .withNode({
      node_id: "r2",
      last_txn_id: 1000,
      primary_node_id: undefined,
      primary_link: "down",
      ageMs: 13_000,
      agent_updated: (NOW - 13_000) * 1000,
    });

const LINK = { repl_id: LINEAGE, until: 1000, by: PROMOTED };

describe("decideContinuation: a target that died after its PROMOTE leaves its promotion's link in the lineage history (simulator seed 72080)", () => {
  const rows: ReadonlyArray<{
    readonly name: string;
    readonly shard: () => ShardBuilder;
    readonly ancestry: Topology["ancestry"];
  }> = [
    {
      name: "offline on the target's new lineage, recording that it continues the plan's lineage up to its last answer's prior",
      shard: () => promotedThenEmpty(),
      ancestry: [LINK],
    },
    {
      name: "appended to the history the shard already had",
      shard: () =>
        promotedThenEmpty().withTopology({ ancestry: [{ repl_id: "lineage-0", until: 500, by: LINEAGE }] }),
      ancestry: [{ repl_id: "lineage-0", until: 500, by: LINEAGE }, LINK],
    },
    {
      name: "from the target's own prior_lineage while its report is of a database that answered (stale, not dead)",
      shard: () =>
        promotedThenEmpty({
          db_status: "up",
          db_crash: undefined,
          ageMs: 10_000,
          agent_updated: (NOW - 10_000) * 1000,
          answered_prior_lineage: undefined,
          prior_lineage: { repl_id: LINEAGE, last_txn_id: 1000 },
        }),
      ancestry: [LINK],
    },
    {
      name: "nothing recorded from an agent that does not report the dead process's prior (no link, no guess)",
      shard: () => promotedThenEmpty({ answered_prior_lineage: undefined }),
      ancestry: undefined,
    },
    {
      name: "nothing recorded from a down report's prior_lineage (a restarted process's data, never the dead one's link)",
      shard: () =>
        promotedThenEmpty({
          answered_prior_lineage: undefined,
          prior_lineage: { repl_id: LINEAGE, last_txn_id: 1000 },
          db_crash: {
            state: "refused",
            run_id: "r1-run",
            first_seen: (NOW - 55_000) * 1000,
            last_seen: NOW * 1000,
          },
        }),
      ancestry: undefined,
    },
    {
      name: "nothing recorded when the target's new lineage continues another lineage than the plan's",
      shard: () => promotedThenEmpty({ answered_prior_lineage: { repl_id: "lineage-x", last_txn_id: 1000 } }),
      ancestry: undefined,
    },
  ];

  it.each(rows)("$name", ({ shard, ancestry }) => {
    // Act
    const next = continuation(shard());

    // Assess
    expect(next).toMatchObject({
      kind: "offline",
      lineage: { node_id: "r1", repl_id: PROMOTED, last_txn_id: 1384 },
    });
    expect(next.kind === "offline" ? next.ancestry : "not offline").toEqual(ancestry);
  });

  /** The shard as the offline mark leaves it, `offlineForMs` later: r2 back in the store, p1 a replica of its own RDB. */
  const offlineAfter = (
    next: Continuation,
    offlineForMs: number,
    r1: Partial<HeartbeatInput> & { ageMs?: number } = {},
  ) =>
    promotedThenEmpty(r1)
      .withNode({ node_id: "r2", ageMs: 200, agent_updated: (NOW - 200) * 1000 })
      .withNode({
        node_id: "p1",
        ageMs: 200,
        repl_id: "lineage-p1-rdb",
        last_txn_id: 500,
        primary_node_id: undefined,
        primary_link: "down",
      })
      .withTopology({
        status: "offline",
        epoch: 5,
        phase: undefined,
        failover: undefined,
        primary_node_id: undefined,
        primary_address: undefined,
        updated_at: NOW - offlineForMs,
        lineage: next.kind === "offline" ? next.lineage : undefined,
        ancestry: next.kind === "offline" && next.ancestry !== undefined ? [...next.ancestry] : undefined,
      });

  it("brings the shard back on the parked replica, the ancestor holding the promotion point, once every node answers", () => {
    // Prepare
    const next = continuation(promotedThenEmpty());

    // Act
    const decision = decide(offlineAfter(next, 30_000).build(), config, NOW);

    // Assess: r2 holds PROMOTED up to 1000, 384 bytes behind r1's last answer (what r1 alone acknowledged).
    expect(decision).toMatchObject({
      kind: "bring_online",
      target: { node_id: "r2" },
      candidates: expect.arrayContaining([expect.objectContaining({ node_id: "r2", last_txn_id: 1000 })]),
    });
  });

  it("takes it only as the last resort: not while the target's agent is unheard within the grace (it may return with more)", () => {
    // Prepare
    const next = continuation(promotedThenEmpty());

    // Act
    const decision = decide(
      offlineAfter(next, 30_000, { agent_updated: (NOW - 30_000) * 1000, db_crash: undefined }).build(),
      config,
      NOW,
    );

    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "offline_no_candidate" });
  });
});

/** A failover to r1 (990) left at \`phase\` long ago: past MAX_CONFIRM_ROUNDS since the bump. */
const overdue = (phase: FailoverPhase, phaseStarted: Record<string, number>) => {
  const shard = interrupted(phase);
  const topology = shard.build().topology as Topology;
  return shard.withTopology({
    failover: {
      ...(topology.failover as NonNullable<Topology["failover"]>),
      phase_started: { epoch_bumped: NOW - 60_000, ...phaseStarted },
    },
  });
};

/** A table row: the shard, the continuation expected, and words its reason must hold. */
interface ContinuationRow {
  readonly name: string;
  readonly shard: () => ShardBuilder;
  readonly expected: Partial<Continuation> & { kind: Continuation["kind"] };
  readonly reason?: string;
}

function itContinuesAsExpected(rows: readonly ContinuationRow[]): void {
  for (const row of rows) {
    it(row.name, () => {
      // Act
      const next = continuation(row.shard());

      // Assess
      expect(next).toMatchObject(row.expected);
      if (row.reason !== undefined) expect(next.reason).toContain(row.reason);
    });
  }
}

/**
 * Simulator seed 420290 (guarantee 1, 125 replica-acknowledged writes lost): a controller recorded
 * phase `promote` of a failover to n2 and froze before sending PROMOTE; 60 s later the next
 * invocation found n2 alive (fresh heartbeat, parked replica holding the lineage to 188,928), judged
 * it "did not confirm in time" from the epoch bump and promoted n3, 6,000 bytes behind it: n2 then
 * full-synced from n3. Rule `live_target_ahead`: a live target holding more than every other node
 * keeps the plan and gets its PROMOTE again.
 */
describe("decideContinuation: a live target holding more is not replaced (rule live_target_ahead, simulator seed 420290)", () => {
  const frozenBeforePromote = () => overdue("promote", { promote: NOW - 60_000 });
  const rows: readonly ContinuationRow[] = [
    {
      name: "never sent PROMOTE, the live target ahead of the other member: PROMOTE again, not a replan to r2",
      shard: frozenBeforePromote,
      expected: { kind: "continue", from: "promote" },
      reason: "alive and holds the lineage to 990, and the best other node, r2, holds 980",
    },
    {
      name: "PROMOTE sent more than a confirm timeout ago, the live target still ahead: PROMOTE again",
      shard: () => overdue("confirm", { promote: NOW - 60_000, confirm: NOW - CONFIRM_MS - 1 }),
      expected: { kind: "continue", from: "promote" },
      reason: "alive and holds the lineage to 990",
    },
    {
      name: "the live target and no other node eligible: PROMOTE again, not offline",
      shard: () => frozenBeforePromote().withNode({ node_id: "r2", priority: 0, last_txn_id: 980 }),
      expected: { kind: "continue", from: "promote" },
      reason: "no other node is eligible",
    },
    {
      name: "another member holds as much: replan to it (nothing dropped)",
      shard: () => frozenBeforePromote().withNode(R2_AS_FAR),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
    {
      name: "the target ahead but its database down: not alive, replan",
      shard: () => frozenBeforePromote().withNode({ node_id: "r1", db_status: "down" }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
    {
      name: "the target alive on another lineage (restarted empty): it holds nothing, replan",
      shard: () =>
        frozenBeforePromote().withNode({ node_id: "r1", repl_id: "lineage-empty", last_txn_id: 0 }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
  ];

  itContinuesAsExpected(rows);
});

/**
 * Simulator seed 100696 (guarantee 3; 69.5 s without a writable primary to the end, 0 lost): the
 * failover's target n2 applied its PROMOTE at the epoch (a new lineage; n1 and n3 followed it), its
 * database was killed and came back from an RDB of the plan's lineage as a replica, parked. The plan
 * sent the same PROMOTE every cycle ("alive and holds the lineage", rule \`live_target_ahead\`); the
 * agent ignored it as already applied, and n3, holding the promoted lineage, was "foreign". Now: the
 * nodes that followed the target at the epoch carry its promotion (their lineage continues the
 * plan's), and a target whose promotion was undone with nobody carrying it gets a plan of its own
 * under a new epoch.
 */
describe("decideContinuation: a target whose promotion was undone after it applied PROMOTE (simulator seed 100696)", () => {
  /** The confirm phase long overdue: r1 applied PROMOTE at epoch 4 (its report is at 4) and answers as a replica again. */
  const undone = (r1: Partial<HeartbeatInput> = {}) =>
    overdue("confirm", { promote: NOW - 60_000, confirm: NOW - 50_000 }).withNode({
      node_id: "r1",
      epoch: 4,
      primary_link: "down",
      ...r1,
    });
  /** r2 followed r1's promotion at epoch 4: r1's new lineage, continuing the plan's to 1000. */
  const follower = (node_id: string, repl_id = PROMOTED, last_txn_id = 1200) => ({
    node_id,
    epoch: 4,
    role: "replica" as const,
    repl_id,
    last_txn_id,
    prior_lineage: { repl_id: LINEAGE, last_txn_id: 1000 },
    primary_node_id: undefined,
    primary_link: "down" as const,
  });
  const rows: readonly ContinuationRow[] = [
    {
      name: "the target back from an RDB as a replica, r2 on its promoted lineage: replan to r2, not the ignored PROMOTE",
      shard: () => undone().withNode(follower("r2")),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
    {
      name: "the old primary followed the promotion too: it witnesses the same lineage, replan to r2",
      shard: () =>
        undone()
          .withNode(follower("r2"))
          .withNode(follower("p1", PROMOTED, 1210)),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
    },
    {
      name: "nobody carries its promotion, it still holds the most: a plan of its own under a new epoch",
      shard: () => undone(),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r1" }) },
      reason: "it applied this epoch's PROMOTE and no longer answers as primary",
    },
    {
      name: "two nodes on different lineages after the plan's: no promotion read, the target a plan of its own",
      shard: () =>
        undone()
          .withNode(follower("r2", PROMOTED, 1200))
          .withNode(follower("p1", "lineage-other", 1300)),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r1" }) },
    },
    {
      name: "the old primary restarted from its RDB as a primary (its own new id continuing the plan's): no witness of the promotion",
      shard: () =>
        undone().withNode({
          ...follower("p1", "lineage-p1-restarted", 1300),
          role: "primary",
          primary_link: undefined,
        }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r1" }) },
    },
    {
      name: "a replica following another node on a new lineage: no witness of the target's promotion",
      shard: () => undone().withNode({ ...follower("r2", "lineage-elsewhere", 1300), primary_node_id: "p1" }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r1" }) },
    },
    {
      name: "the target never applied this epoch's PROMOTE (its report at epoch 3): its PROMOTE again, same epoch",
      shard: () => undone({ epoch: 3 }),
      expected: { kind: "continue", from: "promote" },
      reason: "alive and holds the lineage to 990",
    },
  ];

  itContinuesAsExpected(rows);
});

/**
 * Simulator seed 7003 on the schedule of the cool-down change (docs/open-holes, guarantee 1; 64
 * replica-acknowledged writes lost): the target n2 applied its PROMOTE and its agent died before its
 * next report (that report still at the epoch before, a replica); n3, repointed at it by the
 * topology, acknowledged writes on its new lineage. The retarget judged n3 "foreign" against the
 * plan's lineage, took the shard offline and brought it back on the old primary, and n3 full-synced
 * from it. A replica linked to the target at the epoch on a lineage continuing the plan's carries its
 * promotion even when the target never reported it.
 */
describe("decideContinuation: a target whose agent stopped before it reported its PROMOTE (simulator seed 7003, cool-down schedule)", () => {
  /** The confirm phase overdue; r1 applied PROMOTE at epoch 4, its agent silent since (last report at 3, a replica). */
  const silentTarget = (r2: Partial<HeartbeatInput> = {}) =>
    overdue("confirm", { promote: NOW - 20_000, confirm: NOW - 12_000 })
      .withNode({ node_id: "r1", epoch: 3, ageMs: 9_000 })
      .withNode({
        node_id: "r2",
        epoch: 4,
        role: "replica",
        repl_id: PROMOTED,
        last_txn_id: 1200,
        prior_lineage: { repl_id: LINEAGE, last_txn_id: 1000 },
        primary_node_id: "r1",
        primary_link: "up",
        ...r2,
      });
  const rows: readonly ContinuationRow[] = [
    {
      name: "r2 linked to the silent target on its new lineage: r2 is on the promotion, not foreign; replan to r2, no offline mark",
      shard: () => silentTarget(),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r2" }) },
      reason: "no longer alive after PROMOTE",
    },
    {
      name: "r2 on that lineage but parked (its link down): no witness of a promotion the target never reported",
      shard: () => silentTarget({ primary_node_id: undefined, primary_link: "down" }),
      expected: { kind: "offline" },
      reason: "r2: foreign replication lineage",
    },
    {
      name: "the target restarted from its RDB as a primary before the epoch, r2 linked to that process (its id continues the plan's from the RDB's point, behind it): no promotion; r3, holding the plan's lineage, is promoted (simulator seed 171777)",
      shard: () =>
        silentTarget({
          repl_id: "lineage-r1-restarted",
          last_txn_id: 520,
          prior_lineage: { repl_id: LINEAGE, last_txn_id: 500 },
        })
          .withNode({
            node_id: "r1",
            epoch: 3,
            ageMs: 9_000,
            role: "primary",
            repl_id: "lineage-r1-restarted",
            last_txn_id: 520,
            primary_node_id: undefined,
            primary_link: undefined,
          })
          .withNode({ node_id: "r3", last_txn_id: 985 }),
      expected: { kind: "replan", failover: expect.objectContaining({ new_primary_node_id: "r3" }) },
    },
    ...[
      {
        ranked: 1000,
        expected: {
          kind: "replan" as const,
          failover: expect.objectContaining({ new_primary_node_id: "r2" }),
        } as ContinuationRow["expected"],
        what: "its RDB at the offset the plan ranked it on: r2 holds what it took; replan to r2 (simulator seed 500367)",
      },
      {
        ranked: 1010,
        expected: { kind: "offline" } as ContinuationRow["expected"],
        what: "its RDB behind the offset the plan ranked it on: no witness (r2 foreign), as in seed 171777",
      },
    ].map(
      ({ ranked, expected, what }): ContinuationRow => ({
        name: `the target's database restarted from an RDB since its last report (a replica, reported down and restarted), r2 linked to the restarted process on a new id continuing the plan's from 1000, ${what}`,
        shard: () => {
          const shard = silentTarget({ repl_id: "lineage-r1-rdb", last_txn_id: 1200 }).withNode({
            node_id: "r1",
            epoch: 3,
            ageMs: 9_000,
            role: "replica",
            last_txn_id: 1000,
            db_status: "down",
            db_crash: {
              state: "restarted",
              run_id: "r1-run",
              first_seen: (NOW - 9_000) * 1000,
              last_seen: NOW * 1000,
            },
          });
          const failover = shard.build().topology?.failover as NonNullable<Topology["failover"]>;
          return shard.withTopology({
            failover: {
              ...failover,
              candidates: [
                {
                  node_id: "r1",
                  node_address: "r1.local:6379",
                  last_txn_id: ranked,
                  priority: 100,
                  eligible: true,
                  reason: "eligible",
                },
              ],
            },
          });
        },
        expected,
        ...(expected.kind === "offline" ? { reason: "r2: foreign replication lineage" } : {}),
      }),
    ),
    {
      name: "r2 linked to another node on a new lineage: no witness either",
      shard: () => silentTarget({ primary_node_id: "p1" }),
      expected: { kind: "offline" },
      reason: "r2: foreign replication lineage",
    },
  ];

  itContinuesAsExpected(rows);
});

/**
 * A random history of controllers resuming one failover: at each step a controller finds the
 * shard failing_over in some phase with some nodes alive, and applies decideContinuation as the
 * orchestrator does (continue, wait: same epoch, same plan; anything else: epoch + 1). Every PROMOTE
 * it would send (continue from promote, or a new plan) is recorded with its epoch.
 */
const stepArb = fc.record({
  phase: fc.constantFrom<FailoverPhase>("epoch_bumped", "promote", "confirm", "repoint", "cleanup"),
  r1Age: fc.constantFrom(100, 10_000),
  r2Age: fc.constantFrom(100, 10_000),
  r3Age: fc.constantFrom(100, 10_000),
  r1Confirmed: fc.boolean(),
  primaryBack: fc.boolean(),
  overdue: fc.boolean(),
});

type Step = typeof stepArb extends fc.Arbitrary<infer T> ? T : never;

function replay(steps: ReadonlyArray<Step>) {
  const promotes: Array<{ epoch: number; target: string }> = [];
  const epochs: number[] = [];
  let topology: Topology | undefined;
  for (const step of steps) {
    let shard = aShard()
      .withNode({ node_id: "r3", last_txn_id: 970 })
      .withStalePrimary()
      .withNode({
        node_id: "r1",
        ageMs: step.r1Age,
        role: step.r1Confirmed ? "primary" : "replica",
        epoch: 9,
      })
      .withNode({ node_id: "r2", ageMs: step.r2Age })
      .withNode({ node_id: "r3", ageMs: step.r3Age });
    if (step.primaryBack) {
      shard = shard.withNode({ node_id: "p1", ageMs: 100 });
      for (const id of ["r1", "r2", "r3"]) shard = shard.withNode({ node_id: id, primary_link: "up" });
    }
    if (topology === undefined || topology.status !== "failing_over") {
      // A new failover (after the last one ended) starts at the next epoch.
      const started = shard.failingOver(step.phase).build().topology as Topology;
      topology = { ...started, epoch: topology === undefined ? started.epoch : topology.epoch + 1 };
      epochs.push(topology.epoch);
    }
    const failover = topology.failover as NonNullable<Topology["failover"]>;
    const current: Topology = {
      ...topology,
      phase: step.phase,
      failover: {
        ...failover,
        phase_started: {
          epoch_bumped: step.overdue ? NOW - MAX_CONFIRM_ROUNDS * CONFIRM_MS - 1 : NOW - 1000,
        },
      },
    };
    const snapshot: ShardSnapshot = { ...shard.build(), topology: current };
    const next = decideContinuation(snapshot, config, NOW, options);
    epochs.push(current.epoch);
    if (next.kind === "continue") {
      if (next.from === "promote")
        promotes.push({ epoch: current.epoch, target: failover.new_primary_node_id });
      topology = current;
    } else if (next.kind === "wait") {
      topology = current;
    } else if (next.kind === "replan") {
      topology = { ...current, epoch: current.epoch + 1, phase: "epoch_bumped", failover: next.failover };
      promotes.push({ epoch: topology.epoch, target: next.failover.new_primary_node_id });
    } else {
      topology = {
        ...current,
        epoch: current.epoch + 1,
        status: next.kind === "offline" ? "offline" : "online",
      };
    }
    epochs.push(topology.epoch);
  }
  return { promotes, epochs };
}

describe("decideContinuation: properties", () => {
  it("never makes two nodes the target of a PROMOTE at the same epoch", () => {
    fc.assert(
      fc.property(fc.array(stepArb, { minLength: 1, maxLength: 12 }), (steps) => {
        const { promotes } = replay(steps);
        const byEpoch = new Map<number, Set<string>>();
        for (const { epoch, target } of promotes)
          byEpoch.set(epoch, (byEpoch.get(epoch) ?? new Set()).add(target));
        return [...byEpoch.values()].every((targets) => targets.size <= 1);
      }),
      { numRuns: 500 },
    );
  });

  it("never lowers the epoch", () => {
    fc.assert(
      fc.property(fc.array(stepArb, { minLength: 1, maxLength: 12 }), (steps) => {
        const { epochs } = replay(steps);
        return epochs.every((epoch, index) => index === 0 || epoch >= (epochs[index - 1] ?? 0));
      }),
      { numRuns: 500 },
    );
  });
});
