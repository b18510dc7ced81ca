import { describe, expect, it } from "vitest";
import { type DeposeInput, deposedAddresses, deposedWhenOffline } from "../../src/core/depose.ts";
import type { Topology } from "../../src/core/model.ts";

const failingOver = (primary: string | undefined, address: string | undefined): Topology => ({
  shard: "s",
  epoch: 7,
  status: "failing_over",
  phase: "promote",
  updated_at: 0,
  ...(primary === undefined ? {} : { primary_node_id: primary }),
  ...(address === undefined ? {} : { primary_address: address }),
});

const base: DeposeInput = {
  selfId: "n3",
  selfAddress: "10.0.0.3:6379",
  topology: failingOver("n2", "10.0.0.2:6379"),
  followed: "10.0.0.2:6379",
  ignore: ["127.0.0.1:1"],
};

describe("deposedAddresses: the databases a promoted node fences first", () => {
  it.each([
    { name: "the old primary it followed, once", input: {}, expected: ["10.0.0.2:6379"] },
    {
      name: "the topology's old primary and another node it followed",
      input: { followed: "10.0.0.1:6379" },
      expected: ["10.0.0.2:6379", "10.0.0.1:6379"],
    },
    {
      name: "the old primary while this node was parked",
      input: { followed: "127.0.0.1:1" },
      expected: ["10.0.0.2:6379"],
    },
    {
      name: "the old primary when this node was no replica",
      input: { followed: undefined },
      expected: ["10.0.0.2:6379"],
    },
    {
      name: "nothing named when the topology names this node",
      input: { topology: failingOver("n3", "10.0.0.3:6379"), followed: undefined },
      expected: [],
    },
    {
      name: "the node followed when the shard had no primary (offline)",
      input: { topology: failingOver(undefined, undefined), followed: "10.0.0.1:6379" },
      expected: ["10.0.0.1:6379"],
    },
    {
      name: "never its own address (a stale topology naming another id there)",
      input: { topology: failingOver("n2", "10.0.0.3:6379"), followed: undefined },
      expected: [],
    },
    {
      name: "the old primaries an offline shard kept, brought online on this node (nemesis seed 6303)",
      input: {
        topology: {
          ...failingOver(undefined, undefined),
          deposed: [
            { node_id: "n1", address: "10.0.0.1:6379" },
            { node_id: "n3", address: "10.0.0.3:6379" },
          ],
        },
        followed: undefined,
      },
      expected: ["10.0.0.1:6379"],
    },
    {
      name: "a kept old primary once, also when it is the node followed",
      input: {
        topology: {
          ...failingOver(undefined, undefined),
          deposed: [{ node_id: "n2", address: "10.0.0.2:6379" }],
        },
      },
      expected: ["10.0.0.2:6379"],
    },
    {
      name: "nothing without a topology or a primary followed",
      input: { topology: undefined, followed: undefined },
      expected: [],
    },
  ])("fences $name", ({ input, expected }) => {
    // Act
    const addresses = deposedAddresses({ ...base, ...input });
    // Assess
    expect(addresses).toEqual(expected);
  });
});

const online = (extra: Partial<Topology> = {}): Topology => ({
  shard: "s",
  epoch: 7,
  status: "online",
  primary_node_id: "n1",
  primary_address: "10.0.0.1:6379",
  updated_at: 0,
  ...extra,
});

/** p1's shard failing over to `target`, in `phase`. */
const failingOverTo = (target: string, phase: Topology["phase"]): Topology =>
  online({
    status: "failing_over",
    phase,
    failover: {
      kind: "failover",
      old_primary_node_id: "n1",
      new_primary_node_id: target,
      new_primary_address: `10.0.0.${target.slice(1)}:6379`,
      reason: "r",
      started_at: 0,
      candidates: [],
      phase_started: {},
    },
  });

describe("deposedWhenOffline: the old primaries an offline topology keeps", () => {
  it.each([
    { name: "nothing without a topology", topology: undefined, expected: undefined },
    {
      name: "the primary an online topology names",
      topology: online(),
      expected: [{ node_id: "n1", address: "10.0.0.1:6379" }],
    },
    {
      name: "nothing from an offline topology that kept none",
      topology: online({ status: "offline", primary_node_id: undefined, primary_address: undefined }),
      expected: undefined,
    },
    {
      name: "what an offline topology kept, across a re-marking",
      topology: online({
        status: "offline",
        primary_node_id: undefined,
        primary_address: undefined,
        deposed: [{ node_id: "n1", address: "10.0.0.1:6379" }],
      }),
      expected: [{ node_id: "n1", address: "10.0.0.1:6379" }],
    },
    {
      name: "the kept ones and the named primary, each node once with its latest address",
      topology: online({
        primary_node_id: "n2",
        primary_address: "10.0.0.2:6380",
        deposed: [
          { node_id: "n2", address: "10.0.0.2:6379" },
          { node_id: "n1", address: "10.0.0.1:6379" },
        ],
      }),
      expected: [
        { node_id: "n1", address: "10.0.0.1:6379" },
        { node_id: "n2", address: "10.0.0.2:6380" },
      ],
    },
    {
      name: "a failover's target past its PROMOTE, beside the old primary",
      topology: failingOverTo("n3", "confirm"),
      expected: [
        { node_id: "n1", address: "10.0.0.1:6379" },
        { node_id: "n3", address: "10.0.0.3:6379" },
      ],
    },
    {
      name: "not a target whose PROMOTE was not sent yet",
      topology: failingOverTo("n3", "catch_up"),
      expected: [{ node_id: "n1", address: "10.0.0.1:6379" }],
    },
  ])("keeps $name", ({ topology, expected }) => {
    // Act
    const deposed = deposedWhenOffline(topology);
    // Assess
    expect(deposed).toEqual(expected);
  });

  it("keeps at most 16, the latest", () => {
    // Prepare
    const kept = Array.from({ length: 16 }, (_, i) => ({ node_id: `k${i}`, address: `10.0.1.${i}:6379` }));
    // Act
    const deposed = deposedWhenOffline(online({ deposed: kept }));
    // Assess
    expect(deposed).toHaveLength(16);
    expect(deposed?.[0]?.node_id).toBe("k1");
    expect(deposed?.at(-1)).toEqual({ node_id: "n1", address: "10.0.0.1:6379" });
  });
});
