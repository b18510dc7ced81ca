import { setTimeout as sleep } from "node:timers/promises";
import { Redis } from "ioredis";
import { tryParseAddress } from "../../core/address.ts";
import { errorMessage } from "../../core/errors.ts";
import type { Topology } from "../../core/model.ts";
import type { RedisNode } from "../local-stack/redis-nodes.ts";
import { classifyWriteError } from "../workload/writer.ts";
import type { FinalNodeRead, FinalRead } from "./checker.ts";
import type { RoleRead } from "./copies.ts";
import { cooldownFor, type EpochValue, type History, type ProbeValue } from "./history.ts";

/**
 * The nemesis's clients, each recording into the shared history:
 * - `NemesisWriter`: one write at a time, `SET <prefix>k<seq>` then `WAIT 1 <ms>`, to the primary
 *   the topology advertises (re-read every `recheckMs`, so a writer stuck on a deposed primary that
 *   still accepts writes moves on like a real client would);
 * - `StrayWriter`: the same writes (sequence numbers from the `NemesisWriter`) to every other node
 *   that answers `ROLE` as master, as a client that never re-read the topology would: a deposed
 *   primary's acknowledged writes are checked like the advertised one's;
 * - `WritableSampler`: every ~200 ms, a write to a probe key on every node; which accepted;
 * - `TopologyObserver`: every epoch change of the topology, as read.
 * They talk to DynamoDB directly, never through a fault proxy: they are the application, not the system.
 */

function redisClient(address: string, timeoutMs: number): Redis | undefined {
  const endpoint = tryParseAddress(address);
  if (!endpoint) return undefined;
  const client = new Redis(endpoint.port, endpoint.host, {
    lazyConnect: true,
    enableOfflineQueue: false,
    enableReadyCheck: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: timeoutMs,
    commandTimeout: timeoutMs,
  });
  // Failures surface as rejected commands.
  client.on("error", () => {});
  return client;
}

/** A refusal that certainly did not apply the write (an error reply, not a timeout or a reset). */
function certainlyNotApplied(error: unknown): boolean {
  const kind = classifyWriteError(error);
  return kind === "readonly" || (kind === "error" && /^[A-Z]+ /.test(errorMessage(error)));
}

export interface NemesisWriterOptions {
  readonly history: History;
  /** host:port of the advertised primary, or undefined while there is none. */
  readonly resolvePrimary: () => Promise<string | undefined>;
  /** Node id of a host:port. */
  readonly nodeOf: (address: string) => string | undefined;
  readonly keyPrefix: string;
  /** The timeout argument of WAIT. @default 300 */
  readonly waitTimeoutMs?: number;
  /** Client-side bound on one command and on connecting. @default 1000 */
  readonly commandTimeoutMs?: number;
  /** Pause between two writes. @default 10 */
  readonly writeIntervalMs?: number;
  /** How often the advertised primary is re-read while writing. @default 500 */
  readonly recheckMs?: number;
}

/** One background loop of a workload part: started once, stopped by aborting it and waiting for it. */
class BackgroundLoop {
  #abort: AbortController | undefined;
  #running: Promise<void> | undefined;

  start(run: (signal: AbortSignal) => Promise<void>): void {
    if (this.#running) return;
    this.#abort = new AbortController();
    this.#running = run(this.#abort.signal);
  }

  async stop(): Promise<void> {
    this.#abort?.abort();
    await this.#running;
    this.#running = undefined;
  }
}

export class NemesisWriter {
  readonly #options: NemesisWriterOptions;
  #seq = 0;
  readonly #loop = new BackgroundLoop();
  #client: Redis | undefined;
  #address: string | undefined;
  #checkedAt = 0;
  #acked = 0;
  #lastConnectFailure: string | undefined;

  constructor(options: NemesisWriterOptions) {
    this.#options = options;
  }

  keyOf(seq: number): string {
    return `${this.#options.keyPrefix}k${seq}`;
  }

