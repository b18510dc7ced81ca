import { type Channel, machineOf, Network } from "./network.ts";
import type { Scheduler } from "./scheduler.ts";

/**
 * A model of one redis-server (7.x) as its clients and replicas observe it: role, replication ids
 * and offsets (kept across promotion, `replid2`/`second_repl_offset` on a switch), a backlog that
 * decides partial against full resync, a full sync that replaces the dataset, the once-a-second
 * replication cron (replicas' `REPLCONF ACK`, `min-replicas-to-write` good-replica count on the
 * node's own wall clock), `WAIT` counting acknowledgements, `CLIENT PAUSE WRITE`, restarts (empty,
 * from an RDB of a given age, with `replicaof` in its config). An RDB carries the replication id and
 * offset only when Redis 7's `rdbPopulateSaveInfo` puts them in: a master with a backlog, a replica
 * with a master or a cached master. Its process is a scheduler host:
 * paused (SIGSTOP), commands wait in its socket and run when it resumes; killed, they are lost.
 *
 * Not modelled: RESP framing, keys other than the workload's strings, AOF, diskless sync details,
 * client output buffers, `repl-diskless-sync-delay` (a full sync takes `FULL_SYNC_MS` plus a size term).
 */

export const REDIS_PORT = 6379;
/** Bytes a workload write adds to the replication stream. */
const ENTRY_BYTES = 48;
const FULL_SYNC_MS = 40;
/** Redis's repl-timeout (s): a silent link is dropped after this. */
const REPL_TIMEOUT_MS = 60_000;
/** repl-ping-replica-period (s). */
const PING_MS = 10_000;
/** A handshake that gets no answer is abandoned after this (connect + PSYNC). */
const HANDSHAKE_TIMEOUT_MS = 5_000;
/** The replication cron's period (Redis runs replicationCron once a second). */
const CRON_MS = 1000;
const ZERO_ID = "0".repeat(40);

export type Reply = string | number | string[] | { readonly error: string };

export interface Entry {
  readonly start: number;
  readonly end: number;
  readonly key: string;
  readonly value: string;
}

interface ReplicaLink {
  readonly id: number;
  readonly address: string;
  readonly host: () => string;
  readonly down: Channel;
  ackOffset: number;
  ackAtSec: number;
  online: boolean;
  readonly replica: RedisServer;
  deliver: (fn: (replica: RedisServer) => void) => void;
}

interface MasterLink {
  readonly id: number;
  readonly master: RedisServer;
  readonly up: Channel;
  readonly down: Channel;
  state: "handshake" | "sync" | "connected";
  startedAt: number;
}

/**
 * An RDB: the dataset as of the save is the first `size` entries of `source`. A save does not
 * copy the dataset (thousands of keys, every few seconds: issue 32): the live map only ever gains
 * new keys at its end, and before anything else would change it (a key written again) the server
 * copies the saved part out (`#detachRdb`); a map the server replaces is never changed again.
 */
interface Rdb {
  source: Map<string, string>;
  size: number;
  /**
   * The `repl-id`/`repl-offset` aux fields: Redis 7.0 writes them only when `rdbPopulateSaveInfo`
   * answers, for a master with a replication backlog or a replica with a master or a cached master
   * (measured on redis-server 7.0.15: an empty master that never had a replica saves none, and a
   * restart from its RDB has a new id, no `master_replid2`, offset 0).
   */
  readonly repl: { readonly replid: string; readonly offset: number } | undefined;
  readonly at: number;
}

export type RestartMode = "empty" | "rdb" | "replicaof";

/** redis.conf as docs/deploy.md recommends it: every process starts refusing writes until its agent opens it. */
export const RECOMMENDED_CONFIG: ReadonlyMap<string, string> = new Map([
  ["min-replicas-to-write", "1000000"],
  ["min-replicas-max-lag", "2"],
]);

export interface ServerOptions {
  readonly machine: string;
  /** @default RECOMMENDED_CONFIG */
  readonly configFile?: ReadonlyMap<string, string>;
  /** Replication backlog in bytes (repl-backlog-size). */
  readonly backlogBytes: number;
}

