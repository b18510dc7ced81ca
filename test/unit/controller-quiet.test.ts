import { describe, expect, it } from "vitest";
import type { CycleOutcome, CycleResult } from "../../src/controller/deps.ts";
import { isQuiet } from "../../src/controller/loop.ts";
import type { Decision, NoActionCode } from "../../src/core/decide.ts";

const none = (code: NoActionCode, primaryStale = false): Decision => ({
  kind: "none",
  code,
  primaryStale,
  reason: code,
});

const result = (outcome: CycleOutcome, decision?: Decision): CycleResult => ({
  shard: "s1",
  outcome,
  decision,
  reason: "test",
});

describe("isQuiet: when a Lambda run may end", () => {
  it.each<[string, CycleResult, boolean]>([
    ["a healthy primary", result("no_action", none("healthy")), true],
    ["a paused shard", result("no_action", none("paused")), true],
    ["a cool-down with a fresh primary", result("no_action", none("cooldown")), true],
    ["a cool-down with a stale primary", result("no_action", none("cooldown", true)), false],
    ["a stale primary short of its quorum", result("no_action", none("quorum_not_met", true)), false],
    ["no agent heard", result("no_action", none("no_agent_heard", true)), false],
    ["agents coming back from a store outage", result("no_action", none("store_recovering", true)), false],
    ["an offline shard with no candidate", result("no_action", none("offline_no_candidate")), false],
    ["a lock held by another run", result("no_action", none("locked")), false],
    ["no topology yet", result("no_action", none("no_topology")), false],
    [
      "a failover completed",
      result("completed", {
        kind: "mark_offline",
        epoch: 1,
        oldPrimary: "p1",
        candidates: [],
        lineage: undefined,
        reason: "r",
      }),
      false,
    ],
    ["an operator request (no decision)", result("no_action"), false],
  ])("%s: %s", (_what, cycle, quiet) => {
    expect(isQuiet(cycle)).toBe(quiet);
  });
});