  seqOf(key: string): number | undefined {
    if (!key.startsWith(`${this.#options.keyPrefix}k`)) return undefined;
    const seq = Number(key.slice(this.#options.keyPrefix.length + 1));
    return Number.isInteger(seq) ? seq : undefined;
  }

  get acked(): number {
    return this.#acked;
  }

  /** The next sequence number: the stray writer's writes share the numbering. */
  nextSeq(): number {
    return ++this.#seq;
  }

  /** host:port the writer is connected to now, if any. */
  get address(): string | undefined {
    return this.#address;
  }

  start(): void {
    this.#loop.start((signal) => this.#run(signal));
  }

  async stop(): Promise<void> {
    await this.#loop.stop();
    this.#drop();
  }

  async #run(signal: AbortSignal): Promise<void> {
    const interval = this.#options.writeIntervalMs ?? 10;
    while (!signal.aborted) {
      const wrote = await this.#step().catch(() => false);
      await sleep(wrote ? interval : 50, undefined, { signal }).catch(() => {});
    }
  }

  async #resolve(): Promise<string | undefined> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), 1000);
    });
    try {
      return await Promise.race([this.#options.resolvePrimary().catch(() => undefined), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  async #step(): Promise<boolean> {
    const { history } = this.#options;
    const timeoutMs = this.#options.commandTimeoutMs ?? 1000;
    if (this.#client && performance.now() - this.#checkedAt > (this.#options.recheckMs ?? 500)) {
      this.#checkedAt = performance.now();
      const advertised = await this.#resolve();
      if (advertised !== undefined && advertised !== this.#address) this.#drop();
    }
    if (!this.#client) {
      const address = await this.#resolve();
      if (!address) return false;
      const client = redisClient(address, timeoutMs);
      if (!client) return false;
      try {
        await client.connect();
        const role = (await client.role()) as unknown[];
        if (role[0] !== "master") throw new Error(`ROLE is ${String(role[0])}`);
      } catch (error) {
        client.disconnect();
        // Why the writer cannot write, once per change of reason (not once per attempt).
        const reason = `${address}: ${errorMessage(error).slice(0, 120)}`;
        if (reason !== this.#lastConnectFailure) {
          this.#lastConnectFailure = reason;
          this.#options.history.append({
            process: "writer",
            type: "fail",
            f: "connect",
            value: { address, error: errorMessage(error).slice(0, 120) },
            node: this.#options.nodeOf(address),
          });
        }
        return false;
      }
      this.#lastConnectFailure = undefined;
      this.#client = client;
      this.#address = address;
      this.#checkedAt = performance.now();
    }
    const client = this.#client;
    const node = this.#options.nodeOf(this.#address ?? "");
    const seq = this.nextSeq();
    history.append({ process: "writer", type: "invoke", f: "write", value: { seq }, node });
    try {
      const reply = await client.set(this.keyOf(seq), String(seq));
      if (reply !== "OK") throw new Error(`unexpected reply ${String(reply)}`);
    } catch (error) {
      const message = errorMessage(error).slice(0, 120);
      const type = certainlyNotApplied(error) ? "fail" : "info";
      history.append({ process: "writer", type, f: "write", value: { seq, error: message }, node });
      this.#drop();
      return false;
    }
    let replicas = 0;
    let waitError: string | undefined;
    try {
      replicas = Number(await client.wait(1, this.#options.waitTimeoutMs ?? 300));
    } catch (error) {
      waitError = errorMessage(error).slice(0, 120);
      this.#drop();
    }
    this.#acked++;
    history.append({
      process: "writer",
      type: "ok",
      f: "write",
      value: waitError ? { seq, replicas, error: `WAIT: ${waitError}` } : { seq, replicas },
      node,
    });
    return waitError === undefined;
  }

  #drop(): void {
    this.#client?.disconnect();
    this.#client = undefined;
    this.#address = undefined;
  }
}

/**
 * Every `intervalMs`, asks each live node other than the one the main writer uses for `ROLE`; one
 * that answers master gets a write (`SET`, then `WAIT 1`), recorded like the main writer's. A
 * deposed primary that still takes writes and has them acknowledged by a replica is what the
 * checker's rule (a) must see: those writes are acknowledged to a client too.
 */
export class StrayWriter {
  readonly #history: History;
  readonly #nodes: NodeSet;
  readonly #writer: NemesisWriter;
  readonly #intervalMs: number;
  readonly #waitTimeoutMs: number;
  readonly #clients = new Map<string, Redis>();
  readonly #loop = new BackgroundLoop();
  #writes = 0;

  constructor(
    history: History,
    nodes: NodeSet,
    writer: NemesisWriter,
    options: { intervalMs?: number; waitTimeoutMs?: number } = {},
  ) {
    this.#history = history;
    this.#nodes = nodes;
    this.#writer = writer;
    this.#intervalMs = options.intervalMs ?? 100;
    this.#waitTimeoutMs = options.waitTimeoutMs ?? 300;
  }

  /** Writes sent to a node other than the main writer's. */
  get writes(): number {
    return this.#writes;
  }

  start(): void {
    this.#loop.start((signal) => this.#run(signal));
  }

  async stop(): Promise<void> {
    await this.#loop.stop();
    for (const client of this.#clients.values()) client.disconnect();
    this.#clients.clear();
  }

  async #run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      const started = performance.now();
      await Promise.all(
        currentNodes(this.#nodes, this.#clients)
          .filter((node) => node.alive() && node.address !== this.#writer.address)
          .map((node) => this.#writeIfMaster(node).catch(() => {})),
      );
      const rest = Math.max(10, this.#intervalMs - (performance.now() - started));
      await sleep(rest, undefined, { signal }).catch(() => {});
    }
  }

  async #writeIfMaster(node: SampledNode): Promise<void> {
    let client = this.#clients.get(node.id);
    try {
      if (!client) {
        client = redisClient(node.address, 1000);
        if (!client) return;
        this.#clients.set(node.id, client);
        await client.connect();
      }
      const role = (await client.role()) as unknown[];
      if (role[0] !== "master") return;
    } catch {
      client?.disconnect();
      this.#clients.delete(node.id);
      return;
    }
    const seq = this.#writer.nextSeq();
    this.#writes++;
    this.#history.append({ process: "writer", type: "invoke", f: "write", value: { seq }, node: node.id });
    try {
      const reply = await client.set(this.#writer.keyOf(seq), String(seq));
      if (reply !== "OK") throw new Error(`unexpected reply ${String(reply)}`);
    } catch (error) {
      const type = certainlyNotApplied(error) ? "fail" : "info";
      this.#history.append({
        process: "writer",
        type,
        f: "write",
        value: { seq, error: errorMessage(error).slice(0, 120), stray: true },
        node: node.id,
      });
      if (type === "info") {
        client.disconnect();
        this.#clients.delete(node.id);
      }
      return;
    }
    let replicas = 0;
    let waitError: string | undefined;
    try {
      replicas = Number(await client.wait(1, this.#waitTimeoutMs));
    } catch (error) {
      waitError = errorMessage(error).slice(0, 120);
      client.disconnect();
      this.#clients.delete(node.id);
    }
    this.#history.append({
      process: "writer",
      type: "ok",
      f: "write",
      value: waitError
        ? { seq, replicas, error: `WAIT: ${waitError}`, stray: true }
        : { seq, replicas, stray: true },
      node: node.id,
    });
  }
}

export interface SampledNode {
  readonly id: string;
  readonly address: string;
  /** False while the node is known dead (killed): not probed, reported unreachable. */
  readonly alive: () => boolean;
}

/**
 * The nodes a workload part talks to: a fixed list, or a function read anew every round (the
 * nemesis's `membership` fault adds nodes at run time and removes others).
 */
export type NodeSet = readonly SampledNode[] | (() => readonly SampledNode[]);

/** The nodes of `set` now; the clients of nodes no longer in it are disconnected and forgotten. */
function currentNodes(set: NodeSet, clients: Map<string, Redis>): readonly SampledNode[] {
  const nodes = typeof set === "function" ? set() : set;
  for (const [id, client] of clients) {
    if (nodes.some((node) => node.id === id)) continue;
    client.disconnect();
    clients.delete(id);
  }
  return nodes;
}

/** Every `intervalMs`, a write to `<prefix>probe` on every live node; records who accepted. */
export class WritableSampler {
  readonly #history: History;
  readonly #nodes: NodeSet;
  readonly #key: string;
  readonly #intervalMs: number;
  readonly #timeoutMs: number;
  readonly #clients = new Map<string, Redis>();
  readonly #loop = new BackgroundLoop();

  constructor(history: History, nodes: NodeSet, keyPrefix: string, intervalMs = 200, timeoutMs = 150) {
    this.#history = history;
    this.#nodes = nodes;
    this.#key = `${keyPrefix}probe`;
    this.#intervalMs = intervalMs;
    this.#timeoutMs = timeoutMs;
  }

  start(): void {
    this.#loop.start((signal) => this.#run(signal));
  }

  async stop(): Promise<void> {
    await this.#loop.stop();
    for (const client of this.#clients.values()) client.disconnect();
    this.#clients.clear();
  }

  async #run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      const started = performance.now();
      await this.sample();
      const rest = Math.max(10, this.#intervalMs - (performance.now() - started));
      await sleep(rest, undefined, { signal }).catch(() => {});
    }
  }

  /** One sample: probes every node at once and records a `probe` op. */
  async sample(): Promise<ProbeValue> {
    const writable: string[] = [];
    const refused: string[] = [];
    const unreachable: string[] = [];
    await Promise.all(
      currentNodes(this.#nodes, this.#clients).map(async (node) => {
        if (!node.alive()) {
          unreachable.push(node.id);
          return;
        }
        let client = this.#clients.get(node.id);
        try {
          if (!client) {
            client = redisClient(node.address, this.#timeoutMs);
            if (!client) throw new Error("bad address");
            this.#clients.set(node.id, client);
            await client.connect();
          }
          const reply = await client.set(this.#key, node.id);
          if (reply === "OK") writable.push(node.id);
          else refused.push(node.id);
        } catch (error) {
          if (certainlyNotApplied(error)) {
            refused.push(node.id);
          } else {
            unreachable.push(node.id);
            client?.disconnect();
            this.#clients.delete(node.id);
          }
        }
      }),
    );
    const value: ProbeValue = {
      writable: writable.sort(),
      refused: refused.sort(),
      unreachable: unreachable.sort(),
    };
    this.#history.append({ process: "sampler", type: "ok", f: "probe", value });
    return value;
  }
}

/**
 * Records every change of the shard's topology (epoch, primary or status; and the first read) as an
 * `epoch` op; the checker counts those whose epoch moved as epoch changes.
 */
export class TopologyObserver {
  readonly #history: History;
  readonly #read: () => Promise<Topology | undefined>;
  readonly #intervalMs: number;
  #last: Topology | undefined;
  readonly #loop = new BackgroundLoop();

  constructor(history: History, read: () => Promise<Topology | undefined>, intervalMs = 200) {
    this.#history = history;
    this.#read = read;
    this.#intervalMs = intervalMs;
  }

  get last(): Topology | undefined {
    return this.#last;
  }

  start(): void {
    this.#loop.start((signal) => this.#run(signal));
  }

  async stop(): Promise<void> {
    await this.#loop.stop();
  }

  async poll(): Promise<void> {
    const topology = await this.#read().catch(() => undefined);
    if (!topology) return;
    const previous = this.#last;
    this.#last = topology;
    if (
      previous &&
      previous.epoch === topology.epoch &&
      previous.primary_node_id === topology.primary_node_id &&
      previous.status === topology.status
    ) {
      return;
    }
    const value: EpochValue = {
      epoch: topology.epoch,
      primary: topology.primary_node_id,
      status: topology.status,
      ...(previous ? { previousEpoch: previous.epoch, previousPrimary: previous.primary_node_id } : {}),
      ...cooldownFor(topology.cooldown_until, Date.now()),
    };
    this.#history.append({
      process: "observer",
      type: "info",
      f: "epoch",
      value,
      node: topology.primary_node_id,
    });
  }

  async #run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      await this.poll();
      await sleep(this.#intervalMs, undefined, { signal }).catch(() => {});
    }
  }
}

/** `ROLE` of each live node now, within `timeoutMs`; undefined for a node that did not answer. */
export async function readRoles(
  nodes: ReadonlyArray<{ node: RedisNode; alive: boolean }>,
  timeoutMs = 1000,
): Promise<Map<string, RoleRead | undefined>> {
  const byPort = new Map(nodes.map(({ node }) => [node.port, node.id]));
  const reads = await Promise.all(
    nodes.map(async ({ node, alive }): Promise<[string, RoleRead | undefined]> => {
      const client = alive ? redisClient(node.address, timeoutMs) : undefined;
      if (!client) return [node.id, undefined];
      try {
        await client.connect();
        const role = (await client.role()) as unknown[];
        if (role[0] === "master") return [node.id, { role: "master" }];
        return [
          node.id,
          { role: "slave", following: byPort.get(Number(role[2])), linkUp: role[3] === "connected" },
        ];
      } catch {
        return [node.id, undefined];
      } finally {
        client.disconnect();
      }
    }),
  );
  return new Map(reads);
}

/**
 * The final reads: per node its role, whom it follows, its link, and which of the writer's keys it
 * holds. A node that is down or does not answer is `reachable: false`.
 */
export async function readFinal(
  nodes: ReadonlyArray<{ node: RedisNode; alive: boolean }>,
  seqOf: (key: string) => number | undefined,
  keyPattern: string,
  topology: Topology | undefined,
): Promise<FinalRead> {
  const byPort = new Map(nodes.map(({ node }) => [node.port, node.id]));
  const reads = await Promise.all(
    nodes.map(async ({ node, alive }): Promise<FinalNodeRead> => {
      if (!alive) return { node: node.id, reachable: false };
      const client = redisClient(node.address, 5000);
      if (!client) return { node: node.id, reachable: false, error: `not an address: ${node.address}` };
      try {
        await client.connect();
        const role = (await client.role()) as unknown[];
        const keys = await client.keys(keyPattern);
        const seqs = keys.map(seqOf).filter((seq): seq is number => seq !== undefined);
        if (role[0] === "master") return { node: node.id, reachable: true, role: "master", seqs };
        return {
          node: node.id,
          reachable: true,
          role: "slave",
          following: byPort.get(Number(role[2])) ?? `${String(role[1])}:${String(role[2])}`,
          linkUp: role[3] === "connected",
          seqs,
        };
      } catch (error) {
        return { node: node.id, reachable: false, error: errorMessage(error) };
      } finally {
        client.disconnect();
      }
    }),
  );
  return { nodes: reads, topologyPrimary: topology?.primary_node_id, topologyStatus: topology?.status };
}

export interface RereadOptions {
  /** Past this (from the call), no read is started again. @default 15000 */
  readonly deadlineMs?: number;
  /** Pause before each round of re-reads. @default 2000 */
  readonly intervalMs?: number;
  readonly log?: (line: string) => void;
  readonly signal?: AbortSignal;
}

/**
 * Reads again, every `intervalMs` until `deadlineMs` has passed, the live nodes whose read in
 * `final` failed, and puts each successful read in their place: a node may stall for a moment
 * (an overloaded host, a resync's `-LOADING` to KEYS) and a failed read must not be judged as the
 * node's state (nemesis seed 7336: the settled primary read as unreachable, "0 primaries"). A node
 * still unreadable keeps its last error. Bounded: no read starts after the deadline, so the whole
 * takes at most `deadlineMs` plus one read's own timeouts.
 */
export async function rereadUnreadable<N extends { node: { id: string }; alive: boolean }>(
  final: FinalRead,
  nodes: readonly N[],
  read: (nodes: readonly N[]) => Promise<FinalRead>,
  options: RereadOptions = {},
): Promise<FinalRead> {
  const { deadlineMs = 15_000, intervalMs = 2000, log = () => {}, signal } = options;
  const deadline = performance.now() + deadlineMs;
  const unreadable = (current: FinalRead) =>
    nodes.filter(({ node, alive }) => alive && current.nodes.some((n) => n.node === node.id && !n.reachable));
  let current = final;
  const reread = new Set<string>();
  for (let pending = unreadable(current); pending.length > 0; pending = unreadable(current)) {
    const left = deadline - performance.now();
    if (left <= 0 || signal?.aborted) break;
    await sleep(Math.min(intervalMs, left), undefined, { signal }).catch(() => {});
    if (signal?.aborted) break;
    for (const { node } of pending) reread.add(node.id);
    const again = new Map((await read(pending)).nodes.map((n) => [n.node, n]));
    current = { ...current, nodes: current.nodes.map((n) => (n.reachable ? n : (again.get(n.node) ?? n))) };
  }
  if (reread.size > 0) {
    const still = current.nodes.filter((n) => reread.has(n.node) && !n.reachable);
    log(
      `final read: read again ${[...reread].join(", ")}` +
        (still.length === 0
          ? ", all read"
          : `; still unreadable: ${still.map((n) => `${n.node} (${n.error ?? "no error"})`).join(", ")}`),
    );
  }
  return current;
}

/** `readFinal` of `nodes`, then `rereadUnreadable` of the live ones whose read failed. */
export async function readFinalWithRereads(
  nodes: ReadonlyArray<{ node: RedisNode; alive: boolean }>,
  seqOf: (key: string) => number | undefined,
  keyPattern: string,
  topology: Topology | undefined,
  options: RereadOptions = {},
): Promise<FinalRead> {
  const read = (some: ReadonlyArray<{ node: RedisNode; alive: boolean }>) =>
    readFinal(some, seqOf, keyPattern, topology);
  return rereadUnreadable(await read(nodes), nodes, read, options);
}
