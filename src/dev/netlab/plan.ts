/**
 * The pure half of the network lab: names, addresses, and the `ip`/`tc` argument lists that build
 * a lab, cut links and heal them. No I/O here, so every plan is table-tested
 * (test/unit/netlab-plan.test.ts); `netlab.ts` only runs what these functions return.
 */

/** The endpoint name of the host side in a partition spec: DynamoDB Local, the SQS emulator, the controllers. */
export const AWS = "aws";

/** Every namespace a lab creates starts with this; the sweep finds leftovers by it. */
export const NAMESPACE_PREFIX = "sgnl-";
/** Every host-side link (bridge, veth) a lab creates starts with this. */
export const LINK_PREFIX = "sgl";
/** The interface name inside each node's namespace. */
export const NODE_INTERFACE = "eth0";
/**
 * Cut rules sit at this preference, above the `local` table, which each namespace moves from 0 to
 * LOCAL_RULE_PREF: otherwise the local table answers first for packets addressed to the node and an
 * ingress rule would never be consulted.
 */
export const CUT_RULE_PREF = 100;
export const LOCAL_RULE_PREF = 1000;
/** Linux caps interface names at 15 bytes (IFNAMSIZ - 1). */
const IFNAME_MAX = 15;
/** Nodes per lab: addresses .11 up to .210 of the /24. */
export const MAX_NODES = 200;

const ID_PATTERN = /^[a-z0-9]{6}$/;

/** A lab's /24: 10.a.b.0/24. */
export interface LabSubnet {
  readonly a: number;
  readonly b: number;
}

/** Everything that names a lab: its id (in every name it creates) and its subnet. */
export interface LabLayout {
  readonly id: string;
  readonly subnet: LabSubnet;
}

/** One node of a lab: its endpoint name (the node id), its number in the lab and what follows from them. */
export interface LabNode {
  readonly name: string;
  /** 1, 2, ... in order of addition; never reused within a lab. */
  readonly index: number;
  readonly namespace: string;
  /** The host end of the node's veth pair, a port of the lab's bridge. */
  readonly hostLink: string;
  readonly address: string;
  /** The MAC of the node's void next hop; the bridge drops frames to it (see `cutCommands`). */
  readonly voidMac: string;
}

/** A random lab id: six characters of [a-z0-9]. `random` returns [0, 1). */
export function newLabId(random: () => number): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  let id = "";
  for (let index = 0; index < 6; index++) id += alphabet[Math.floor(random() * alphabet.length)];
  return id;
}

/**
 * A random 10.a.b.0/24 with a in 160..223, not one `taken` refuses (a subnet of this host or of a
 * live lab): 16,384 choices, so parallel labs rarely collide and a collision is retried.
 */
export function pickSubnet(random: () => number, taken: (subnet: LabSubnet) => boolean): LabSubnet {
  for (let attempt = 0; attempt < 64; attempt++) {
    const subnet = { a: 160 + Math.floor(random() * 64), b: Math.floor(random() * 256) };
    if (!taken(subnet)) return subnet;
  }
  throw new Error("no free 10.a.b.0/24 for a network lab after 64 tries");
}

/** `subnet` as CIDR, e.g. 10.171.4.0/24. */
export function subnetCidr(subnet: LabSubnet): string {
  return `10.${subnet.a}.${subnet.b}.0/24`;
}

function host(subnet: LabSubnet, last: number): string {
  return `10.${subnet.a}.${subnet.b}.${last}`;
}

/**
 * The host's address for tests and tools that watch the cluster (the observer). Added first to the
 * bridge, so it is the source of every connection the host opens to a node, and no cut names it:
 * a test can read a partitioned node's offsets.
 */
export function observerAddress(subnet: LabSubnet): string {
  return host(subnet, 1);
}

/** The host's address that nodes use to reach DynamoDB and SQS: the `aws` endpoint of a cut. */
export function awsAddress(subnet: LabSubnet): string {
  return host(subnet, 2);
}

/** An address nobody holds: the next hop of egress cuts, resolved to the node's void MAC. */
export function voidAddress(subnet: LabSubnet): string {
  return host(subnet, 254);
}

export function bridgeName(id: string): string {
  return checkedLinkName(`${LINK_PREFIX}${id}b`);
}

function checkedLinkName(name: string): string {
  if (name.length > IFNAME_MAX) throw new Error(`interface name ${name} is longer than ${IFNAME_MAX}`);
  return name;
}

