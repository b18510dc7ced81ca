import { PrerequisiteError } from "../../core/errors.ts";
import {
  addNodeCommands,
  awsAddress,
  bridgeName,
  type Command,
  type Cut,
  type CutCommands,
  createBridgeCommands,
  cutCommands,
  cutsOf,
  type Degradation,
  degradeCommands,
  type LabLayout,
  type LabNode,
  type LabSubnet,
  labNode,
  newLabId,
  observerAddress,
  type PartitionSpec,
  pickSubnet,
  reachableUrl,
  removeNodeCommands,
  subnetCidr,
} from "./plan.ts";
import {
  closeOnExit,
  forget,
  listLinks,
  listNamespaces,
  NetLabError,
  PROBE_PREFIX,
  processStart,
  readRecords,
  removeRecord,
  run,
  runSync,
  sweepDeadLabs,
  writeRecord,
} from "./registry.ts";

export { AWS, type Cut, type CutSpec, type Degradation, type LabNode, type PartitionSpec } from "./plan.ts";
export { NetLabError, sweepDeadLabs } from "./registry.ts";

export interface NetLabOptions {
  /** Nodes to add at once, by name (the node ids of the cluster). @default none */
  readonly nodes?: readonly string[];
  /** Source of the lab id and subnet. @default Math.random */
  readonly random?: () => number;
}

let availability: { reason: string | undefined } | undefined;

/**
 * A network lab: each node gets its own Linux network namespace, wired by a veth pair to one
 * bridge on the host, so a partition is real packet loss between processes, not a proxy.
 *
 * - Addresses: the lab's own 10.a.b.0/24 (random a, b). The host holds `observerAddress` (.1,
 *   the source of the host's own connections to nodes: tests read any node through it, cuts never
 *   name it) and `awsAddress` (.2, where nodes reach DynamoDB Local and the SQS emulator, which
 *   listen on every interface: the `aws` endpoint of a cut). Node n gets .(10 + n).
 * - Names: namespaces `sgnl-<id>-<node>`, links `sgl<id>b` (bridge) and `sgl<id>h<n>` (veth);
 *   `<id>` is six random characters.
 * - Processes run inside with `ip netns exec` (see `inNamespace`); the pid is the process's own.
 *   A node that joins later (membership changes): `addNode(id)`, then a RedisNode whose `network`
 *   is `{ namespace, host: address }` of the returned LabNode; `removeNode` takes it out again.
 * - Cuts are silent drops (policy rules and a void next hop, see plan.ts `cutCommands`);
 *   `partition` adds, `heal` removes them all.
 * - Cleanup: `close()` deletes every namespace and link (rules and routes go with their
 *   namespace); the same runs on exit, and on SIGINT/SIGTERM/SIGHUP when nothing else listens for
 *   the signal (a runner that does closes the lab in its own stop); a record under /run names what
 *   each lab made, and every `create` first sweeps labs whose owner process is dead.
 */
export class NetLab {
  readonly id: string;
  readonly subnet: LabSubnet;
  readonly bridge: string;
  /** The host's address that node processes see for DynamoDB and SQS. */
  readonly awsAddress: string;
  /** The host's own address toward the nodes, never cut. */
  readonly observerAddress: string;
  readonly #nodes = new Map<string, LabNode>();
  readonly #cuts = new Map<string, CutCommands>();
  readonly #degraded = new Map<string, Command>();
  readonly #pidStart: string;
  #nextIndex = 1;
  #netem: { reason: string | undefined } = { reason: "not probed yet" };
  #closed = false;

  private constructor(layout: LabLayout) {
    this.id = layout.id;
    this.subnet = layout.subnet;
    this.bridge = bridgeName(layout.id);
    this.awsAddress = awsAddress(layout.subnet);
    this.observerAddress = observerAddress(layout.subnet);
    this.#pidStart = processStart(process.pid) ?? "";
  }

  /** True when this process can build labs: root, and `ip netns`, veth pairs and bridges work. */
  static available(): boolean {
    return NetLab.unavailableReason() === undefined;
  }

  /**
   * Why labs cannot be built here (undefined when they can), probed once per process by building
   * a throwaway namespace with a veth pair and a bridge inside it.
   */
  static unavailableReason(): string | undefined {
    availability ??= { reason: probe() };
    return availability.reason;
  }