/** Every server, by machine; resolves an address as seen from a machine. */
export class RedisCluster {
  readonly servers = new Map<string, RedisServer>();
  readonly sched: Scheduler;
  readonly net: Network;
  /** Host wall-clock offset per machine (ms), for each server's own clock. */
  readonly clockOffset = new Map<string, number>();
  /** Open client connections: each hears of a server's death (src/dev/sim/redis-client.ts). */
  readonly connections = new Set<{ serverDied(server: RedisServer): void }>();
  /** Broken model invariants (a bug in the simulator, not in Shardguard): a run with any is void. */
  readonly modelErrors: string[] = [];
  #ids = 0;

  constructor(sched: Scheduler, net: Network) {
    this.sched = sched;
    this.net = net;
  }

  nextId(): number {
    return ++this.#ids;
  }

  /** The server `address` names from `machine`: 127.0.0.1/localhost is the machine's own. */
  resolve(fromMachine: string, address: string): RedisServer | undefined {
    const colon = address.lastIndexOf(":");
    const host = address.slice(0, colon);
    const port = Number(address.slice(colon + 1));
    if (port !== REDIS_PORT) return undefined;
    const machine = host === "127.0.0.1" || host === "localhost" ? fromMachine : host;
    return this.servers.get(machine);
  }

  wallNow(machine: string): number {
    return this.sched.now + (this.clockOffset.get(machine) ?? 0);
  }

  newReplid(): string {
    return Array.from({ length: 40 }, () => this.sched.random.int(0, 15).toString(16)).join("");
  }
}

export class RedisServer {
  readonly cluster: RedisCluster;
  readonly machine: string;
  readonly address: string;
  readonly backlogBytes: number;
  /** Scheduler host of the running process (a new incarnation per start). */
  host: string;
  incarnation = 0;
  up = true;
  runId = "";
  role: "master" | "slave" = "master";
  replid = "";
  replid2 = ZERO_ID;
  secondOffset = -1;
  offset = 0;
  data = new Map<string, string>();
  log: Entry[] = [];
  backlogStart = 1;
  /**
   * Whether the process has a replication backlog (`server.repl_backlog`): created when the first
   * replica attaches to a master (syncCommand), when a replica syncs or continues, and on loading an
   * RDB with replication info as a master (Redis 7 loadDataFromDisk); kept by a promoted replica
   * (shiftReplicationId). A master started empty, or from an RDB without replication info, has none
   * until a replica attaches. Not modelled: what Redis does without one (its offset does not advance
   * on writes; the first replica to attach gets a new replid, replid2 cleared, and always a full
   * sync), and freeing it after `repl-backlog-ttl` (3600 s) without replicas.
   */
  backlog = false;
  /**
   * A replica's cached master (`server.cached_master`): synthesized from its own id and offset when a
   * master turns replica (replicationCacheMasterUsingMyself), or when it loads an RDB with replication
   * info as a replica; kept when a connected link drops; discarded by a full sync and by `REPLICAOF NO
   * ONE`. With it (or a connected link) a replica's RDB carries its replication id and offset.
   */
  cachedMaster = false;
  readonly config: Map<string, string>;
  /** Settings of its config file (redis.conf), in force at every start. */
  readonly configFile: ReadonlyMap<string, string>;
  /** `replicaof` in the config file: where the process replicates from when it starts. */
  configReplicaof: string | undefined;
  masterAddress: string | undefined;
  link: MasterLink | undefined;
  lastIoAt = 0;
  readonly replicas = new Map<number, ReplicaLink>();
  goodReplicas = 0;
  pausedUntil = 0;
  readonly #pausedWrites: Array<() => void> = [];
  readonly clientNames = new Map<number, string>();
  rdb: Rdb | undefined;
  /** INFO stats: full syncs served and partial resyncs accepted since the process started. */
  syncFull = 0;
  syncPartialOk = 0;
  /** PSYNCs refused with -NOMASTERLINK (a replica not connected to its master) since the process started. */
  syncRefused = 0;
  /** Called on every process start and death: connections to it close. */
  onLifecycle: (event: "start" | "death") => void = () => {};
  #pauseTimer: ReturnType<Scheduler["schedule"]> | undefined;