/** The node's description from its name and number; throws on a bad id, a number out of range, a bad name. */
export function labNode(layout: LabLayout, name: string, index: number): LabNode {
  if (!ID_PATTERN.test(layout.id)) throw new Error(`lab id ${layout.id} is not six of [a-z0-9]`);
  if (!Number.isInteger(index) || index < 1 || index > MAX_NODES)
    throw new Error(`node number ${index} is outside 1..${MAX_NODES}`);
  if (name === AWS || !/^[A-Za-z0-9_.-]{1,40}$/.test(name))
    throw new Error(`${JSON.stringify(name)} cannot name a lab node (letters, digits, _.- and not "${AWS}")`);
  const hex = (value: number) => value.toString(16).padStart(2, "0");
  return {
    name,
    index,
    namespace: `${NAMESPACE_PREFIX}${layout.id}-${name}`,
    hostLink: checkedLinkName(`${LINK_PREFIX}${layout.id}h${index}`),
    address: host(layout.subnet, 10 + index),
    voidMac: `02:53:47:00:${hex(index >> 8)}:${hex(index & 0xff)}`,
  };
}

/** `url` with a loopback host (127.0.0.1, localhost, ::1, 0.0.0.0) replaced by `address`; others as they are. */
export function reachableUrl(url: string, address: string): string {
  const parsed = new URL(url);
  if (!["127.0.0.1", "localhost", "[::1]", "0.0.0.0"].includes(parsed.hostname)) return url;
  const path = parsed.pathname === "/" ? "" : parsed.pathname;
  return `${parsed.protocol}//${address}${parsed.port ? `:${parsed.port}` : ""}${path}${parsed.search}`;
}

/** One command the lab runs: an iproute2 tool and its arguments. */
export interface Command {
  readonly tool: "ip" | "bridge" | "tc";
  readonly args: readonly string[];
}

const ip = (...args: string[]): Command => ({ tool: "ip", args });

/** Host-side commands that create the lab's bridge with the observer and AWS addresses. */
export function createBridgeCommands(layout: LabLayout): Command[] {
  const bridge = bridgeName(layout.id);
  return [
    ip("link", "add", bridge, "type", "bridge"),
    // Observer first: the primary address is the source the host picks to reach a node.
    ip("addr", "add", `${observerAddress(layout.subnet)}/24`, "dev", bridge),
    ip("addr", "add", `${awsAddress(layout.subnet)}/24`, "dev", bridge),
    ip("link", "set", bridge, "up"),
  ];
}

/**
 * Commands that give `node` its namespace, wired to the bridge: a veth pair (`eth0` inside), its
 * address, the void next hop for egress cuts, and the local rule moved behind the cut rules.
 */
