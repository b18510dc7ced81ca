import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  type Decision,
  decide,
  describeHeartbeatAge,
  isAgentHeard,
  isFresh,
  isRecent,
  MAX_CLOCK_SKEW_MS,
} from "../../src/core/decide.ts";
import { aConfig, aHealthyShard, aHeartbeat, aShardWithStalePrimary, NOW } from "../support/builders.ts";

/**
 * Freshness with the clock bound: a heartbeat dated within MAX_CLOCK_SKEW_MS ahead of the
 * controller's clock counts by its age as before; one dated further ahead is no evidence of
 * liveness, so no heartbeat counts as fresh for longer than failureTimeout + the bound.
 */

const FAILURE_TIMEOUT = 3000;
const config = aConfig({ failureTimeoutMs: FAILURE_TIMEOUT });
const B = MAX_CLOCK_SKEW_MS;

describe("isFresh and isAgentHeard: table", () => {
  it.each([
    { name: "exactly failureTimeout old", ageMs: FAILURE_TIMEOUT, fresh: true },
    { name: "one ms past failureTimeout", ageMs: FAILURE_TIMEOUT + 1, fresh: false },
    { name: "written now", ageMs: 0, fresh: true },
    { name: "a few ms ahead (clocks within the bound)", ageMs: -5, fresh: true },
    { name: "exactly the clock bound ahead", ageMs: -B, fresh: true },
    { name: "one ms beyond the clock bound ahead", ageMs: -B - 1, fresh: false },
    { name: "a year ahead", ageMs: -365 * 86_400_000, fresh: false },
  ])("a heartbeat $name: fresh $fresh", ({ ageMs, fresh }) => {
    // Prepare
    const heartbeat = aHeartbeat({ node_id: "r1", ageMs, agent_updated: (NOW - ageMs) * 1000 });
    // Act + Assess
    expect(isFresh(heartbeat, config, NOW)).toBe(fresh);
    expect(isAgentHeard(heartbeat, config, NOW)).toBe(fresh);
  });

  it("judges agent_updated on its own: a live agent with a far-future write time is not heard", () => {
    const heartbeat = aHeartbeat({ node_id: "r1", ageMs: 100, agent_updated: (NOW + B + 1) * 1000 });
    expect(isFresh(heartbeat, config, NOW)).toBe(true);
    expect(isAgentHeard(heartbeat, config, NOW)).toBe(false);
  });

  it("says in reasons how far beyond the bound a heartbeat is dated", () => {
    expect(describeHeartbeatAge(aHeartbeat({ node_id: "r1", ageMs: -60_000 }), NOW)).toBe(
      `dated 60000 ms in the future, beyond the ${B} ms clock bound`,
    );
    expect(describeHeartbeatAge(aHeartbeat({ node_id: "r1", ageMs: -5 }), NOW)).toBe("0 ms old");
    expect(describeHeartbeatAge(aHeartbeat({ node_id: "r1", ageMs: 4000 }), NOW, "ago")).toBe("4000 ms ago");
  });
});

/** Summary of a decision for table rows. */
function outcome(decision: Decision): Record<string, unknown> {
  if (decision.kind === "none")
    return { kind: "none", code: decision.code, primaryStale: decision.primaryStale };
  if (decision.kind === "failover") return { kind: "failover", target: decision.target.node_id };
  return { kind: decision.kind };
}

describe("decide with heartbeats from the future", () => {
  it.each([
    {
      name: "keeps a primary dated exactly the clock bound ahead healthy",
      snapshot: () => aHealthyShard().withNode({ node_id: "p1", ageMs: -B }).build(),
      quorum: "majority" as const,
      expected: { kind: "none", code: "healthy", primaryStale: false },
    },
    {
      name: "fails over a primary dated beyond the clock bound (quorum none)",
      snapshot: () =>
        aHealthyShard()
          .withNode({ node_id: "p1", ageMs: -B - 1 })
          .build(),
      quorum: "none" as const,
      expected: { kind: "failover", target: "r1" },
    },
    {
      name: "calls a primary dated beyond the bound stale, but its replicas' votes still decide (links up)",
      snapshot: () => aHealthyShard().withNode({ node_id: "p1", ageMs: -600_000 }).build(),
      quorum: "majority" as const,
      expected: { kind: "none", code: "quorum_not_met", primaryStale: true },
    },
    {
      name: "does not promote a candidate dated beyond the bound, nor count its vote",
      snapshot: () =>
        aShardWithStalePrimary()
          .withNode({ node_id: "r1", ageMs: -600_000, last_txn_id: 5000, primary_link: "up" })
          .build(),
      quorum: "majority" as const,
      expected: { kind: "failover", target: "r2" },
    },
  ])("$name", ({ snapshot, quorum, expected }) => {
    // Prepare
    const shard = snapshot();
    // Act
    const decision = decide(shard, aConfig({ quorum }), NOW);
    // Assess
    expect(outcome(decision)).toMatchObject(expected);
  });

  it("names the future-dated candidate's reason", () => {
    const shard = aShardWithStalePrimary().withNode({ node_id: "r1", ageMs: -600_000 }).build();
    const decision = decide(shard, aConfig({ quorum: "none" }), NOW);
    expect(decision.kind).toBe("failover");
    const r1 = decision.kind === "failover" ? decision.candidates.find((c) => c.node_id === "r1") : undefined;
    expect(r1).toMatchObject({ eligible: false, reason: expect.stringContaining("in the future, beyond") });
  });
});

