import { describe, expect, it } from "vitest";
import {
  type DeposeInput,
  deposedAddresses,
  deposedAfter,
  deposedWhenOffline,
  MAX_DEPOSED,
} from "../../src/core/depose.ts";
import type { Heartbeat, Topology } from "../../src/core/model.ts";
import { aHeartbeat } from "../support/builders.ts";

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
      name: "the primary an online topology names, deposed at the offline epoch",
      topology: online(),
      expected: [{ node_id: "n1", address: "10.0.0.1:6379", epoch: 8 }],
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
          { node_id: "n1", address: "10.0.0.1:6379", epoch: 5 },
        ],
      }),
      expected: [
        { node_id: "n1", address: "10.0.0.1:6379", epoch: 5 },
        { node_id: "n2", address: "10.0.0.2:6380", epoch: 8 },
      ],
    },
    {
      name: "a failover's target past its PROMOTE, beside the old primary",
      topology: failingOverTo("n3", "confirm"),
      expected: [
        { node_id: "n1", address: "10.0.0.1:6379", epoch: 8 },
        { node_id: "n3", address: "10.0.0.3:6379", epoch: 8 },
      ],
    },
    {
      name: "not a target whose PROMOTE was not sent yet",
      topology: failingOverTo("n3", "catch_up"),
      expected: [{ node_id: "n1", address: "10.0.0.1:6379", epoch: 8 }],
    },
  ])("keeps $name", ({ topology, expected }) => {
    // Act
    const deposed = deposedWhenOffline(topology, 8);
    // Assess
    expect(deposed).toEqual(expected);
  });

  it("keeps at most 16, the latest", () => {
    // Prepare
    const kept = Array.from({ length: 16 }, (_, i) => ({ node_id: `k${i}`, address: `10.0.1.${i}:6379` }));
    // Act
    const deposed = deposedWhenOffline(online({ deposed: kept }), 8);
    // Assess
    expect(deposed).toHaveLength(MAX_DEPOSED);
    expect(deposed?.[0]?.node_id).toBe("k1");
    expect(deposed?.at(-1)).toEqual({ node_id: "n1", address: "10.0.0.1:6379", epoch: 8 });
  });
});

/** n's report: a replica of n2 at `epoch`, its database answering at 10.0.0.<n>:6379. */
const report = (node: string, extra: Partial<Heartbeat> = {}): Heartbeat => ({
  ...aHeartbeat({ node_id: node, node_address: `10.0.0.${node.slice(1)}:6379`, primary_node_id: "n2" }),
  epoch: 8,
  ...extra,
});

const n2 = { node_id: "n2", address: "10.0.0.2:6379" };
const n3 = { node_id: "n3", address: "10.0.0.3:6379" };

