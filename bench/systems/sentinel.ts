import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Redis } from "ioredis";
import { errorMessage, ShardguardError } from "../../src/core/errors.ts";
import {
  freePort,
  type ManagedProcess,
  requireCommand,
  startProcess,
  waitUntilReady,
} from "../../src/dev/local-stack/processes.ts";
import { type RedisNode, startRedisNodes } from "../../src/dev/local-stack/redis-nodes.ts";
import { waitForReplicasInSync } from "../../src/dev/workload/replication.ts";
import type { SentinelClientTarget } from "../lib/sentinel-client-workload.ts";
import type { FailoverSystem, Fault, KillResult, SystemConfig } from "./types.ts";

const MASTER_NAME = "mymaster";

export interface SentinelOptions {
  /** Sentinel processes. @default 3 */
  readonly sentinels?: number;
  /** Sentinels that must agree the primary is down. @default 2 */
  readonly quorum?: number;
  /**
   * Sentinel's failover-timeout: bounds replica reconfiguration, and a failed election is retried
   * only after twice this. Sentinel's own default is 180 s; 10 s is a common production choice.
   * @default 10000
   */
  readonly failoverTimeoutMs?: number;
  /** How long resetTrial and setup wait for every sentinel to see a healthy shard. @default 60000 */
  readonly settleTimeoutMs?: number;
}

interface SentinelProcess {
  readonly port: number;
  readonly proc: ManagedProcess;
  /** Commands: SENTINEL get-master-addr-by-name and friends. */
  readonly client: Redis;
  /** Pub/sub: Sentinel publishes each event (+sdown, +odown, ...) on a channel named after it. */
  readonly subscriber: Redis;
}

/**
 * Sentinel events that mark the end of each failover phase, in order. A phase's duration runs
 * from the previous mark (the kill for the first) to the first time any sentinel published its event.
 */
const PHASE_EVENTS = [
  ["detection", "+sdown"],
  ["agreement", "+odown"],
  ["election", "+elected-leader"],
  ["promote", "+promoted-slave"],
  ["switch", "+switch-master"],
] as const;

/** The shard's state did not settle as the benchmark expects; says what every sentinel sees. */
export class SentinelNotSettled extends ShardguardError {
  override name = "SentinelNotSettled";
}

/**
 * Redis Sentinel as shipped (Debian redis-sentinel): 3 sentinels with quorum 2 watching one primary
 * and two replicas, `down-after-milliseconds` = the benchmark's failure timeout. The writer finds the
 * primary the way Sentinel clients do, by asking sentinels for `get-master-addr-by-name`.
 */
export class SentinelSystem implements FailoverSystem {
  readonly name = "sentinel";
  readonly #options: Required<SentinelOptions>;
  #log: (line: string) => void = () => {};
  #nodes: RedisNode[] = [];
  #sentinels: SentinelProcess[] = [];
  #dir: string | undefined;
  #killed: RedisNode | undefined;
  /** The last trial was a SENTINEL FAILOVER: its old primary runs on. */
  #switchedOver = false;
  /** Event channel -> first instant (performance.now()) any sentinel published it for the master since the last kill. */
  #events = new Map<string, number>();

