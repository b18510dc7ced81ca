import { describe, expect, it } from "vitest";
import { candidateHoldsRefusingPrimary } from "../../src/core/decide/gate.ts";
import { shardView } from "../../src/core/decide/view.ts";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { FENCED_MIN_REPLICAS, refusesWrites } from "../../src/core/write-guard.ts";
import { aConfig, aShardWithStalePrimary, NOW, outcome } from "../support/builders.ts";

/**
 * Issue 30, finding 7 (guarantees 1 and 3): the primary's agent is cut from the store and one of its
 * two members dies with its agent. The primary cannot shrink its set, so it answers `NOREPLICAS` (it
 * refuses every write); it is not fenced by its agent (1 of 2 witnesses is not a majority). The
 * surviving replica's probe used to say `ok` and the controller waited (`quorum_not_met`) for as
 * long as the partition lasted, though the survivor holds every write. Now the probe reports a
 * primary that refuses every write as `fenced` with the primary's offset (`primary_probe_offset`),
 * that is a vote, and a candidate holding that offset holds whatever the dead member acknowledged,
 * so `member_unheard` does not hold it.
 */

const KEEPALIVE = 20_000;
const config = aConfig();

/** r2: the dead member, its agent last heard well past its keepalive plus the failure timeout. */
function deadMember(): Partial<HeartbeatInput> & { node_id: string; ageMs: number } {
  const ageMs = KEEPALIVE + config.failureTimeoutMs + 5000;
  return {
    node_id: "r2",
    ageMs,
    agent_updated: (NOW - ageMs) * 1000,
    keepalive_ms: KEEPALIVE,
    last_txn_id: 980,
  };
}

function build(r1: Partial<HeartbeatInput>) {
  return aShardWithStalePrimary(8000)
    .guardedBy(["r1", "r2"])
    .withNode({ node_id: "r1", primary_link: "up", keepalive_ms: KEEPALIVE, last_txn_id: 1000, ...r1 })
    .withNode(deadMember());
}

describe("decide: a primary that refuses every write, a member dead (issue 30, finding 7)", () => {
  it.each([
    {
      name: "a probe that finds the primary answering writes is no vote: no failover",
      r1: { primary_probe: "ok", primary_probe_offset: 1000 },
      expected: { kind: "none", code: "quorum_not_met" },
    },
    {
      name: "the survivor's probe finds it refusing at the offset the survivor holds: failover to the survivor",
      r1: { primary_probe: "fenced", primary_probe_offset: 1000 },
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "the survivor holds less than the refusing primary's offset: the dead member may hold the rest",
      r1: { primary_probe: "fenced", primary_probe_offset: 1000, last_txn_id: 990 },
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "a report without the primary's offset (an older agent) proves nothing: held",
      r1: { primary_probe: "fenced" },
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "a survivor whose link is down cannot vouch for the primary's lineage: held",
      r1: { primary_probe: "fenced", primary_probe_offset: 1000, primary_link: "down" },
      expected: { kind: "none", code: "member_unheard" },
    },
    {
      name: "a survivor on another lineage than the primary's holds none of its writes: never promoted",
      r1: { primary_probe: "fenced", primary_probe_offset: 1000, repl_id: "f".repeat(40) },
      expected: { kind: "mark_offline", target: undefined },
    },
  ] as const)("$name", ({ r1, expected }) => {
    const snapshot = build(r1).build();
    expect(outcome(decide(snapshot, config, NOW))).toEqual(expected);
  });

  it("names the witness, the offset and what the candidate holds", () => {
    const snapshot = build({ primary_probe: "fenced", primary_probe_offset: 1000 }).build();
    expect(
      candidateHoldsRefusingPrimary(shardView(snapshot, config, NOW), "p1", {
        node_id: "r1",
        last_txn_id: 1000,
      }),
    ).toBe(
      "r1's probe found p1 refusing every write at offset 1000, and r1 holds 1000: no member of the set holds a write it lacks",
    );
  });
});

describe("refusesWrites: what a replica's probe reports as `fenced`", () => {
  it.each([
    { min: 0, good: undefined, refuses: false, why: "no guard" },
    { min: 2, good: 2, refuses: false, why: "as many good replicas as asked" },
    { min: 2, good: 3, refuses: false, why: "more good replicas than asked" },
    { min: 2, good: 1, refuses: true, why: "a member dead and the set not shrunk: NOREPLICAS" },
    { min: 1, good: 0, refuses: true, why: "the only member gone" },
    { min: 2, good: undefined, refuses: false, why: "a server that does not print the count: no evidence" },
    { min: FENCED_MIN_REPLICAS, good: 2, refuses: true, why: "its agent's fence" },
    { min: Number.NaN, good: 0, refuses: false, why: "an unreadable setting: no evidence" },
  ])("$why -> $refuses", ({ min, good, refuses }) => {
    expect(refusesWrites(min, good)).toBe(refuses);
  });
});