describe("deposedAfter: the old primaries a topology keeps through changes of primary (nemesis seed 6811)", () => {
  it.each([
    {
      name: "adds the replaced primary when a failover completes (n1 -> n2 at 8)",
      input: { topology: failingOverTo("n2", "cleanup"), epoch: 8, primary: n2, replacesNamed: true },
      expected: [{ node_id: "n1", address: "10.0.0.1:6379", epoch: 8 }],
    },
    {
      name: "keeps an older one through the next change, online (n0, never fenced: n1 -> n2)",
      input: {
        topology: {
          ...failingOverTo("n2", "cleanup"),
          deposed: [{ node_id: "n0", address: "10.0.0.10:6379", epoch: 7 }],
        },
        epoch: 8,
        primary: n2,
        replacesNamed: true,
      },
      expected: [
        { node_id: "n0", address: "10.0.0.10:6379", epoch: 7 },
        { node_id: "n1", address: "10.0.0.1:6379", epoch: 8 },
      ],
    },
    {
      name: "a plan keeps the list and adds nothing for the primary it replaces (named anyway)",
      input: {
        topology: online({ deposed: [{ node_id: "n0", address: "10.0.0.10:6379", epoch: 7 }] }),
        epoch: 8,
        primary: n2,
        replacesNamed: false,
      },
      expected: [{ node_id: "n0", address: "10.0.0.10:6379", epoch: 7 }],
    },
    {
      name: "a replan adds the earlier target past its PROMOTE",
      input: { topology: failingOverTo("n3", "confirm"), epoch: 9, primary: n2, replacesNamed: false },
      expected: [{ node_id: "n3", address: "10.0.0.3:6379", epoch: 9 }],
    },
    {
      name: "drops the new primary (a node promoted again)",
      input: {
        topology: failingOverTo("n2", "cleanup"),
        epoch: 8,
        primary: n2,
        replacesNamed: true,
      },
      expected: [{ node_id: "n1", address: "10.0.0.1:6379", epoch: 8 }],
      kept: [{ node_id: "n2", address: "10.0.0.2:6379", epoch: 5 }],
    },
    {
      name: "drops another node at the new primary's address",
      input: { topology: failingOverTo("n2", "cleanup"), epoch: 8, primary: n2, replacesNamed: true },
      expected: [{ node_id: "n1", address: "10.0.0.1:6379", epoch: 8 }],
      kept: [{ node_id: "n2old", address: "10.0.0.2:6379", epoch: 5 }],
    },
    {
      name: "drops one whose agent reports it a replica at the epoch that deposed it",
      input: {
        topology: online(),
        epoch: 9,
        primary: n3,
        replacesNamed: false,
        reports: [report("n0", { epoch: 7 })],
      },
      expected: undefined,
      kept: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
    },
    {
      name: "keeps one whose last report is older than the epoch that deposed it (its agent dead: seed 6811)",
      input: {
        topology: online(),
        epoch: 9,
        primary: n3,
        replacesNamed: false,
        reports: [report("n0", { role: "primary", epoch: 6, primary_node_id: undefined })],
      },
      expected: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
      kept: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
    },
    {
      name: "keeps one whose agent reports it primary, even at a newer epoch",
      input: {
        topology: online(),
        epoch: 9,
        primary: n3,
        replacesNamed: false,
        reports: [report("n0", { role: "primary", primary_node_id: undefined })],
      },
      expected: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
      kept: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
    },
    {
      name: "keeps one whose database does not answer",
      input: {
        topology: online(),
        epoch: 9,
        primary: n3,
        replacesNamed: false,
        reports: [report("n0", { db_status: "down" })],
      },
      expected: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
      kept: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
    },
    {
      name: "keeps one whose report is from another address",
      input: {
        topology: online(),
        epoch: 9,
        primary: n3,
        replacesNamed: false,
        reports: [report("n0", { node_address: "10.0.9.9:6379" })],
      },
      expected: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
      kept: [{ node_id: "n0", address: "10.0.0.0:6379", epoch: 7 }],
    },
    {
      name: "an entry without an epoch (an older controller's) needs a report at the topology's epoch",
      input: {
        topology: online(),
        epoch: 9,
        primary: n3,
        replacesNamed: false,
        reports: [report("n0", { epoch: 6 })],
      },
      expected: [{ node_id: "n0", address: "10.0.0.0:6379" }],
      kept: [{ node_id: "n0", address: "10.0.0.0:6379" }],
    },
  ])("$name", ({ input, expected, kept }) => {
    // Prepare
    const topology = kept === undefined ? input.topology : { ...input.topology, deposed: kept };
    // Act
    const deposed = deposedAfter({ ...input, topology });
    // Assess
    expect(deposed).toEqual(expected);
  });

  it("an online chain n1 -> n2 -> n3 with n1 never fenced: n3 fences n1 (nemesis seed 6811)", () => {
    // Prepare: n1 -> n2 completes at 8 (n1's last report: primary at 7, its agent dead); the
    // online topology at 8 then plans n2 -> n3 at 9.
    const dead = report("n1", { role: "primary", epoch: 7, primary_node_id: undefined });
    const atEight: Topology = {
      ...online({ epoch: 8, primary_node_id: "n2", primary_address: "10.0.0.2:6379" }),
      deposed: deposedAfter({
        topology: failingOverTo("n2", "cleanup"),
        epoch: 8,
        primary: n2,
        replacesNamed: true,
        reports: [dead],
      }),
    };
    const plan: Topology = {
      ...atEight,
      epoch: 9,
      status: "failing_over",
      phase: "promote",
      deposed: deposedAfter({
        topology: atEight,
        epoch: 9,
        primary: n3,
        replacesNamed: false,
        reports: [dead],
      }),
    };
    // Act
    const fenced = deposedAddresses({ ...base, topology: plan, followed: "10.0.0.2:6379" });
    // Assess
    expect(fenced).toEqual(["10.0.0.2:6379", "10.0.0.1:6379"]);
  });
});
