import { describe, expect, it } from "vitest";
import { decide } from "../../src/core/decide.ts";
import { canDepose } from "../../src/core/depose.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { aConfig, aHeartbeat, aShard, NOW } from "../support/builders.ts";

/**
 * A deposing promotion (issue 30, nemesis seed 3501; guarantees 2 and 3): an offline shard whose
 * only eligible node is outside the old primary's replica set, while the old primary's agent is
 * unheard and reported no crash, was held (gate `unfenced_old_primary`) until that agent came
 * back: 130.5 s without a writable primary in seed 3501. When the node replicates from the old
 * primary with its link up and its probe reached it, it fences the old primary itself and catches
 * up with it before detaching, so it is brought online with `depose` instead.
 */

/** Offline; p1 (the old primary) unheard for 10 s, no crash report; its replica set empty; r1 follows it. */
function aShardWithOutsider(r1: Partial<HeartbeatInput>, members: readonly string[] = []) {
  return aShard()
    .offline()
    .withNode({ node_id: "p1", ageMs: 10_000 })
    .withNode({ node_id: "r1", last_txn_id: 1000, primary_probe: "ok", ...r1 })
    .guardedBy(members)
    .build();
}

describe("decide: a deposing promotion of a node outside the old primary's set", () => {
  it.each([
    { name: "its probe reached the old primary", r1: {}, depose: "p1" },
    {
      name: "its probe found the old primary refusing writes",
      r1: { primary_probe: "fenced" as const },
      depose: "p1",
    },
    {
      name: "it is a member of the set (no deposing needed)",
      r1: {},
      // r2 a member too: a heard replica outside the set with its link up would hold a member's
      // promotion (gate follower_unheard_offline, decide-follower.test.ts).
      members: ["r1", "r2"],
      depose: undefined,
    },
  ])("brings the shard online on r1 when $name", ({ r1, members, depose }) => {
    // Prepare
    const snapshot = aShardWithOutsider(r1, members);
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision.kind).toBe("bring_online");
    expect(decision.kind === "bring_online" ? decision.depose?.node_id : "none").toBe(depose);
    if (depose !== undefined)
      expect(decision.reason).toMatch(/deposing p1 first: r1 is outside its replica set/);
  });

  it.each([
    { name: "its probe could not reach the old primary", r1: { primary_probe: "unreachable" as const } },
    { name: "its link to the old primary is down", r1: { primary_link: "down" as const } },
    { name: "it reported no probe", r1: { primary_probe: undefined } },
    { name: "it follows another node", r1: { primary_node_id: "r2" } },
  ])("holds the shard offline when $name (gate unfenced_old_primary)", ({ r1 }) => {
    // Prepare
    const snapshot = aShardWithOutsider(r1);
    // Act
    const decision = decide(snapshot, aConfig(), NOW);
    // Assess
    expect(decision).toMatchObject({ kind: "none", code: "offline_no_candidate" });
    expect(decision.reason).toMatch(/r1 does not reach it to fence it itself/);
  });

  it("needs a fresh report with the database up", () => {
    // Prepare
    const old = aHeartbeat({ node_id: "p1", role: "primary", primary_node_id: undefined, ageMs: 10_000 });
    const able = { node_id: "r1", primary_probe: "ok" as const };
    // Assess
    expect(canDepose(aHeartbeat(able), old, aConfig(), NOW)).toBe(true);
    expect(canDepose(aHeartbeat({ ...able, ageMs: 5_000 }), old, aConfig(), NOW)).toBe(false);
    expect(canDepose(aHeartbeat({ ...able, db_status: "down" }), old, aConfig(), NOW)).toBe(false);
    expect(canDepose(aHeartbeat({ ...able, node_id: "p1" }), old, aConfig(), NOW)).toBe(false);
  });
});
