import { describe, expect, it } from "vitest";
import { assessTopology, type LocalView, staysParked, topologyPrimary } from "../../src/agent/fencing.ts";
import type { Topology } from "../../src/core/model.ts";

function aTopology(overrides: Partial<Topology> = {}): Topology {
  return {
    shard: "s1",
    epoch: 3,
    primary_node_id: "n2",
    primary_address: "10.0.0.2:6379",
    status: "online",
    updated_at: 1,
    ...overrides,
  };
}

function aFailoverTo(target: string, phase: Topology["phase"]): Topology {
  return aTopology({
    epoch: 4,
    status: "failing_over",
    phase,
    failover: {
      kind: "failover",
      old_primary_node_id: "n2",
      new_primary_node_id: target,
      new_primary_address: `10.0.0.${target.slice(1)}:6379`,
      reason: "primary stale",
      started_at: 1,
      candidates: [],
      phase_started: {},
    },
  });
}

const primaryView = (overrides: Partial<LocalView> = {}): LocalView => ({
  nodeId: "n1",
  role: "primary",
  replicatingFrom: undefined,
  highestEpoch: 2,
  promotedEpoch: 2,
  ...overrides,
});

const replicaView = (overrides: Partial<LocalView> = {}): LocalView => ({
  nodeId: "n3",
  role: "replica",
  replicatingFrom: "10.0.0.1:6379",
  highestEpoch: 2,
  promotedEpoch: undefined,
  ...overrides,
});

describe("the primary a topology stands for", () => {
  it("is the committed primary while a failover may still abort", () => {
    expect(topologyPrimary(aFailoverTo("n5", "epoch_bumped"))?.node_id).toBe("n2");
  });

  it("is the failover's target once PROMOTE may have been sent", () => {
    expect(topologyPrimary(aFailoverTo("n5", "promote"))).toEqual({
      node_id: "n5",
      address: "10.0.0.5:6379",
    });
    expect(topologyPrimary(aFailoverTo("n5", "repoint"))?.node_id).toBe("n5");
  });
});

