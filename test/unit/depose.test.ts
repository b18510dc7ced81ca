import { describe, expect, it } from "vitest";
import { type DeposeInput, deposedAddresses } from "../../src/core/depose.ts";
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