export function addNodeCommands(layout: LabLayout, node: LabNode): Command[] {
  const ns = ["-n", node.namespace];
  return [
    ip("netns", "add", node.namespace),
    ip("link", "add", node.hostLink, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", node.namespace),
    ip("link", "set", node.hostLink, "master", bridgeName(layout.id)),
    ip("link", "set", node.hostLink, "up"),
    // Frames to the void MAC that arrive on this port belong to this port: the bridge drops them.
    { tool: "bridge", args: ["fdb", "add", node.voidMac, "dev", node.hostLink, "master", "static"] },
    ip(...ns, "link", "set", "lo", "up"),
    ip(...ns, "addr", "add", `${node.address}/24`, "dev", NODE_INTERFACE),
    ip(...ns, "link", "set", NODE_INTERFACE, "up"),
    ip(
      ...ns,
      "neigh",
      "add",
      voidAddress(layout.subnet),
      "lladdr",
      node.voidMac,
      "dev",
      NODE_INTERFACE,
      "nud",
      "permanent",
    ),
    ip(...ns, "rule", "add", "pref", String(LOCAL_RULE_PREF), "lookup", "local"),
    ip(...ns, "rule", "del", "pref", "0", "lookup", "local"),
  ];
}

/**
 * Commands that remove a node: its veth first (one end takes the other; a process left inside is
 * cut off at once), then the namespace. Each may fail because it is already gone.
 */
export function removeNodeCommands(node: LabNode): Command[] {
  return [ip("link", "del", node.hostLink), ip("netns", "del", node.namespace)];
}

/**
 * What to cut, in either form, or both in one spec:
 * - `groups`: a split. Every endpoint in one group loses both directions to every endpoint of every
 *   other group; endpoints named in no group keep all their links. `{n1} | {n2, n3, AWS}` is
 *   `{ groups: [["node-1"], ["node-2", "node-3", "aws"]] }`.
 * - `cuts`: single links. `{ from: "node-1", to: "node-2" }` cuts both directions;
 *   `{ from: "node-1", to: "aws", oneWay: true }` drops only what node-1 sends to AWS (its requests
 *   are lost), `{ from: "aws", to: "node-1", oneWay: true }` only what AWS sends to node-1 (its
 *   requests are applied, the answers lost).
 * Endpoints are node ids of the lab and `"aws"` (the host side: DynamoDB, SQS, the controllers).
 */
export interface PartitionSpec {
  readonly groups?: readonly (readonly string[])[];
  readonly cuts?: readonly CutSpec[];
}

export interface CutSpec {
  readonly from: string;
  readonly to: string;
  /** Only packets from `from` to `to` are dropped. @default false (both directions) */
  readonly oneWay?: boolean;
}

/** One directed cut: packets from `from` to `to` are dropped. */
export interface Cut {
  readonly from: string;
  readonly to: string;
}

/**
 * The directed cuts a spec stands for, each once, in a stable order; throws on an unknown
 * endpoint, an endpoint in two groups, or a cut from an endpoint to itself.
 */
export function cutsOf(spec: PartitionSpec, endpoints: readonly string[]): Cut[] {
  const known = new Set([...endpoints, AWS]);
  const check = (name: string) => {
    if (!known.has(name))
      throw new Error(
        `unknown endpoint ${JSON.stringify(name)} in a partition (known: ${[...known].join(", ")})`,
      );
  };
  const cuts = new Map<string, Cut>();
  const add = (from: string, to: string) => {
    if (from === to) throw new Error(`a partition cannot cut ${from} from itself`);
    cuts.set(`${from}>${to}`, { from, to });
  };
  const groups = spec.groups ?? [];
  const seen = new Map<string, number>();
  groups.forEach((group, index) => {
    for (const name of group) {
      check(name);
      const other = seen.get(name);
      if (other !== undefined && other !== index) throw new Error(`${name} is in two groups of a partition`);
      seen.set(name, index);
    }
  });
  for (const [left, group] of groups.entries()) {
    for (const [right, other] of groups.entries()) {
      if (left === right) continue;
      for (const from of group) for (const to of other) add(from, to);
    }
  }
  for (const cut of spec.cuts ?? []) {
    check(cut.from);
    check(cut.to);
    add(cut.from, cut.to);
    if (!cut.oneWay) add(cut.to, cut.from);
  }
  return [...cuts.values()].sort((x, y) => `${x.from}>${x.to}`.localeCompare(`${y.from}>${y.to}`));
}

/** The commands that install and remove one cut. */
export interface CutCommands {
  readonly cut: Cut;
  readonly add: Command;
  readonly del: Command;
}

/**
 * How one directed cut is made, always as a silent drop (a real partition times out; it does not
 * refuse):
 * - to a node: a `blackhole` policy rule in the receiver's namespace for packets from the sender's
 *   address, consulted before the local table, so packets to the node are dropped on arrival;
 * - from a node to AWS: a route in the sender's namespace to the AWS address via the void next hop,
 *   whose MAC the bridge sends back to the port it came from, i.e. drops. (A `blackhole` route
 *   would fail the sender's connect at once with EINVAL, and `tc` filters need kernel modules that
 *   are often missing.)
 */
export function cutCommands(cut: Cut, layout: LabLayout, nodes: ReadonlyMap<string, LabNode>): CutCommands {
  const nodeNamed = (name: string) => {
    const node = nodes.get(name);
    if (!node) throw new Error(`no lab node ${name}`);
    return node;
  };
  if (cut.to !== AWS) {
    const receiver = nodeNamed(cut.to);
    const from = cut.from === AWS ? awsAddress(layout.subnet) : nodeNamed(cut.from).address;
    const rule = (verb: string) =>
      ip(
        "-n",
        receiver.namespace,
        "rule",
        verb,
        "pref",
        String(CUT_RULE_PREF),
        "from",
        `${from}/32`,
        "blackhole",
      );
    return { cut, add: rule("add"), del: rule("del") };
  }
  const sender = nodeNamed(cut.from);
  const target = `${awsAddress(layout.subnet)}/32`;
  return {
    cut,
    add: ip(
      "-n",
      sender.namespace,
      "route",
      "add",
      target,
      "via",
      voidAddress(layout.subnet),
      "dev",
      NODE_INTERFACE,
    ),
    del: ip("-n", sender.namespace, "route", "del", target),
  };
}

/** Delay and loss on everything a node sends (`tc netem` on its interface). */
export interface Degradation {
  /** @default 0 */
  readonly delayMs?: number;
  /** Random variation around `delayMs`. @default 0 */
  readonly jitterMs?: number;
  /** Percentage of packets dropped, 0..100. @default 0 */
  readonly lossPercent?: number;
}

/** The `tc` commands that set and remove a degradation on `node`'s outgoing traffic. */
export function degradeCommands(node: LabNode, degradation: Degradation): { add: Command; del: Command } {
  const delay = degradation.delayMs ?? 0;
  const jitter = degradation.jitterMs ?? 0;
  const loss = degradation.lossPercent ?? 0;
  if (delay < 0 || jitter < 0 || loss < 0 || loss > 100)
    throw new Error(`bad degradation ${JSON.stringify(degradation)}: delays >= 0, loss in 0..100`);
  const netem = ["delay", `${delay}ms`, ...(jitter > 0 ? [`${jitter}ms`] : []), "loss", `${loss}%`];
  const root = (verb: string) => ["-n", node.namespace, "qdisc", verb, "dev", NODE_INTERFACE, "root"];
  return {
    add: { tool: "tc", args: [...root("replace"), "netem", ...netem] },
    del: { tool: "tc", args: root("del") },
  };
}