describe("fencing by the topology", () => {
  it("steps a returning old primary down to the primary of a newer epoch", () => {
    // Act
    const verdict = assessTopology(aTopology(), primaryView());

    // Assess
    expect(verdict).toMatchObject({
      kind: "demote",
      target: { node_id: "n2", address: "10.0.0.2:6379" },
      epoch: 3,
    });
  });

  it("steps down a second primary of a new shard that the topology did not adopt", () => {
    // Act
    const verdict = assessTopology(
      aTopology({ epoch: 0 }),
      primaryView({ highestEpoch: 0, promotedEpoch: undefined }),
    );

    // Assess
    expect(verdict.kind).toBe("demote");
  });

  it("keeps a primary promoted at the topology's epoch before the controller names it", () => {
    // Act
    const verdict = assessTopology(
      aTopology({ epoch: 3 }),
      primaryView({ highestEpoch: 3, promotedEpoch: 3 }),
    );

    // Assess
    expect(verdict).toMatchObject({ kind: "keep", primaryConfirmed: true });
  });

  it("ignores a topology older than the node's own epoch", () => {
    expect(assessTopology(aTopology({ epoch: 1 }), primaryView()).kind).toBe("keep");
  });

  it("confirms a primary that the topology names", () => {
    expect(assessTopology(aTopology({ primary_node_id: "n1" }), primaryView())).toMatchObject({
      kind: "keep",
      primaryConfirmed: true,
    });
  });

  it("does not confirm the old primary while a failover away from it is under way", () => {
    // Prepare
    const topology = { ...aFailoverTo("n5", "epoch_bumped"), primary_node_id: "n1" };

    // Act
    const verdict = assessTopology(topology, primaryView({ highestEpoch: 3 }));

    // Assess
    expect(verdict).toMatchObject({ kind: "keep", primaryConfirmed: false });
  });

  it("demotes the old primary once the failover passed its point of no return", () => {
    expect(assessTopology(aFailoverTo("n5", "promote"), primaryView({ nodeId: "n2" })).kind).toBe("demote");
  });

  it("does not confirm the failover's target whose database is a primary before its PROMOTE ran (seed 221485)", () => {
    // Prepare: n1, the target past the point of no return, still at epoch 2; its database answers
    // as a primary (a replica restarted from its RDB without replicaof in its config).
    const topology = aFailoverTo("n1", "promote");

    // Act
    const before = assessTopology(topology, primaryView({ highestEpoch: 2, promotedEpoch: undefined }));
    const after = assessTopology(topology, primaryView({ highestEpoch: 4, promotedEpoch: 4 }));

    // Assess
    expect(before).toMatchObject({ kind: "keep", primaryConfirmed: false });
    expect(after).toMatchObject({ kind: "keep", primaryConfirmed: true });
  });

  it("does not confirm a primary while the topology names none (shard offline), so its write fence stays", () => {
    // Prepare
    const offline = aTopology({ status: "offline", primary_node_id: undefined, primary_address: undefined });

    // Act
    const verdict = assessTopology(offline, primaryView({ highestEpoch: 3 }));

    // Assess
    expect(verdict).toMatchObject({ kind: "keep", primaryConfirmed: false });
  });

  it("lets a primary with no topology yet serve: the controller adopts it", () => {
    expect(assessTopology(undefined, primaryView())).toMatchObject({ kind: "keep", primaryConfirmed: true });
  });

  it("repoints a replica to the primary of a newer epoch once", () => {
    // Act
    const behind = assessTopology(aTopology(), replicaView());
    const caughtUp = assessTopology(
      aTopology(),
      replicaView({ highestEpoch: 3, replicatingFrom: "10.0.0.2:6379" }),
    );

    // Assess
    expect(behind).toMatchObject({ kind: "repoint", target: { node_id: "n2" }, epoch: 3 });
    expect(caughtUp.kind).toBe("keep");
  });

  // Sim seed 3622: n3's database restarted from its config file's `replicaof n1` at epoch 1, when
  // n1 was a replica of n2; n3 stayed chained behind n1 to the end (the old rule repointed only at
  // a newer epoch).
  it.each<{ case: string; topology: Topology; view: Partial<LocalView>; expected: string }>([
    {
      case: "a replica that follows a replica, the topology online at its epoch: repointed",
      topology: aTopology(),
      view: { highestEpoch: 3, replicatingFrom: "10.0.0.1:6379", followsShardNode: true },
      expected: "repoint",
    },
    {
      case: "a replica that follows an address no node reports (a proxy, a hostname): kept",
      topology: aTopology(),
      view: { highestEpoch: 3, replicatingFrom: "10.0.0.9:7000", followsShardNode: false },
      expected: "keep",
    },
    {
      case: "a replica that follows nobody at its epoch: repointed",
      topology: aTopology(),
      view: { highestEpoch: 3, replicatingFrom: undefined },
      expected: "repoint",
    },
    {
      case: "parked from another node than the primary: repointed",
      topology: aTopology(),
      view: { highestEpoch: 3, replicatingFrom: "127.0.0.1:1", parked: { from: "10.0.0.1:6379" } },
      expected: "repoint",
    },
    {
      case: "parked before this agent started (from whom unknown): kept until a newer epoch",
      topology: aTopology(),
      view: { highestEpoch: 3, replicatingFrom: "127.0.0.1:1", parked: { from: undefined } },
      expected: "keep",
    },
    {
      case: "a failover of its epoch not past PROMOTE (it may still change the primary): kept",
      topology: aFailoverTo("n5", "catch_up"),
      view: { highestEpoch: 4, replicatingFrom: "10.0.0.5:6379" },
      expected: "keep",
    },
    {
      case: "the shard paused at its epoch: kept",
      topology: aTopology({ status: "paused" }),
      view: { highestEpoch: 3, replicatingFrom: "10.0.0.1:6379" },
      expected: "keep",
    },
  ])("at the replica's own epoch: $case", ({ topology, view, expected }) => {
    // Act
    const verdict = assessTopology(topology, replicaView(view));

    // Assess
    expect(verdict.kind).toBe(expected);
    if (expected === "repoint") expect(verdict).toMatchObject({ target: { node_id: "n2" }, epoch: 3 });
  });

  it("leaves a replica that already follows the topology's primary alone", () => {
    expect(assessTopology(aTopology(), replicaView({ replicatingFrom: "10.0.0.2:6379" })).kind).toBe("keep");
  });

  it("leaves replicas of a paused shard alone", () => {
    expect(assessTopology(aTopology({ status: "paused" }), replicaView()).kind).toBe("keep");
  });
});

describe("a parked replica and a topology naming the address it was parked from", () => {
  const repoint = (epoch: number) =>
    ({
      kind: "repoint",
      target: { node_id: "n1", address: "10.0.0.1:6379" },
      epoch,
      reason: "test",
    }) as const;
  const parked = { from: "10.0.0.1:6379", atEpoch: 3, lacksData: false, status: "online" };

  it.each([
    { case: "the epoch it parked at: waits", verdict: repoint(3), view: parked, stays: true },
    {
      case: "a newer committed epoch (a new decision): follows",
      verdict: repoint(4),
      view: parked,
      stays: false,
    },
    {
      case: "a newer epoch while a failover is under way: waits",
      verdict: repoint(4),
      view: { ...parked, status: "failing_over" },
      stays: true,
    },
    {
      case: "a newer committed epoch, the probe finding the process there lacking its data (simulator seed 150370): waits",
      verdict: repoint(4),
      view: { ...parked, lacksData: true },
      stays: true,
    },
    {
      case: "another address: follows",
      verdict: { ...repoint(4), target: { node_id: "n2", address: "10.0.0.2:6379" } },
      view: { ...parked, lacksData: true },
      stays: false,
    },
    {
      case: "a step-down (its database restarted from its RDB as a master) at the epoch it parked at: waits (simulator seed 7053)",
      verdict: { ...repoint(3), kind: "demote" as const },
      view: parked,
      stays: true,
    },
    {
      case: "a step-down at a newer committed epoch (a new decision): follows",
      verdict: { ...repoint(4), kind: "demote" as const },
      view: parked,
      stays: false,
    },
  ])("$case", ({ verdict, view, stays }) => {
    expect(staysParked(verdict, view)).toBe(stays);
  });
});