  constructor(cluster: RedisCluster, options: ServerOptions) {
    this.cluster = cluster;
    this.machine = options.machine;
    this.address = `${options.machine}:${REDIS_PORT}`;
    this.backlogBytes = options.backlogBytes;
    this.configFile = options.configFile ?? RECOMMENDED_CONFIG;
    this.config = new Map(this.configFile);
    this.host = `${options.machine}/redis#0`;
    this.replid = cluster.newReplid();
    cluster.servers.set(options.machine, this);
    this.#start();
  }

  get sched(): Scheduler {
    return this.cluster.sched;
  }

  /** This node's wall clock, whole seconds (Redis's `server.unixtime`). */
  get unixtime(): number {
    return Math.floor(this.cluster.wallNow(this.machine) / 1000);
  }

  #start(): void {
    this.incarnation++;
    this.host = `${this.machine}/redis#${this.incarnation}`;
    this.up = true;
    this.runId = this.cluster.newReplid();
    this.syncFull = 0;
    this.syncPartialOk = 0;
    this.syncRefused = 0;
    this.sched.schedule(CRON_MS * this.sched.random.next(), () => this.#cronLoop(), this.host);
    this.onLifecycle("start");
  }

  #cronLoop(): void {
    this.sched.schedule(CRON_MS, () => this.#cronLoop());
    this.cron();
  }

  /** The replication cron, once a second on the node's process. */
  cron(): void {
    const now = this.sched.now;
    if (this.masterAddress !== undefined) {
      if (this.link === undefined) this.#connectToMaster();
      else if (this.link.state !== "connected" && now - this.link.startedAt > HANDSHAKE_TIMEOUT_MS)
        this.#dropMasterLink();
      else if (this.link.state === "connected") {
        if (now - this.lastIoAt > REPL_TIMEOUT_MS) this.#dropMasterLink();
        else this.#sendAck();
      }
    }
    for (const replica of [...this.replicas.values()]) {
      if (replica.online && this.unixtime - replica.ackAtSec > REPL_TIMEOUT_MS / 1000)
        this.removeReplica(replica.id);
    }
    // Only a top-level master pings (replicationFeedSlaves returns at once on a replica): a replica
    // of a replica hears the PINGs its master proxies from upstream (#heard), so nothing while the
    // top master is silent, and its link drops after repl-timeout (conformance "a chained replica
    // hears nothing while the top master is silent").
    const pingMs = Number(this.config.get("repl-ping-replica-period") ?? PING_MS / 1000) * 1000;
    if (
      this.masterAddress === undefined &&
      this.replicas.size > 0 &&
      this.sched.random.next() < CRON_MS / pingMs
    )
      this.#ping();
    this.refreshGoodReplicas();
    this.#trimBacklog();
  }

  refreshGoodReplicas(): void {
    this.goodReplicas = this.#countGoodReplicas();
    this.#cronAt = this.sched.now;
  }

