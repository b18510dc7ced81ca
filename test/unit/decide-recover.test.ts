import { describe, expect, it } from "vitest";
import { decide, planRecover } from "../../src/core/decide.ts";
import { aConfig, aShard, NOW } from "../support/builders.ts";

/**
 * Issue 30, finding 8 (guarantee 2): \`shardguard recover\` set the shard's lineage to the chosen
 * node's, so the offline replica-set rule compared the node with itself. In the situation that
 * prompts it (the old primary's agent paused, its replica set empty, its database writable) it
 * made two writable primaries. Gate \`recover_unfenced_old_primary\`.
 */

/** Offline; p1 (the old primary) unheard for 10 s with no crash report; r1 on another lineage, alive. */
function anOfflineShardWithAnUnheardOldPrimary() {
  return aShard()
    .offline()
    .withNode({ node_id: "p1", ageMs: 10_000 })
    .withNode({ node_id: "r1", repl_id: "lineage-r1", last_txn_id: 700, primary_link: "down" })
    .withNode({ node_id: "r2", ageMs: 10_000, primary_link: "down" });
}

describe("planRecover: shardguard recover keeps the replica-set rule", () => {
  it("refuses to recover on a node outside the old primary's replica set while its agent is unheard (issue 30 finding 8)", () => {
    // Prepare
    const snapshot = anOfflineShardWithAnUnheardOldPrimary().guardedBy([]).build();

    // Act
    const plan = planRecover(snapshot, aConfig(), NOW, { to: "r1" });

    // Assess
    expect(plan.kind).toBe("refused");
    expect(plan.reason).toMatch(
      /r1 is not in p1's replica set, and p1's agent is not heard .* two writable primaries/,
    );
  });

  it("recovers on a member of the old primary's replica set, keeping the old primary in the lineage", () => {
    // Prepare
    const snapshot = anOfflineShardWithAnUnheardOldPrimary().guardedBy(["r1"]).build();

    // Act
    const plan = planRecover(snapshot, aConfig(), NOW, { to: "r1" });

    // Assess: the offline gates keep judging membership against p1 afterwards.
    expect(plan).toMatchObject({
      kind: "recover",
      epoch: 3,
      lineage: { node_id: "p1", repl_id: "lineage-r1", last_txn_id: 700 },
    });
    const after = anOfflineShardWithAnUnheardOldPrimary()
      .guardedBy(["r1"])
      .withTopology({ epoch: 4, lineage: plan.kind === "recover" ? plan.lineage : undefined })
      .build();
    expect(decide(after, aConfig(), NOW)).toMatchObject({ kind: "bring_online", target: { node_id: "r1" } });
  });

  it("recovers on any node once the old primary's agent confirmed its database dead", () => {
    // Prepare
    const snapshot = anOfflineShardWithAnUnheardOldPrimary()
      .guardedBy([])
      .withNode({
        node_id: "p1",
        db_status: "down",
        db_crash: {
          state: "refused",
          run_id: "old",
          first_seen: (NOW - 9_000) * 1000,
          last_seen: (NOW - 8_000) * 1000,
        },
      })
      .build();

    // Act
    const plan = planRecover(snapshot, aConfig(), NOW, { to: "r1" });

    // Assess
    expect(plan).toMatchObject({ kind: "recover", lineage: { repl_id: "lineage-r1" } });
  });

  it("recovers on any node while the old primary's agent is heard (it fences its database on the offline topology)", () => {
    // Prepare
    const snapshot = anOfflineShardWithAnUnheardOldPrimary()
      .guardedBy([])
      .withNode({ node_id: "p1", agent_updated: (NOW - 200) * 1000 })
      .build();

    // Act
    const plan = planRecover(snapshot, aConfig(), NOW, { to: "r1" });

    // Assess
    expect(plan.kind).toBe("recover");
  });

  it("refuses a shard that is not offline, and a node that is not alive", () => {
    // Prepare
    const online = aShard().build();
    const offline = anOfflineShardWithAnUnheardOldPrimary().guardedBy(["r2"]).build();

    // Act
    const onOnline = planRecover(online, aConfig(), NOW, { to: "r1" });
    const onStale = planRecover(offline, aConfig(), NOW, { to: "r2" });

    // Assess
    expect(onOnline).toEqual({
      kind: "refused",
      reason: "the shard is online; only an offline shard is recovered (use switchover)",
    });
    expect(onStale.kind).toBe("refused");
    expect(onStale.reason).toMatch(/r2 is not alive/);
  });

  it("refuses a drained node (it ranks as priority 0: the shard would stay offline after the recover; nemesis seed 5102)", () => {
    // Prepare: r1, a member, drained.
    const snapshot = anOfflineShardWithAnUnheardOldPrimary()
      .guardedBy(["r1"])
      .withTopology({ epoch: 3, drained: ["r1"] })
      .build();

    // Act
    const plan = planRecover(snapshot, aConfig(), NOW, { to: "r1" });

    // Assess
    expect(plan).toEqual({
      kind: "refused",
      reason:
        "r1 is drained (never promoted until undrained): run `shardguard undrain --shard s1 --node r1` first",
    });
  });
});