  /** Builds a lab (and its nodes), after sweeping the leftovers of dead labs. */
  static async create(options: NetLabOptions = {}): Promise<NetLab> {
    const reason = NetLab.unavailableReason();
    if (reason) throw new PrerequisiteError(`the network lab cannot run here: ${reason}`);
    sweepDeadLabs();
    const random = options.random ?? Math.random;
    const used = usedSubnetText();
    const subnet = pickSubnet(random, (candidate) => used.includes(`10.${candidate.a}.${candidate.b}.`));
    const lab = new NetLab({ id: newLabId(random), subnet });
    lab.#saveRecord();
    closeOnExit(lab);
    try {
      for (const command of createBridgeCommands(lab.#layout)) await run(command);
      lab.#netem = { reason: probeNetem(lab.bridge) };
      for (const name of options.nodes ?? []) await lab.addNode(name);
      return lab;
    } catch (error) {
      lab.closeSync();
      throw error;
    }
  }

  get #layout(): LabLayout {
    return { id: this.id, subnet: this.subnet };
  }

  /** True when `tc netem` works here: `degrade` needs it. */
  get netem(): boolean {
    return this.#netem.reason === undefined;
  }

  /** Why `tc netem` does not work here (undefined when it does). */
  get netemUnavailableReason(): string | undefined {
    return this.#netem.reason;
  }

  /** Gives `name` a namespace and an address; a node removed before does not get its number back. */
  async addNode(name: string): Promise<LabNode> {
    this.#checkOpen();
    if (this.#nodes.has(name)) throw new NetLabError(`lab ${this.id} already has a node ${name}`);
    const node = labNode(this.#layout, name, this.#nextIndex++);
    this.#nodes.set(name, node);
    // Recorded before it exists: a crash from here on leaves nothing no sweep can name.
    this.#saveRecord();
    for (const command of addNodeCommands(this.#layout, node)) await run(command);
    return node;
  }

  /** Deletes a node's namespace and link, and every cut that names it. */
  async removeNode(name: string): Promise<void> {
    const node = this.node(name);
    for (const [key, cut] of this.#cuts) {
      if (cut.cut.from !== name && cut.cut.to !== name) continue;
      this.#cuts.delete(key);
      // A rule inside the node's own namespace goes with it; one in another namespace must be deleted.
      if (!cut.del.args.includes(node.namespace)) await run(cut.del);
    }
    this.#degraded.delete(name);
    for (const command of removeNodeCommands(node)) runSync(command);
    this.#nodes.delete(name);
    this.#saveRecord();
  }

  node(name: string): LabNode {
    const node = this.#nodes.get(name);
    if (!node) throw new NetLabError(`lab ${this.id} has no node ${name}`);
    return node;
  }

  get nodes(): readonly LabNode[] {
    return [...this.#nodes.values()];
  }

  /** `command args` to run inside `name`'s namespace: hand the result to spawn. */
  inNamespace(name: string, command: string, args: readonly string[]): { command: string; args: string[] } {
    return { command: "ip", args: ["netns", "exec", this.node(name).namespace, command, ...args] };
  }

  /**
   * `url` as a node reaches it: a loopback host (127.0.0.1, localhost, ::1) becomes `awsAddress`,
   * where the host's emulators answer too; any other URL is returned as is (nodes have no route
   * off the lab, so endpoints elsewhere are out of reach in this mode).
   */
  hostUrl(url: string): string {
    return reachableUrl(url, this.awsAddress);
  }

  /**
   * Cuts links as `spec` says (see `PartitionSpec`: group splits and single cuts, each both ways
   * or one-way), on top of the cuts already in place; returns the directed cuts the spec stands for.
   * Takes effect on established connections too: every packet is routed anew.
   */
  async partition(spec: PartitionSpec): Promise<Cut[]> {
    this.#checkOpen();
    const cuts = cutsOf(spec, [...this.#nodes.keys()]);
    const fresh = cuts
      .filter((cut) => !this.#cuts.has(cutKey(cut)))
      .map((cut) => cutCommands(cut, this.#layout, this.#nodes));
    const results = await Promise.allSettled(fresh.map((commands) => run(commands.add)));
    const failures: unknown[] = [];
    results.forEach((result, index) => {
      const commands = fresh[index] as CutCommands;
      if (result.status === "fulfilled") this.#cuts.set(cutKey(commands.cut), commands);
      else failures.push(result.reason);
    });
    if (failures.length > 0) throw failures[0];
    return cuts;
  }

  /** The directed cuts in place now. */
  get cuts(): Cut[] {
    return [...this.#cuts.values()].map((commands) => commands.cut);
  }

  /**
   * Delays and drops what node `name` sends (`tc netem`); replaces its earlier degradation. Throws a
   * PrerequisiteError where netem is missing (see `netem`): callers skip delay and loss faults then.
   */
  async degrade(name: string, degradation: Degradation): Promise<void> {
    this.#checkOpen();
    if (this.#netem.reason)
      throw new PrerequisiteError(`tc netem is not available here: ${this.#netem.reason}`);
    const commands = degradeCommands(this.node(name), degradation);
    await run(commands.add);
    this.#degraded.set(name, commands.del);
  }

  /** Removes every cut and degradation: all nodes and AWS reach each other again. */
  async heal(): Promise<void> {
    const undo = [...this.#cuts.values()].map((commands) => commands.del);
    undo.push(...this.#degraded.values());
    this.#cuts.clear();
    this.#degraded.clear();
    const results = await Promise.allSettled(undo.map((command) => run(command)));
    const failed = results.find((result) => result.status === "rejected");
    if (failed) throw failed.reason;
  }

  /** Deletes every namespace and link of the lab (rules and routes go with them); safe to call twice. */
  async close(): Promise<void> {
    this.closeSync();
  }

  /**
   * `close` without awaiting, for exit hooks. Processes still inside a namespace lose their link at
   * once and the namespace vanishes when they exit. Throws when something could not be deleted;
   * the record then stays for the sweep.
   */
  closeSync(): void {
    if (this.#closed) return;
    this.#closed = true;
    forget(this);
    for (const node of this.#nodes.values()) for (const command of removeNodeCommands(node)) runSync(command);
    runSync({ tool: "ip", args: ["link", "del", this.bridge] });
    const namespaces = new Set([...this.#nodes.values()].map((node) => node.namespace));
    const links = new Set([this.bridge, ...[...this.#nodes.values()].map((node) => node.hostLink)]);
    const left = [
      ...listNamespaces().filter((name) => namespaces.has(name)),
      ...listLinks().filter((name) => links.has(name)),
    ];
    if (left.length > 0) throw new NetLabError(`lab ${this.id} could not delete ${left.join(", ")}`);
    removeRecord(this.id);
  }

  #checkOpen(): void {
    if (this.#closed) throw new NetLabError(`lab ${this.id} is closed`);
  }

  #saveRecord(): void {
    writeRecord({
      id: this.id,
      pid: process.pid,
      pidStart: this.#pidStart,
      subnet: this.subnet,
      bridge: this.bridge,
      namespaces: [...this.#nodes.values()].map((node) => node.namespace),
      links: [...this.#nodes.values()].map((node) => node.hostLink),
    });
  }
}

function cutKey(cut: Cut): string {
  return `${cut.from}>${cut.to}`;
}

/** The host's IPv4 addresses and routes, plus the subnets of recorded labs, as text to search. */
function usedSubnetText(): string {
  const addresses = runSync({ tool: "ip", args: ["-4", "-o", "addr", "show"] }).output;
  const routes = runSync({ tool: "ip", args: ["-4", "route", "show", "table", "all"] }).output;
  const labs = readRecords().map((record) => subnetCidr(record.subnet));
  return [addresses, routes, ...labs].join("\n");
}

/** Undefined when a namespace with a veth pair and a bridge can be built, else why not. */
function probe(): string | undefined {
  if (process.getuid?.() !== 0) return "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)";
  const name = `${PROBE_PREFIX}${process.pid}-${processStart(process.pid) ?? "0"}`;
  const steps: Command[] = [
    { tool: "ip", args: ["netns", "add", name] },
    { tool: "ip", args: ["-n", name, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1"] },
    { tool: "ip", args: ["-n", name, "link", "add", "probebr", "type", "bridge"] },
    { tool: "ip", args: ["-n", name, "link", "set", "probe0", "master", "probebr"] },
    { tool: "ip", args: ["netns", "exec", name, "true"] },
  ];
  try {
    for (const step of steps) {
      const result = runSync(step);
      if (!result.ok) return `${[step.tool, ...step.args].join(" ")}: ${result.output.trim() || "failed"}`;
    }
    return undefined;
  } finally {
    runSync({ tool: "ip", args: ["netns", "del", name] });
  }
}

/** Undefined when a netem qdisc can be added to (and removed from) the lab's bridge, else why not. */
function probeNetem(bridge: string): string | undefined {
  const added = runSync({
    tool: "tc",
    args: ["qdisc", "add", "dev", bridge, "root", "netem", "delay", "1ms"],
  });
  if (!added.ok)
    return `tc qdisc add ... netem: ${added.output.trim() || "failed"} (the sch_netem module is missing)`;
  runSync({ tool: "tc", args: ["qdisc", "del", "dev", bridge, "root"] });
  return undefined;
}