  #countGoodReplicas(): number {
    const maxLag = Number(this.config.get("min-replicas-max-lag") ?? 10);
    let good = 0;
    for (const replica of this.replicas.values()) {
      if (replica.online && this.unixtime - replica.ackAtSec <= maxLag) good++;
    }
    return good;
  }

  /** When the cron last counted the good replicas (virtual ms). */
  #cronAt = 0;

  // ---- process lifecycle -------------------------------------------------------------------

  /** SIGKILL: the process and every connection to it are gone. */
  crash(): void {
    if (!this.up) return;
    this.up = false;
    this.sched.kill(this.host);
    this.#dropMasterLink();
    // The kernel closes the dead process's sockets: each replica hears the FIN and its link goes
    // down at once (conformance "a replica's link goes down at once when its master is killed";
    // the model kept it up until repl-timeout, 60 s, and an agent probing in between took the
    // master's next process for the one it was linked to: simulator seed 7044 of sim:mutants'
    // restarted-primary-open schedule, unpatched).
    this.#disconnectSubReplicas();
    this.clientNames.clear();
    this.#pausedWrites.length = 0;
    this.pausedUntil = 0;
    for (const connection of [...this.cluster.connections]) connection.serverDied(this);
    this.onLifecycle("death");
  }

  /** Starts the process again: empty, from its last RDB, or with `replicaof` from its config file. */
  restart(mode: RestartMode, replicaof?: string): void {
    if (this.up) this.crash();
    this.config.clear();
    for (const [key, value] of this.configFile) this.config.set(key, value);
    this.role = "master";
    this.masterAddress = undefined;
    this.replid2 = ZERO_ID;
    this.secondOffset = -1;
    this.log = [];
    this.backlog = false;
    this.cachedMaster = false;
    const repl = mode === "empty" ? undefined : this.rdb?.repl;
    if (mode === "empty" || this.rdb === undefined) {
      this.data = new Map();
      this.replid = this.cluster.newReplid();
      this.offset = 0;
    } else {
      this.data = rdbData(this.rdb);
      if (repl === undefined) {
        // An RDB without replication info: the id drawn at start, offset 0, no replid2; a master
        // drops the backlog it created for the load (Redis 7 loadDataFromDisk).
        this.replid = this.cluster.newReplid();
        this.offset = 0;
      } else if (mode === "replicaof") {
        // A replica keeps the RDB's replication id and offset (its cached master: it may continue).
        this.replid = repl.replid;
        this.offset = repl.offset;
        this.cachedMaster = true;
      } else {
        // A master takes a new id; the RDB's becomes its second, continuable up to the RDB's offset,
        // and it keeps the backlog created for the load (Redis 7 loadDataFromDisk).
        this.replid = this.cluster.newReplid();
        this.offset = repl.offset;
        this.replid2 = repl.replid;
        this.secondOffset = repl.offset + 1;
        this.backlog = true;
      }
    }
    this.backlogStart = this.offset + 1;
    if (mode === "replicaof" && replicaof !== undefined) {
      this.role = "slave";
      this.masterAddress = replicaof;
    }
    this.#start();
  }

  /**
   * BGSAVE: the dataset as of now, with the replication id and offset when Redis 7.0's
   * `rdbPopulateSaveInfo` gives them: a master with a backlog, a replica with its master connected
   * or a cached master.
   */
  save(): void {
    if (!this.up) return;
    const carriesRepl =
      this.role === "master" ? this.backlog : this.link?.state === "connected" || this.cachedMaster;
    this.rdb = {
      source: this.data,
      size: this.data.size,
      repl: carriesRepl ? { replid: this.replid, offset: this.offset } : undefined,
      at: this.sched.now,
    };
  }

  /** Before `key` is written: a key written again in the map the RDB shares gets the RDB its own copy. */
  #detachRdb(key: string): void {
    const rdb = this.rdb;
    if (rdb === undefined || rdb.source !== this.data || !this.data.has(key)) return;
    rdb.source = rdbData(rdb);
  }

  // ---- replication, master side ------------------------------------------------------------

  #trimBacklog(): void {
    // `CONFIG SET repl-backlog-size` resizes the backlog, never below 16 KB (Redis 7.0
    // resizeReplicationBacklog, CONFIG_REPL_BACKLOG_MIN_SIZE); the constructor's size otherwise.
    // Conformance "a replica away past the backlog resyncs fully": the model kept its 1 MB and let
    // a replica continue after 2,000 writes past a 16 KB backlog, which redis-server syncs fully.
    const configured = Number(this.config.get("repl-backlog-size"));
    const size = Number.isFinite(configured) ? Math.max(16 * 1024, configured) : this.backlogBytes;
    while (this.log.length > 0 && this.offset - (this.log[0] as Entry).end > size) this.log.shift();
    this.backlogStart = this.log.length > 0 ? (this.log[0] as Entry).start : this.offset + 1;
  }

  #canContinue(replid: string, psyncOffset: number): boolean {
    const sameHistory =
      replid === this.replid || (replid === this.replid2 && psyncOffset <= this.secondOffset);
    if (!sameHistory) return false;
    if (psyncOffset > this.offset + 1) return false;
    return psyncOffset >= this.backlogStart || psyncOffset === this.offset + 1;
  }

  /** A replica's PSYNC arrived (runs on this process). */
  psync(replica: RedisServer, linkId: number, replid: string, psyncOffset: number, down: Channel): void {
    // Redis's syncCommand: a replica not connected to its own master answers "-NOMASTERLINK Can't
    // SYNC while not connected with my master"; the caller keeps its replid and retries from its
    // cron (here: its handshake times out). Simulator seed 7008: a parked replica let a sub-replica
    // continue onto its lineage, a state real Redis never reaches.
    if (this.role === "slave" && this.link?.state !== "connected") {
      this.syncRefused++;
      return;
    }
    const link: ReplicaLink = {
      id: linkId,
      address: replica.address,
      host: () => replica.host,
      down,
      ackOffset: psyncOffset - 1,
      ackAtSec: this.unixtime,
      online: false,
      replica,
      deliver: (fn) => this.cluster.net.send(down, this.host, replica.host, () => fn(replica)),
    };
    this.replicas.set(linkId, link);
    // A replica attached: the process has a backlog from now on (syncCommand creates it for the
    // first one; not modelled: the new replid and the full sync Redis gives that one).
    this.backlog = true;
    if (this.#canContinue(replid, psyncOffset)) {
      this.syncPartialOk++;
      const missed = this.log.filter((entry) => entry.start >= psyncOffset);
      const myReplid = this.replid;
      link.online = true;
      link.deliver((r) => r.continued(linkId, myReplid, missed));
    } else {
      this.syncFull++;
      // Nothing of this process's history acknowledged yet (the replica's offset is of its old data).
      link.ackOffset = 0;
      const snapshot = new Map(this.data);
      const replidNow = this.replid;
      const offsetNow = this.offset;
      const transferMs = FULL_SYNC_MS + snapshot.size * 0.002;
      down.lastAt = Math.max(down.lastAt, this.sched.now + transferMs);
      link.deliver((r) => r.fullSynced(linkId, replidNow, offsetNow, snapshot));
      // Online once the RDB is sent (state send_bulk until then: not a good replica).
      this.sched.schedule(transferMs, () => {
        link.online = true;
        this.refreshGoodReplicas();
      });
    }
    this.refreshGoodReplicas();
  }

  removeReplica(id: number): void {
    const replica = this.replicas.get(id);
    if (!replica) return;
    replica.down.closed = true;
    this.replicas.delete(id);
    this.refreshGoodReplicas();
  }

  ack(linkId: number, offset: number): void {
    const replica = this.replicas.get(linkId);
    if (!replica) return;
    replica.ackOffset = Math.max(replica.ackOffset, offset);
    replica.ackAtSec = this.unixtime;
    for (const waiter of [...this.#waiters]) waiter();
  }

  readonly #waiters = new Set<() => void>();

  #append(key: string, value: string): Entry {
    const entry = { start: this.offset + 1, end: this.offset + ENTRY_BYTES, key, value };
    this.offset = entry.end;
    this.#detachRdb(key);
    this.data.set(key, value);
    this.log.push(entry);
    for (const replica of this.replicas.values()) replica.deliver((r) => r.stream(replica.id, entry));
    return entry;
  }

  // ---- replication, replica side -----------------------------------------------------------

  #connectToMaster(): void {
    const address = this.masterAddress;
    if (address === undefined) return;
    const master = this.cluster.resolve(this.machine, address);
    const id = this.cluster.nextId();
    const up = Network.channel();
    const down = Network.channel();
    const link: MasterLink = {
      id,
      master: master as RedisServer,
      up,
      down,
      state: "handshake",
      startedAt: this.sched.now,
    };
    if (master === undefined || master === this) {
      // Nothing listens there (the parked address), or itself: the link stays down, retried by the cron.
      return;
    }
    this.link = link;
    const replid = this.replid;
    const psyncOffset = this.offset + 1;
    this.cluster.net.send(up, this.host, master.host, () => {
      if (!master.up) return;
      master.psync(this, id, replid, psyncOffset, down);
    });
  }

  #dropMasterLink(): void {
    const link = this.link;
    if (!link) return;
    link.up.closed = true;
    link.down.closed = true;
    this.link = undefined;
    // A connected master's client freed: Redis caches it (replicationCacheMaster) to PSYNC later.
    if (link.state === "connected") this.cachedMaster = true;
    const master = link.master;
    // The master hears the close (TCP's FIN, retransmitted through a cut until it heals); a replica
    // that died with its machine cut off is dropped by the master's repl-timeout instead.
    if (master)
      this.cluster.net.send(Network.channel(), `${this.machine}/kernel`, master.host, () =>
        master.removeReplica(link.id),
      );
  }

  /** A PING to every replica: it is part of the replication stream, so they proxy it on. */
  #ping(): void {
    for (const replica of this.replicas.values()) replica.deliver((r) => r.#heard(replica.id));
  }

  #heard(linkId: number): void {
    if (this.link?.id !== linkId) return;
    this.lastIoAt = this.sched.now;
    this.#ping();
  }

  #sendAck(): void {
    const link = this.link;
    if (link?.state !== "connected") return;
    const offset = this.offset;
    const master = link.master;
    this.cluster.net.send(link.up, this.host, master.host, () => master.ack(link.id, offset));
  }

  continued(linkId: number, masterReplid: string, missed: readonly Entry[]): void {
    const link = this.link;
    if (link?.id !== linkId) return;
    if (masterReplid !== this.replid) {
      this.replid2 = this.replid;
      this.secondOffset = this.offset + 1;
      this.replid = masterReplid;
      this.#disconnectSubReplicas();
    }
    link.state = "connected";
    this.cachedMaster = false;
    this.backlog = true;
    this.lastIoAt = this.sched.now;
    for (const entry of missed) this.#apply(entry);
    this.#sendAck();
  }

  fullSynced(linkId: number, replid: string, offset: number, snapshot: Map<string, string>): void {
    const link = this.link;
    if (link?.id !== linkId) return;
    // The snapshot was taken for this link alone (psync) and is delivered once: no second copy.
    this.data = snapshot;
    this.replid = replid;
    this.replid2 = ZERO_ID;
    this.secondOffset = -1;
    this.offset = offset;
    this.log = [];
    this.backlogStart = offset + 1;
    this.#disconnectSubReplicas();
    link.state = "connected";
    // replicationAttachToNewMaster discards the cached master; the backlog is created after the load.
    this.cachedMaster = false;
    this.backlog = true;
    this.lastIoAt = this.sched.now;
    this.#sendAck();
  }

  stream(linkId: number, entry: Entry): void {
    if (this.link?.id !== linkId || this.link.state !== "connected") return;
    this.lastIoAt = this.sched.now;
    if (entry.end <= this.offset) return;
    if (entry.start !== this.offset + 1)
      this.cluster.modelErrors.push(
        `${this.machine}: stream gap at offset ${this.offset} (entry from ${entry.start})`,
      );
    this.#apply(entry);
  }

  getack(linkId: number): void {
    if (this.link?.id !== linkId) return;
    this.lastIoAt = this.sched.now;
    this.#sendAck();
  }

  #apply(entry: Entry): void {
    this.#detachRdb(entry.key);
    this.data.set(entry.key, entry.value);
    this.offset = entry.end;
    this.log.push(entry);
    // A replica proxies its master's stream to its own replicas.
    for (const replica of this.replicas.values()) replica.deliver((r) => r.stream(replica.id, entry));
  }

  #disconnectSubReplicas(): void {
    for (const [id, link] of [...this.replicas]) {
      this.removeReplica(id);
      // The replica hears the close (the FIN; on a channel of its own, as removeReplica closed
      // `down`, which dropped it) and reconnects from its cron, as after Redis's disconnectSlaves.
      this.cluster.net.send(Network.channel(), `${this.machine}/kernel`, link.host(), () => {
        if (link.replica.link?.id === id) link.replica.#dropMasterLink();
      });
    }
  }

  // ---- commands ----------------------------------------------------------------------------

  /** Runs one client command on this process; `reply` answers it (now, or later for WAIT/paused writes). */
  command(connection: number, args: readonly string[], reply: (value: Reply) => void): void {
    const name = (args[0] ?? "").toUpperCase();
    switch (name) {
      case "INFO":
        reply(this.info());
        return;
      case "PING":
        reply("PONG");
        return;
      case "CONFIG":
        if ((args[1] ?? "").toUpperCase() === "GET") {
          const value = this.config.get(args[2] ?? "");
          reply(value === undefined ? [] : [args[2] as string, value]);
          return;
        }
        this.config.set(args[2] ?? "", args[3] ?? "");
        this.refreshGoodReplicas();
        reply("OK");
        return;
      case "CLIENT":
        reply(this.#client(connection, args));
        return;
      case "REPLICAOF":
        reply(this.#replicaof(args[1] ?? "", args[2] ?? ""));
        return;
      case "SET":
        this.#write(args[1] ?? "", args[2] ?? "", reply);
        return;
      case "WAIT":
        this.#wait(Number(args[1]), Number(args[2]), reply);
        return;
      case "KEYS":
        reply([...this.data.keys()]);
        return;
      default:
        reply({ error: `ERR unknown command '${name}'` });
        return;
    }
  }

  #client(connection: number, args: readonly string[]): Reply {
    const sub = (args[1] ?? "").toUpperCase();
    if (sub === "SETNAME") {
      this.clientNames.set(connection, args[2] ?? "");
      return "OK";
    }
    if (sub === "LIST") {
      return [...this.clientNames.entries()]
        .map(([id, name]) => `id=${id} addr=? name=${name} flags=N cmd=client`)
        .join("\n");
    }
    if (sub === "PAUSE") {
      this.pausedUntil = this.sched.now + Number(args[2]);
      this.sched.cancel(this.#pauseTimer);
      this.#pauseTimer = this.sched.schedule(Number(args[2]), () => this.#unpause(), this.host);
      return "OK";
    }
    if (sub === "UNPAUSE") {
      this.#unpause();
      return "OK";
    }
    return { error: "ERR unknown subcommand" };
  }

  #unpause(): void {
    this.pausedUntil = 0;
    this.sched.cancel(this.#pauseTimer);
    const held = this.#pausedWrites.splice(0);
    for (const write of held) write();
  }

  #replicaof(host: string, port: string): Reply {
    if (host.toUpperCase() === "NO" && port.toUpperCase() === "ONE") {
      if (this.role === "master") return "OK";
      this.#dropMasterLink();
      this.masterAddress = undefined;
      this.role = "master";
      // replicationUnsetMaster: the cached master is discarded; the backlog, if any, is kept.
      this.cachedMaster = false;
      // shiftReplicationId: the old history stays continuable up to this offset.
      this.replid2 = this.replid;
      this.secondOffset = this.offset + 1;
      this.replid = this.cluster.newReplid();
      // replicationUnsetMaster: its own replicas are disconnected to learn the new id; they
      // reconnect and continue partially (PSYNC on the old id, now its replid2).
      this.#disconnectSubReplicas();
      return "OK";
    }
    const address = `${host}:${port}`;
    if (this.role === "slave" && this.masterAddress === address) return "OK";
    this.#dropMasterLink();
    // A master turning replica synthesizes a cached master from its own id and offset
    // (replicationCacheMasterUsingMyself), with or without a backlog.
    if (this.role === "master") this.cachedMaster = true;
    this.role = "slave";
    this.masterAddress = address;
    this.#connectToMaster();
    return "OK";
  }

  #write(key: string, value: string, reply: (value: Reply) => void): void {
    if (this.role === "slave") {
      reply({ error: "READONLY You can't write against a read only replica." });
      return;
    }
    if (this.pausedUntil > this.sched.now) {
      this.#pausedWrites.push(() => this.#write(key, value, reply));
      return;
    }
    const min = Number(this.config.get("min-replicas-to-write") ?? 0);
    if (min > 0 && this.goodReplicas < min) {
      reply({ error: "NOREPLICAS Not enough good replicas to write." });
      return;
    }
    this.#append(key, value);
    reply("OK");
  }

  #wait(count: number, timeoutMs: number, reply: (value: Reply) => void): void {
    const target = this.offset;
    // Redis's replicationCountAcksByOffset: only a replica in state online counts, by the offset it
    // acknowledged (REPLCONF ACK; 0 for a new link). Simulator seed 221505: two replicas in a full
    // sync were counted by the offset of their own, foreign lineage.
    const acked = () => [...this.replicas.values()].filter((r) => r.online && r.ackOffset >= target).length;
    if (acked() >= count || this.role === "slave") {
      reply(acked());
      return;
    }
    for (const replica of this.replicas.values()) replica.deliver((r) => r.getack(replica.id));
    let timer: ReturnType<Scheduler["schedule"]> | undefined;
    const check = () => {
      if (acked() < count) return;
      finish();
    };
    const finish = () => {
      this.#waiters.delete(check);
      this.sched.cancel(timer);
      reply(acked());
    };
    this.#waiters.add(check);
    timer = this.sched.schedule(timeoutMs, finish, this.host);
  }

  info(): string {
    const lines = [
      "# Server",
      `run_id:${this.runId}`,
      "# Stats",
      `sync_full:${this.syncFull}`,
      `sync_partial_ok:${this.syncPartialOk}`,
      "# Replication",
      `role:${this.role}`,
    ];
    if (this.role === "slave") {
      const [host, port] = splitAddress(this.masterAddress ?? ":0");
      const connected = this.link?.state === "connected";
      lines.push(
        `master_host:${host}`,
        `master_port:${port}`,
        `master_link_status:${connected ? "up" : "down"}`,
        `master_last_io_seconds_ago:${connected ? Math.floor((this.sched.now - this.lastIoAt) / 1000) : -1}`,
        `master_sync_in_progress:${this.link?.state === "handshake" || this.link?.state === "sync" ? 1 : 0}`,
        `slave_repl_offset:${this.offset}`,
        "slave_read_only:1",
      );
    }
    const replicas = [...this.replicas.values()];
    lines.push(`connected_slaves:${replicas.length}`);
    const min = Number(this.config.get("min-replicas-to-write") ?? 0);
    const maxLag = Number(this.config.get("min-replicas-max-lag") ?? 0);
    if (min > 0 && maxLag > 0) lines.push(`min_slaves_good_slaves:${this.goodReplicas}`);
    replicas.forEach((replica, index) => {
      const [host, port] = splitAddress(replica.address);
      lines.push(
        `slave${index}:ip=${host},port=${port},state=${replica.online ? "online" : "wait_bgsave"},offset=${replica.ackOffset},lag=${Math.max(0, this.unixtime - replica.ackAtSec)}`,
      );
    });
    lines.push(
      `master_replid:${this.replid}`,
      `master_replid2:${this.replid2}`,
      `master_repl_offset:${this.offset}`,
      `second_repl_offset:${this.secondOffset}`,
      `repl_backlog_active:${this.backlog ? 1 : 0}`,
    );
    return lines.join("\r\n");
  }

  /**
   * Whether a write sent now from a client would be accepted (the sampler's question). A write sent
   * now is read in a later event-loop turn than the one a woken process runs first: when the cron
   * is overdue (the process was hung), Redis runs it in that first turn, before this write, so the
   * count is the one it would compute now. Writes queued during the hang are taken on the old count
   * (`#write`'s path; the residual docs/agent.md states). Simulator seed 48242 sampled a primary
   * woken from a 12 s hang in the very tick it resumed, on its count of before the hang.
   */
  acceptsWrites(): boolean {
    if (!this.up || this.sched.isPaused(this.host) || this.role !== "master") return false;
    if (this.pausedUntil > this.sched.now) return false;
    const min = Number(this.config.get("min-replicas-to-write") ?? 0);
    const good = this.sched.now - this.#cronAt > CRON_MS ? this.#countGoodReplicas() : this.goodReplicas;
    return !(min > 0 && good < min);
  }

  get following(): string | undefined {
    return this.role === "slave" ? this.masterAddress : undefined;
  }

  get linkUp(): boolean {
    return this.link?.state === "connected";
  }
}

/** An RDB's dataset, a new map. */
function rdbData(rdb: Rdb): Map<string, string> {
  if (rdb.size === rdb.source.size) return new Map(rdb.source);
  const data = new Map<string, string>();
  for (const [key, value] of rdb.source) {
    if (data.size === rdb.size) break;
    data.set(key, value);
  }
  return data;
}

function splitAddress(address: string): [string, string] {
  const colon = address.lastIndexOf(":");
  return [address.slice(0, colon), address.slice(colon + 1)];
}

export { machineOf };
