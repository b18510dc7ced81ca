import { describe, expect, it } from "vitest";
import {
  AWS,
  addNodeCommands,
  awsAddress,
  type Command,
  createBridgeCommands,
  cutCommands,
  cutsOf,
  degradeCommands,
  type LabLayout,
  type LabNode,
  labNode,
  newLabId,
  observerAddress,
  type PartitionSpec,
  pickSubnet,
  reachableUrl,
  removeNodeCommands,
  voidAddress,
} from "../../src/dev/netlab/plan.ts";

const LAYOUT: LabLayout = { id: "ab12cd", subnet: { a: 171, b: 4 } };
const NODES = ["node-1", "node-2", "node-3"];

function labNodes(names: readonly string[] = NODES): Map<string, LabNode> {
  return new Map(names.map((name, index) => [name, labNode(LAYOUT, name, index + 1)]));
}

/** A `random` that returns `values` in turn, then repeats the last. */
function sequence(...values: number[]): () => number {
  let index = 0;
  return () => values[Math.min(index++, values.length - 1)] ?? 0;
}

function line(command: Command): string {
  return [command.tool, ...command.args].join(" ");
}

describe("lab names and addresses", () => {
  it("draws a six-character [a-z0-9] lab id", () => {
    // Act
    const ids = [newLabId(sequence(0)), newLabId(sequence(0.999)), newLabId(Math.random)];

    // Assess
    expect(ids[0]).toBe("aaaaaa");
    expect(ids[1]).toBe("999999");
    expect(ids[2]).toMatch(/^[a-z0-9]{6}$/);
  });

  it("picks a 10.a.b.0/24 with a in 160..223, skipping subnets already taken", () => {
    // Prepare
    const taken = new Set(["160.0"]);

    // Act
    const subnet = pickSubnet(sequence(0, 0, 0.999, 0.5), (s) => taken.has(`${s.a}.${s.b}`));

    // Assess
    expect(subnet).toEqual({ a: 223, b: 128 });
  });

  it("gives up with a clear error when every subnet it draws is taken", () => {
    // Act
    const pick = () => pickSubnet(Math.random, () => true);

    // Assess
    expect(pick).toThrow(/no free 10\.a\.b\.0\/24/);
  });

  it.each([
    [1, "sgnl-ab12cd-node-1", "sglab12cdh1", "10.171.4.11", "02:53:47:00:00:01"],
    [3, "sgnl-ab12cd-node-1", "sglab12cdh3", "10.171.4.13", "02:53:47:00:00:03"],
    [200, "sgnl-ab12cd-node-1", "sglab12cdh200", "10.171.4.210", "02:53:47:00:00:c8"],
  ])(
    "names node number %i's namespace, link, address and void MAC",
    (index, namespace, hostLink, address, mac) => {
      // Act
      const node = labNode(LAYOUT, "node-1", index);

      // Assess
      expect(node).toEqual({ name: "node-1", index, namespace, hostLink, address, voidMac: mac });
      expect(node.hostLink.length).toBeLessThanOrEqual(15);
    },
  );

  it.each([
    ["the AWS endpoint's name", { ...LAYOUT }, AWS, 1, /cannot name a lab node/],
    ["a name with a space", { ...LAYOUT }, "node 1", 1, /cannot name a lab node/],
    ["number 0", { ...LAYOUT }, "node-1", 0, /outside 1\.\.200/],
    ["number 201", { ...LAYOUT }, "node-1", 201, /outside 1\.\.200/],
    ["a lab id that is not six [a-z0-9]", { ...LAYOUT, id: "AB-12" }, "node-1", 1, /not six/],
  ])("refuses %s", (_, layout, name, index, message) => {
    // Act
    const make = () => labNode(layout, name, index);

    // Assess
    expect(make).toThrow(message);
  });

  it.each([
    ["http://127.0.0.1:8000", "http://10.171.4.2:8000"],
    ["http://localhost:4566/", "http://10.171.4.2:4566"],
    ["http://[::1]:9324/queue?x=1", "http://10.171.4.2:9324/queue?x=1"],
    ["https://dynamodb.eu-west-1.amazonaws.com", "https://dynamodb.eu-west-1.amazonaws.com"],
  ])("points %s at the host's AWS address for a node: %s", (url, expected) => {
    // Act
    const reachable = reachableUrl(url, awsAddress(LAYOUT.subnet));

    // Assess
    expect(reachable).toBe(expected);
  });

  it("puts the observer at .1, AWS at .2 and the void next hop at .254", () => {
    // Act
    const addresses = [observerAddress(LAYOUT.subnet), awsAddress(LAYOUT.subnet), voidAddress(LAYOUT.subnet)];

    // Assess
    expect(addresses).toEqual(["10.171.4.1", "10.171.4.2", "10.171.4.254"]);
  });
});

