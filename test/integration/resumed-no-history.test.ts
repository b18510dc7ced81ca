import { describe, expect, it } from "vitest";
import { L2_KEYS, resumedEmptyPrimary } from "../support/resumed-empty-primary.ts";

/**
 * Simulator seed 171726 (guarantee 1, 374 replica-acknowledged writes lost, the shard offline to
 * the end), with real redis-server processes and agents, DynamoDB Local and SQS, and an
 * in-process controller: the scenario of continuation-ancestry.test.ts (seed 420097) in a shard
 * with no lineage history (test/support/resumed-empty-primary.ts, `history: false`).
 *
 * n2 is the shard's initial primary (epoch 1, no failover yet: the topology's `ancestry` is
 * empty; made a primary before any write, as the shared scenario names the empty node n2); n1 and
 * n3 acknowledge every write (WAIT 2). n2's redis-server is killed and restarts
 * empty (wiped data, fenced by its config): n1's and n3's agents park their replicas (they hold
 * every write), n2's agent fences it. A failover to n1 is recorded past PROMOTE, then retargeted
 * to n3 and frozen right after the epoch bump (phase `epoch_bumped`, before PROMOTE): n2's agent
 * steps n2 down to n1 (refused: n1 is parked), so n2 is an empty replica on the empty process's
 * own lineage at offset 0; n3 parks again. A controller resumes that plan: before PROMOTE, the
 * continuation judges the shard as it was before the change (src/core/continuation.ts
 * `topologyBefore`): no follower names n2, and with no history the reference is the plan's stored
 * lineage (L2, n2's before the restart).
 *
 * Guarantee 1: the shard comes back online on n1 or n3 with every acknowledged write, and no
 * topology write marks it offline (on n2's empty lineage) or promotes n2.
 *
 * Fails before b3edc49 (`topologyBefore` dropped the plan's lineage for an online shard: n2's own
 * empty lineage became the reference, n1 and n3 "foreign replication lineage", the first write
 * `offline` at epoch 4): 3 of 3 runs failed so with b3edc49^'s continuation.ts and
 * transitions.ts, "no node is eligible (n1: foreign replication lineage …, n3: …); marking the
 * shard offline"; 3 of 3 passed on b3edc49 (resumed as a replan to n1 at epoch 4, 14-18 s).
 */
describe("a failover resumed before PROMOTE in a shard with no lineage history, its old primary restarted empty", () => {
  it("is judged with the plan's stored lineage: online on a holder of every write, never offline on the empty one (simulator seed 171726)", {
    timeout: 90_000,
  }, async () => {
    // Arrange, Act: the scene, then a fresh controller resumes the plan.
    const outcome = await resumedEmptyPrimary({ history: false, prefix: "resumed-no-history" });

    // Assess: never offline, online on a holder (n1 or n3) with every acknowledged write.
    expect(outcome.offline, outcome.summary).toEqual([]);
    expect(["n1", "n3"], outcome.summary).toContain(outcome.primary);
    expect(outcome.l2Keys, "L2's writes on the primary").toBe(L2_KEYS);
  });
});
