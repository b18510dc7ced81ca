import { describe, expect, it } from "vitest";
import { endpointOf, PrimaryResolver } from "../../src/client/primary-resolver.ts";
import type { Topology } from "../../src/core/model.ts";

function topology(epoch: number, primary: string, status: Topology["status"] = "online"): Topology {
  return {
    shard: "s1",
    epoch,
    primary_node_id: primary,
    primary_address: `10.0.0.${epoch}:6379`,
    status,
    updated_at: 0,
  };
}

/** A topology store that answers with a scripted sequence of reads. */
function scripted(...reads: Array<Topology | undefined>) {
  let index = 0;
  return {
    reads: () => index,
    read: async () => reads[Math.min(index++, reads.length - 1)],
  };
}

describe("PrimaryResolver", () => {
  it("never goes back to an older epoch once a newer one was seen", async () => {
    // Prepare
    const store = scripted(topology(2, "b"), topology(1, "a"));
    const resolver = new PrimaryResolver(store, { cacheMs: 0 });

    // Act
    const first = await resolver.resolve("s1");
    const second = await resolver.resolve("s1");

    // Assess
    expect(first?.nodeId).toBe("b");
    expect(second).toEqual(first);
    expect(resolver.epochOf("s1")).toBe(2);
  });

  it("moves forward to a newer epoch", async () => {
    const resolver = new PrimaryResolver(scripted(topology(1, "a"), topology(3, "c")), { cacheMs: 0 });
    await resolver.resolve("s1");
    expect((await resolver.resolve("s1"))?.address).toBe("10.0.0.3:6379");
  });

  it("returns no primary while the shard fails over or is offline", async () => {
    const resolver = new PrimaryResolver(
      scripted(topology(4, "d", "failing_over"), topology(4, "d", "offline")),
      {
        cacheMs: 0,
      },
    );
    expect(await resolver.resolve("s1")).toBeUndefined();
    expect(await resolver.resolve("s1")).toBeUndefined();
  });

  it("serves from cache within cacheMs and reads again after it", async () => {
    let now = 0;
    const store = scripted(topology(1, "a"), topology(2, "b"));
    const resolver = new PrimaryResolver(store, { cacheMs: 1000, now: () => now });
    await resolver.resolve("s1");
    now = 500;
    expect((await resolver.resolve("s1"))?.nodeId).toBe("a");
    now = 1500;
    expect((await resolver.resolve("s1"))?.nodeId).toBe("b");
    expect(store.reads()).toBe(2);
  });
});

describe("endpointOf a topology failing over", () => {
  const failingOver = (phase: Topology["phase"]): Topology => ({
    ...topology(5, "a"),
    status: "failing_over",
    phase,
    failover: {
      kind: "switchover",
      old_primary_node_id: "a",
      new_primary_node_id: "b",
      new_primary_address: "10.0.0.9:6379",
      reason: "test",
      started_at: 0,
      candidates: [],
      phase_started: {},
    },
  });

  it.each([
    { phase: "epoch_bumped", expected: undefined },
    { phase: "catch_up", expected: undefined },
    { phase: "promote", expected: undefined },
    { phase: "confirm", expected: undefined },
    { phase: "repoint", expected: { shard: "s1", epoch: 5, nodeId: "b", address: "10.0.0.9:6379" } },
    { phase: "cleanup", expected: { shard: "s1", epoch: 5, nodeId: "b", address: "10.0.0.9:6379" } },
  ] as const)("names the target only once it is confirmed: $phase", ({ phase, expected }) => {
    expect(endpointOf(failingOver(phase))).toEqual(expected);
  });
});
