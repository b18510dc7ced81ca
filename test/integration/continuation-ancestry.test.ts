import { describe, expect, it } from "vitest";
import { L1_KEYS, L2_KEYS, resumedEmptyPrimary } from "../support/resumed-empty-primary.ts";

/**
 * Simulator seed 420097 (guarantee 1, 3,182 replica-acknowledged writes lost), with real
 * redis-server processes and agents, DynamoDB Local and SQS, and an in-process controller.
 *
 * n1 was the shard's first primary (lineage L1); n2 was promoted from it (lineage L2, recorded in
 * `topology.ancestry` as L1 -> L2 at the promotion's offset); n1 and n3 follow n2 and acknowledge
 * every write. n2's database restarts empty: n1's and n3's agents park their replicas (they hold
 * every write); n2's agent fences it. A failover to n1 is recorded past its point of no return and
 * its controller freezes before PROMOTE: n2's agent steps n2 down to n1, which refuses its sync
 * (-NOMASTERLINK: n1 is parked), so n2 stays an empty replica, link down, on the empty process's
 * own replication id at offset 0; n3's agent follows n1 too (refused as well). The next controller
 * retargets to n3 and freezes right after the epoch bump (phase `epoch_bumped`, before PROMOTE;
 * no lock left): n3's agent follows the old primary that plan names, n2 (refused again: n2's link
 * is down), and parks when n2's address is cut off. The cycle under test resumes that plan: before
 * PROMOTE, the continuation judges the shard as it was before the change
 * (src/core/continuation.ts `reconsider` -> `topologyBefore`). No follower names n2 and an online
 * topology stores no lineage: the demoted n2 is judged by the shard's lineage history
 * (online-view.ts `historyTip`). Without that history (the code before 889cc0f dropped `ancestry`
 * there) it was judged by its own empty lineage: n1 and n3 were "foreign", the shard went offline
 * on the empty lineage and was brought back on n2 at offset 0, over the two holders of every write.
 *
 * n2 is reached by the other nodes through a TCP proxy (its agent's `--address`). At the
 * simulator's decision (instrumented replay) n1's probe reported n2 `unreachable` and n3's
 * `restarted` (n1 and n2 had been partitioned), and n3 had parked on its connection to n2
 * closing. Here the proxy resets n1's probe connections from the empty restart on, and is cut and
 * restored once n3 follows n2. Without the first, both parked replicas' probes find n2 without
 * their data, and the controller takes the shard's lineage from them (online-view.ts
 * `restartedPrimary`): right on both codes (checked: the test then passed before 889cc0f too).
 *
 * Test-written, instead of frozen controllers: the two failover plans (epoch 2 to n1 in phase
 * `promote`, epoch 3 to n3 in phase `epoch_bumped`, n1 deposed), written as the controllers would
 * have (compare-and-set on the epoch). n2's promotion from n1 is done by hand (REPLICAOF NO ONE,
 * then n1 and n3 REPLICAOF n2) before the agents start, its link recorded in the online topology at
 * epoch 1 as the controller records one.
 *
 * The scenario: test/support/resumed-empty-primary.ts, here with the lineage history (`history:
 * true`); resumed-no-history.test.ts runs it without (simulator seed 171726).
 */

describe("a failover resumed before PROMOTE, its old primary restarted empty behind parked replicas", () => {
  it("is judged with the shard's lineage history: the holders of every write, never the empty node (simulator seed 420097)", {
    timeout: 120_000,
  }, async () => {
    // Arrange, Act: the scene, then a fresh controller resumes the plan.
    const outcome = await resumedEmptyPrimary({ history: true, prefix: "continuation-ancestry" });

    // Assess: never offline, online on a holder (n1 or n3) with every acknowledged write.
    expect(outcome.offline, outcome.summary).toEqual([]);
    expect(["n1", "n3"], outcome.summary).toContain(outcome.primary);
    expect(outcome.l1Keys, "L1's writes on the primary").toBe(L1_KEYS);
    expect(outcome.l2Keys, "L2's writes on the primary").toBe(L2_KEYS);
  });
});