describe("freshness properties", () => {
  // Timestamps anywhere from a day before to a day after NOW, controller times around them.
  const timestampArb = fc
    .integer({ min: -86_400_000, max: 86_400_000 })
    .map((offset) => (NOW + offset) * 1000);
  const failureArb = fc.integer({ min: 200, max: 60_000 });
  const nowArb = fc.integer({ min: -2 * 86_400_000, max: 2 * 86_400_000 }).map((offset) => NOW + offset);
  // Controller times near a timestamp (ms offsets), where freshness changes, and some far away.
  const nearArb = fc.oneof(
    fc.integer({ min: -B - 2000, max: FAILURE_TIMEOUT + 2000 }),
    fc.integer({ min: -86_400_000, max: 86_400_000 }),
  );

  it("a timestamp counts only within [t - bound, t + failureTimeout] of controller time", () => {
    fc.assert(
      fc.property(timestampArb, failureArb, nowArb, (t, failureTimeoutMs, now) => {
        if (isRecent(t, aConfig({ failureTimeoutMs, heartbeatIntervalMs: 100, fenceTimeoutMs: 100 }), now)) {
          expect(now).toBeGreaterThanOrEqual(t / 1000 - B);
          expect(now).toBeLessThanOrEqual(t / 1000 + failureTimeoutMs);
        }
      }),
    );
  });

  it("a heartbeat fresh when the controller sees it is stale from failureTimeout + bound later on, forever", () => {
    fc.assert(
      fc.property(
        timestampArb,
        fc.integer({ min: -B, max: FAILURE_TIMEOUT }),
        fc.integer({ min: 1, max: 86_400_000 }),
        (t, seenAtAge, after) => {
          const heartbeat = aHeartbeat({ node_id: "r1", last_updated: t, agent_updated: t });
          // Any controller time at which the heartbeat is fresh can be the first one.
          const seenAt = t / 1000 + seenAtAge;
          expect(isFresh(heartbeat, config, seenAt)).toBe(true);
          const later = seenAt + FAILURE_TIMEOUT + B + after;
          expect(isFresh(heartbeat, config, later)).toBe(false);
          expect(isAgentHeard(heartbeat, config, later)).toBe(false);
        },
      ),
    );
  });

  it("once fresh, freshness is monotone non-increasing in now (fresh times form one interval)", () => {
    fc.assert(
      fc.property(timestampArb, fc.array(nearArb, { minLength: 3, maxLength: 3 }), (t, offsets) => {
        const [a, b, c] = offsets.map((offset) => t / 1000 + offset).sort((x, y) => x - y) as [
          number,
          number,
          number,
        ];
        const heartbeat = aHeartbeat({ node_id: "r1", last_updated: t });
        if (isFresh(heartbeat, config, a) && !isFresh(heartbeat, config, b)) {
          expect(isFresh(heartbeat, config, c)).toBe(false);
        }
        if (isFresh(heartbeat, config, a) && isFresh(heartbeat, config, c)) {
          expect(isFresh(heartbeat, config, b)).toBe(true);
        }
      }),
    );
  });

  it("a heartbeat from a clock within the bound is judged by its age alone (the bound never fakes staleness)", () => {
    fc.assert(
      fc.property(fc.integer({ min: -B, max: FAILURE_TIMEOUT }), nowArb, (ageMs, now) => {
        const heartbeat = aHeartbeat({ node_id: "r1", last_updated: (now - ageMs) * 1000 });
        expect(isFresh(heartbeat, config, now)).toBe(true);
      }),
    );
  });
});