describe("building and removing a lab", () => {
  it("adds the observer address to the bridge before the AWS one, so the host's own connections come from it", () => {
    // Act
    const commands = createBridgeCommands(LAYOUT).map(line);

    // Assess
    expect(commands).toEqual([
      "ip link add sglab12cdb type bridge",
      "ip addr add 10.171.4.1/24 dev sglab12cdb",
      "ip addr add 10.171.4.2/24 dev sglab12cdb",
      "ip link set sglab12cdb up",
    ]);
  });

  it("wires a node: namespace, veth to the bridge, address, void neighbour, and the local rule behind the cut rules", () => {
    // Prepare
    const node = labNode(LAYOUT, "node-2", 2);

    // Act
    const commands = addNodeCommands(LAYOUT, node).map(line);

    // Assess
    expect(commands).toEqual([
      "ip netns add sgnl-ab12cd-node-2",
      "ip link add sglab12cdh2 type veth peer name eth0 netns sgnl-ab12cd-node-2",
      "ip link set sglab12cdh2 master sglab12cdb",
      "ip link set sglab12cdh2 up",
      "bridge fdb add 02:53:47:00:00:02 dev sglab12cdh2 master static",
      "ip -n sgnl-ab12cd-node-2 link set lo up",
      "ip -n sgnl-ab12cd-node-2 addr add 10.171.4.12/24 dev eth0",
      "ip -n sgnl-ab12cd-node-2 link set eth0 up",
      "ip -n sgnl-ab12cd-node-2 neigh add 10.171.4.254 lladdr 02:53:47:00:00:02 dev eth0 nud permanent",
      "ip -n sgnl-ab12cd-node-2 rule add pref 1000 lookup local",
      "ip -n sgnl-ab12cd-node-2 rule del pref 0 lookup local",
    ]);
  });

  it("removes a node's veth before its namespace, so a process left inside is cut off at once", () => {
    // Act
    const commands = removeNodeCommands(labNode(LAYOUT, "node-2", 2)).map(line);

    // Assess
    expect(commands).toEqual(["ip link del sglab12cdh2", "ip netns del sgnl-ab12cd-node-2"]);
  });
});

describe("from a partition spec to directed cuts", () => {
  const both = (a: string, b: string) => [`${a}>${b}`, `${b}>${a}`];

  it.each<[string, PartitionSpec, string[]]>([
    [
      "{node-1} | {node-2, node-3, aws}: node-1 loses every link both ways",
      { groups: [["node-1"], ["node-2", "node-3", AWS]] },
      [...both("node-1", "node-2"), ...both("node-1", "node-3"), ...both("node-1", AWS)],
    ],
    [
      "an AZ split {node-1, node-2} | {node-3, aws}: the primary keeps one replica",
      {
        groups: [
          ["node-1", "node-2"],
          ["node-3", AWS],
        ],
      },
      [
        ...both("node-1", "node-3"),
        ...both("node-1", AWS),
        ...both("node-2", "node-3"),
        ...both("node-2", AWS),
      ],
    ],
    [
      "three groups cut every pair across groups",
      { groups: [["node-1"], ["node-2"], ["node-3"]] },
      [...both("node-1", "node-2"), ...both("node-1", "node-3"), ...both("node-2", "node-3")],
    ],
    [
      "endpoints in no group keep their links",
      { groups: [["node-1"], ["node-2"]] },
      both("node-1", "node-2"),
    ],
    ["a cut is both ways by default", { cuts: [{ from: "node-2", to: AWS }] }, both("node-2", AWS)],
    [
      "a one-way cut drops one direction",
      { cuts: [{ from: "node-1", to: "node-2", oneWay: true }] },
      ["node-1>node-2"],
    ],
    ["AWS to a node, one way", { cuts: [{ from: AWS, to: "node-3", oneWay: true }] }, ["aws>node-3"]],
    [
      "groups and cuts together, each directed cut once",
      {
        groups: [["node-1"], ["node-2"]],
        cuts: [
          { from: "node-1", to: "node-2", oneWay: true },
          { from: "node-3", to: AWS, oneWay: true },
        ],
      },
      [...both("node-1", "node-2"), "node-3>aws"],
    ],
    ["an empty spec cuts nothing", {}, []],
  ])("%s", (_, spec, expected) => {
    // Act
    const cuts = cutsOf(spec, NODES);

    // Assess
    expect(cuts.map((cut) => `${cut.from}>${cut.to}`)).toEqual([...expected].sort());
  });

  it.each<[string, PartitionSpec, RegExp]>([
    ["an unknown endpoint", { groups: [["node-1"], ["node-9"]] }, /unknown endpoint "node-9"/],
    ["an endpoint in two groups", { groups: [["node-1", "node-2"], ["node-2"]] }, /node-2 is in two groups/],
    [
      "a cut from an endpoint to itself",
      { cuts: [{ from: "node-1", to: "node-1" }] },
      /cannot cut node-1 from itself/,
    ],
  ])("refuses %s", (_, spec, message) => {
    // Act
    const cut = () => cutsOf(spec, NODES);

    // Assess
    expect(cut).toThrow(message);
  });
});