  constructor(options: SentinelOptions = {}) {
    this.#options = {
      sentinels: options.sentinels ?? 3,
      quorum: options.quorum ?? 2,
      failoverTimeoutMs: options.failoverTimeoutMs ?? 10_000,
      settleTimeoutMs: options.settleTimeoutMs ?? 60_000,
    };
  }

  async setup(config: SystemConfig): Promise<void> {
    this.#log = config.log;
    requireCommand("redis-sentinel", ["--version"], "install it with: apt-get install -y redis-sentinel");
    this.#nodes = await startRedisNodes(config.nodeCount);
    const primary = this.#nodes[0]?.address;
    if (!primary) throw new SentinelNotSettled("no redis-server node started");
    this.#dir = mkdtempSync(join(tmpdir(), "shardguard-sentinel-"));
    for (let index = 0; index < this.#options.sentinels; index++) {
      this.#sentinels.push(await this.#startSentinel(index, primary, config.failureTimeoutMs));
    }
    this.#log(`sentinel: ${this.#sentinels.length} sentinels up, waiting until they see the whole shard`);
    await this.#waitUntilSettled();
  }

  /**
   * Sentinels learn of a switch a few ms apart; the one with the highest config epoch has the
   * newest view, so its answer is what Sentinel as a whole advertises (no flip-flop between views).
   */
  async primaryAddress(): Promise<string | undefined> {
    const views = await Promise.all(
      this.#sentinels.map(async (sentinel) => {
        try {
          const [address, master] = await Promise.all([
            this.#masterAddressOf(sentinel),
            sentinel.client.call("SENTINEL", "master", MASTER_NAME) as Promise<string[]>,
          ]);
          return address ? { address, epoch: Number(pairs(master).get("config-epoch") ?? 0) } : undefined;
        } catch {
          return undefined;
        }
      }),
    );
    let newest: { address: string; epoch: number } | undefined;
    for (const view of views) if (view && (!newest || view.epoch > newest.epoch)) newest = view;
    return newest?.address;
  }

  /**
   * A Sentinel client's lookup: `get-master-addr-by-name` from the next sentinel in turn, moving
   * on when one does not answer. Asking in turn, rather than always the first, keeps a client from
   * waiting on one sentinel that has not heard of the switch yet; each resolver has its own turn.
   */
  createResolver(): () => Promise<string | undefined> {
    let turn = 0;
    return async () => {
      for (let asked = 0; asked < this.#sentinels.length; asked++) {
        const sentinel = this.#sentinels[turn++ % this.#sentinels.length];
        if (!sentinel) continue;
        try {
          return await this.#masterAddressOf(sentinel);
        } catch {
          // An unreachable sentinel: a client asks the next one.
        }
      }
      return undefined;
    };
  }

  nodes(): readonly RedisNode[] {
    return this.#nodes;
  }

  sentinelClient(): SentinelClientTarget {
    return {
      sentinels: this.#sentinels.map((sentinel) => ({ host: "127.0.0.1", port: sentinel.port })),
      name: MASTER_NAME,
    };
  }

  async killPrimary(fault: Fault): Promise<KillResult> {
    const oldPrimary = await this.#agreedPrimary();
    const node = this.#nodes.find((candidate) => candidate.address === oldPrimary);
    if (!node?.running)
      throw new SentinelNotSettled(`advertised primary ${oldPrimary} is not a running node`);
    this.#events.clear();
    this.#killed = node;
    const killedAt = performance.now();
    if (fault === "switchover") {
      // Sentinel's planned failover: one sentinel starts it at once (no agreement on a failure needed).
      const sentinel = this.#sentinels[0];
      if (!sentinel) throw new SentinelNotSettled("no sentinel to ask for SENTINEL FAILOVER");
      await sentinel.client.call("SENTINEL", "FAILOVER", MASTER_NAME);
      this.#switchedOver = true;
      return { killedAt, oldPrimary };
    }
    node.signal(fault === "hang" ? "SIGSTOP" : "SIGKILL");
    return { killedAt, oldPrimary };
  }

  async phaseTimings(kill: KillResult): Promise<Record<string, number> | undefined> {
    const phases: Record<string, number> = {};
    let previous = kill.killedAt;
    for (const [phase, event] of PHASE_EVENTS) {
      const at = this.#events.get(event);
      if (at === undefined) break;
      phases[phase] = Math.max(0, at - previous);
      previous = Math.max(previous, at);
    }
    return Object.keys(phases).length > 0 ? phases : undefined;
  }

  async resetTrial(): Promise<void> {
    const killed = this.#killed;
    if (!killed) return;
    const newPrimary = await this.#waitForAgreedPrimary((address) => address !== killed.address);
    if (this.#switchedOver) {
      // Nothing failed: the old primary is already a replica of the new one.
      this.#switchedOver = false;
      this.#killed = undefined;
      await this.#waitUntilSettled();
      return;
    }
    this.#log(`sentinel: restarting ${killed.address} as a replica of ${newPrimary}`);
    // A hung node is killed first (stop() sends SIGCONT only to a process still alive).
    killed.signal("SIGKILL");
    await killed.stop();
    await killed.start({ replicaOf: newPrimary });
    this.#killed = undefined;
    const settled = await this.#waitUntilSettled();
    if (settled !== newPrimary) this.#log(`sentinel: primary moved on to ${settled} during the reset`);
  }

  async teardown(): Promise<void> {
    for (const sentinel of this.#sentinels) {
      sentinel.client.disconnect();
      sentinel.subscriber.disconnect();
    }
    await Promise.all(this.#sentinels.map((sentinel) => sentinel.proc.stop(2000)));
    this.#sentinels = [];
    await Promise.all(this.#nodes.map((node) => node.destroy()));
    this.#nodes = [];
    if (this.#dir) rmSync(this.#dir, { recursive: true, force: true });
    this.#dir = undefined;
  }

  async #startSentinel(index: number, primary: string, failureTimeoutMs: number): Promise<SentinelProcess> {
    const dir = this.#dir as string;
    const port = await freePort();
    const [host, primaryPort] = primary.split(":");
    const file = join(dir, `sentinel-${index + 1}.conf`);
    // Sentinel rewrites this file as its state changes, so it lives in a writable temp dir.
    writeFileSync(
      file,
      [
        `port ${port}`,
        "bind 127.0.0.1",
        "protected-mode no",
        "daemonize no",
        `dir ${dir}`,
        `logfile ${join(dir, `sentinel-${index + 1}.log`)}`,
        "loglevel warning",
        "sentinel resolve-hostnames no",
        `sentinel monitor ${MASTER_NAME} ${host} ${primaryPort} ${this.#options.quorum}`,
        `sentinel down-after-milliseconds ${MASTER_NAME} ${failureTimeoutMs}`,
        `sentinel failover-timeout ${MASTER_NAME} ${this.#options.failoverTimeoutMs}`,
        `sentinel parallel-syncs ${MASTER_NAME} 1`,
        "",
      ].join("\n"),
    );
    const proc = startProcess(`redis-sentinel :${port}`, "redis-sentinel", [file]);
    const client = new Redis(port, "127.0.0.1", {
      lazyConnect: true,
      maxRetriesPerRequest: 0,
      commandTimeout: 250,
      connectTimeout: 250,
      retryStrategy: () => 50,
    });
    client.on("error", () => {});
    await waitUntilReady(
      proc,
      async () => {
        if (client.status === "wait" || client.status === "end") await client.connect();
        return client.ping();
      },
      10_000,
      `port ${port}; is the port taken?`,
    );
    const subscriber = new Redis(port, "127.0.0.1", { retryStrategy: () => 50 });
    subscriber.on("error", () => {});
    subscriber.on("pmessage", (_pattern: string, channel: string, message: string) => {
      if (!PHASE_EVENTS.some(([, event]) => event === channel) || this.#events.has(channel)) return;
      // +sdown and +odown also fire for replicas and sentinels; only the master's count here.
      if ((channel === "+sdown" || channel === "+odown") && !message.startsWith(`master ${MASTER_NAME} `))
        return;
      this.#events.set(channel, performance.now());
    });
    await subscriber.psubscribe("+*");
    return { port, proc, client, subscriber };
  }

  async #masterAddressOf(sentinel: SentinelProcess): Promise<string | undefined> {
    const reply = (await sentinel.client.call("SENTINEL", "get-master-addr-by-name", MASTER_NAME)) as
      | [string, string]
      | null;
    return reply ? `${reply[0]}:${reply[1]}` : undefined;
  }

  /** The primary every sentinel reports; throws when they disagree. */
  async #agreedPrimary(): Promise<string> {
    const answers = await Promise.all(this.#sentinels.map((sentinel) => this.#masterAddressOf(sentinel)));
    const first = answers[0];
    if (!first || answers.some((answer) => answer !== first)) {
      throw new SentinelNotSettled(`sentinels disagree on the primary: ${answers.join(", ")}`);
    }
    return first;
  }

  async #waitForAgreedPrimary(accept: (address: string) => boolean): Promise<string> {
    const deadline = performance.now() + this.#options.settleTimeoutMs;
    let last = "";
    while (performance.now() < deadline) {
      try {
        const address = await this.#agreedPrimary();
        if (accept(address)) return address;
        last = `all still report ${address}`;
      } catch (error) {
        last = errorMessage(error);
      }
      await sleep(50);
    }
    throw new SentinelNotSettled(`no new primary agreed within ${this.#options.settleTimeoutMs} ms: ${last}`);
  }

  /**
   * Waits until all sentinels agree on one primary and each reports it as a plain master (no
   * failover in progress, not down), knows the other sentinels, and lists every replica as healthy
   * with its link to that primary up, and the replicas have caught up with it: only then would each
   * sentinel consider every replica for the next failover. Follows the primary if Sentinel fails
   * over again meanwhile (the driver reports that as a failover nobody caused); returns it.
   */
  async #waitUntilSettled(): Promise<string> {
    const replicas = this.#nodes.length - 1;
    const otherSentinels = this.#sentinels.length - 1;
    const deadline = performance.now() + this.#options.settleTimeoutMs;
    let problems: string[] = [];
    while (performance.now() < deadline) {
      problems = [];
      let primary: string | undefined;
      try {
        primary = await this.#agreedPrimary();
        for (const sentinel of this.#sentinels) {
          problems.push(...(await this.#problemsSeenBy(sentinel, primary, replicas, otherSentinels)));
        }
        if (problems.length === 0) {
          await this.#waitForReplicasOf(primary);
          return primary;
        }
      } catch (error) {
        problems.push(errorMessage(error));
      }
      await sleep(100);
    }
    throw new SentinelNotSettled(
      `sentinels did not settle within ${this.#options.settleTimeoutMs} ms: ${problems.join("; ")}; ` +
        `recent sentinel events: ${this.#recentEvents().join(" | ")}`,
    );
  }

  async #waitForReplicasOf(primary: string): Promise<void> {
    const primaryNode = this.#nodes.find((node) => node.address === primary);
    if (!primaryNode) throw new SentinelNotSettled(`primary ${primary} is not one of the nodes`);
    const primaryClient = primaryNode.client({ maxRetriesPerRequest: 1 });
    const replicaClients = this.#nodes
      .filter((node) => node !== primaryNode)
      .map((node) => node.client({ maxRetriesPerRequest: 1 }));
    try {
      await waitForReplicasInSync(primaryClient, primary, replicaClients, { timeoutMs: 5000 });
    } finally {
      primaryClient.disconnect();
      for (const client of replicaClients) client.disconnect();
    }
  }

  /** The last lines of every sentinel's log, for an error that must say what Sentinel did. */
  #recentEvents(lines = 6): string[] {
    const dir = this.#dir;
    if (!dir) return [];
    return this.#sentinels.map((sentinel, index) => {
      const file = join(dir, `sentinel-${index + 1}.log`);
      const tail = existsSync(file) ? readFileSync(file, "utf8").trim().split("\n").slice(-lines) : [];
      return `:${sentinel.port} ${tail.join(" / ")}`;
    });
  }

  async #problemsSeenBy(
    sentinel: SentinelProcess,
    primary: string,
    replicas: number,
    otherSentinels: number,
  ): Promise<string[]> {
    const who = `sentinel :${sentinel.port}`;
    const address = await this.#masterAddressOf(sentinel);
    if (address !== primary) return [`${who} reports primary ${address}`];
    const master = pairs((await sentinel.client.call("SENTINEL", "master", MASTER_NAME)) as string[]);
    const problems: string[] = [];
    if (master.get("flags") !== "master") problems.push(`${who} master flags ${master.get("flags")}`);
    if (Number(master.get("num-other-sentinels")) !== otherSentinels) {
      problems.push(`${who} knows ${master.get("num-other-sentinels")} other sentinels`);
    }
    const listed = ((await sentinel.client.call("SENTINEL", "replicas", MASTER_NAME)) as string[][]).map(
      pairs,
    );
    const healthy = listed.filter(
      (replica) =>
        replica.get("flags") === "slave" &&
        replica.get("master-link-status") === "ok" &&
        `${replica.get("master-host")}:${replica.get("master-port")}` === primary,
    );
    if (healthy.length < replicas) {
      const seen = listed.map(
        (r) => `${r.get("name")} ${r.get("flags")} link ${r.get("master-link-status")}`,
      );
      problems.push(`${who} sees ${healthy.length}/${replicas} healthy replicas (${seen.join(", ")})`);
    }
    return problems;
  }
}

/** SENTINEL MASTER / REPLICAS answer flat [field, value, field, value...] arrays. */
function pairs(flat: readonly string[]): Map<string, string> {
  const map = new Map<string, string>();
  for (let index = 0; index + 1 < flat.length; index += 2)
    map.set(String(flat[index]), String(flat[index + 1]));
  return map;
}