describe("how a cut is made in the namespaces", () => {
  it.each([
    [
      "node to node: a blackhole rule in the receiver for the sender's address",
      { from: "node-1", to: "node-2" },
      "ip -n sgnl-ab12cd-node-2 rule add pref 100 from 10.171.4.11/32 blackhole",
      "ip -n sgnl-ab12cd-node-2 rule del pref 100 from 10.171.4.11/32 blackhole",
    ],
    [
      "AWS to a node: a blackhole rule in the node for the AWS address",
      { from: AWS, to: "node-3" },
      "ip -n sgnl-ab12cd-node-3 rule add pref 100 from 10.171.4.2/32 blackhole",
      "ip -n sgnl-ab12cd-node-3 rule del pref 100 from 10.171.4.2/32 blackhole",
    ],
    [
      "a node to AWS: a route in the node to AWS through the void next hop",
      { from: "node-1", to: AWS },
      "ip -n sgnl-ab12cd-node-1 route add 10.171.4.2/32 via 10.171.4.254 dev eth0",
      "ip -n sgnl-ab12cd-node-1 route del 10.171.4.2/32",
    ],
  ])("%s", (_, cut, add, del) => {
    // Act
    const commands = cutCommands(cut, LAYOUT, labNodes());

    // Assess
    expect(line(commands.add)).toBe(add);
    expect(line(commands.del)).toBe(del);
  });

  it("refuses a cut naming a node the lab does not have", () => {
    // Act
    const make = () => cutCommands({ from: "node-1", to: "node-4" }, LAYOUT, labNodes());

    // Assess
    expect(make).toThrow(/no lab node node-4/);
  });
});

describe("delay and loss", () => {
  it.each([
    [{ delayMs: 200 }, "tc -n sgnl-ab12cd-node-1 qdisc replace dev eth0 root netem delay 200ms loss 0%"],
    [
      { delayMs: 100, jitterMs: 20, lossPercent: 5 },
      "tc -n sgnl-ab12cd-node-1 qdisc replace dev eth0 root netem delay 100ms 20ms loss 5%",
    ],
  ])("sets netem on what the node sends: %j", (degradation, add) => {
    // Act
    const commands = degradeCommands(labNode(LAYOUT, "node-1", 1), degradation);

    // Assess
    expect(line(commands.add)).toBe(add);
    expect(line(commands.del)).toBe("tc -n sgnl-ab12cd-node-1 qdisc del dev eth0 root");
  });

  it.each([[{ delayMs: -1 }], [{ lossPercent: 101 }], [{ jitterMs: -5 }]])("refuses %j", (degradation) => {
    // Act
    const make = () => degradeCommands(labNode(LAYOUT, "node-1", 1), degradation);

    // Assess
    expect(make).toThrow(/bad degradation/);
  });
});
