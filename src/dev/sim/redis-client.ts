import type { Database, DatabaseLink, DialOptions, LinkEvent } from "../../agent/database.ts";
import { parseClientNames, parseReplicationInfo, type ReplicationInfo } from "../../agent/redis-info.ts";
import { type Channel, machineOf, Network } from "./network.ts";
import type { RedisCluster, RedisServer, Reply } from "./redis-model.ts";

/**
 * The client side of a simulated Redis connection, with ioredis's behaviour as the agent
 * configures it: no offline queue (a command on a connection that is not ready fails at once),
 * a command timeout that fails the command but keeps the connection (the command may still run
 * later: it waits in the socket of a paused server), `close` when the server's process dies and
 * the path lets the FIN through, reconnects after `reconnectMs`. Errors carry Node's codes
 * (`ECONNREFUSED`, `ETIMEDOUT`) as the crash watch reads them.
 */

type ConnState = "idle" | "connecting" | "ready" | "closed";

export class SimConnection {
  readonly id: number;
  readonly #cluster: RedisCluster;
  readonly #clientHost: () => string;
  readonly #address: string;
  readonly #options: DialOptions;
  #state: ConnState = "idle";
  #up: Channel = Network.channel();
  #down: Channel = Network.channel();
  #server: RedisServer | undefined;
  #incarnation = -1;
  #stopped = false;
  readonly #listeners = new Map<LinkEvent, Set<() => void>>();

  constructor(cluster: RedisCluster, clientHost: () => string, address: string, options: DialOptions) {
    this.#cluster = cluster;
    this.#clientHost = clientHost;
    this.#address = address;
    this.#options = options;
    this.id = cluster.nextId();
    cluster.connections.add(this);
    if (options.reconnectMs !== undefined) void this.connect().catch(() => {});
  }

  get ready(): boolean {
    return this.#state === "ready";
  }

  on(event: LinkEvent, listener: () => void): void {
    const set = this.#listeners.get(event) ?? new Set();
    set.add(listener);
    this.#listeners.set(event, set);
  }

  off(event: LinkEvent, listener: () => void): void {
    this.#listeners.get(event)?.delete(listener);
  }

  #emit(event: LinkEvent): void {
    for (const listener of [...(this.#listeners.get(event) ?? [])]) listener();
  }

  get #machine(): string {
    return machineOf(this.#clientHost());
  }

  connect(): Promise<void> {
    if (this.#state === "ready") return Promise.resolve();
    this.#state = "connecting";
    const sched = this.#cluster.sched;
    const net = this.#cluster.net;
    const up = Network.channel();
    const down = Network.channel();
    this.#up = up;
    this.#down = down;
    const server = this.#cluster.resolve(this.#machine, this.#address);
    return new Promise<void>((resolve, reject) => {
      let done = false;
      const fail = (code: string, message: string) => {
        if (done) return;
        done = true;
        sched.cancel(timer);
        up.closed = true;
        down.closed = true;
        this.#state = "closed";
        reject(Object.assign(new Error(message), { code }));
        this.#afterClose();
      };
      const timer = sched.schedule(this.#options.connectTimeoutMs, () =>
        fail("ETIMEDOUT", "connect ETIMEDOUT"),
      );
      const serverMachine = server?.machine ?? this.#address.slice(0, this.#address.lastIndexOf(":"));
      const refuse = () => {
        // The kernel answers RST for a port nobody listens on.
        const back = Network.channel();
        net.send(back, `${serverMachine}/kernel`, this.#clientHost(), () =>
          fail("ECONNREFUSED", `connect ECONNREFUSED ${this.#address}`),
        );
      };
      if (server === undefined) {
        net.send(up, this.#clientHost(), `${this.#machine}/kernel`, refuse);
        return;
      }
      net.send(up, this.#clientHost(), `${server.machine}/kernel`, () => {
        if (!server.up) return refuse();
        // Accepted by the kernel; the ready check (INFO) needs the process itself.
        const incarnation = server.incarnation;
        sched.schedule(
          0,
          () => {
            if (server.incarnation !== incarnation || !server.up) return;
            server.clientNames.set(this.id, this.#options.name);
            net.send(down, server.host, this.#clientHost(), () => {
              if (done) return;
              done = true;
              sched.cancel(timer);
              this.#server = server;
              this.#incarnation = incarnation;
              this.#state = "ready";
              resolve();
              this.#emit("ready");
            });
          },
          server.host,
        );
      });
    });
  }

  /** The server's process died: the FIN reaches this client if the path lets it. */
  serverDied(server: RedisServer): void {
    if (this.#server !== server || this.#state !== "ready") return;
    const net = this.#cluster.net;
    // The FIN crosses a cut once it heals (TCP retransmits it).
    net.send(Network.channel(), `${server.machine}/kernel`, this.#clientHost(), () => {
      if (this.#server !== server || this.#state !== "ready") return;
      this.#closeNow();
    });
  }

  #closeNow(): void {
    this.#state = "closed";
    this.#up.closed = true;
    this.#down.closed = true;
    this.#server?.clientNames.delete(this.id);
    this.#server = undefined;
    this.#afterClose();
  }

  #afterClose(): void {
    this.#emit("close");
    const reconnectMs = this.#options.reconnectMs;
    if (this.#stopped || reconnectMs === undefined) {
      this.#emit("end");
      return;
    }
    this.#cluster.sched.schedule(reconnectMs, () => {
      if (!this.#stopped && this.#state === "closed") void this.connect().catch(() => {});
    });
  }

  /** Sends a command; rejects at once when not connected, after `commandTimeoutMs` without an answer. */
  call(args: readonly string[]): Promise<Reply> {
    const server = this.#server;
    if (this.#state !== "ready" || server === undefined)
      return Promise.reject(new Error("Connection is closed."));
    const sched = this.#cluster.sched;
    const net = this.#cluster.net;
    const incarnation = this.#incarnation;
    const down = this.#down;
    return new Promise<Reply>((resolve, reject) => {
      let done = false;
      const timeoutMs = this.#options.commandTimeoutMs;
      const timer =
        timeoutMs === undefined
          ? undefined
          : sched.schedule(timeoutMs, () => {
              if (done) return;
              done = true;
              reject(new Error("Command timed out"));
            });
      net.send(this.#up, this.#clientHost(), server.host, () => {
        if (!server.up || server.incarnation !== incarnation) return;
        server.command(this.id, args, (reply) => {
          net.send(down, server.host, this.#clientHost(), () => {
            if (done) return;
            done = true;
            sched.cancel(timer);
            if (typeof reply === "object" && !Array.isArray(reply)) reject(new Error(reply.error));
            else resolve(reply);
          });
        });
      });
    });
  }

  disconnect(): void {
    this.#stopped = true;
    if (this.#state === "closed" || this.#state === "idle") {
      this.#state = "closed";
      this.#cluster.connections.delete(this);
      return;
    }
    this.#cluster.sched.schedule(0, () => this.#closeNow());
    this.#cluster.connections.delete(this);
  }
}

/** A dialled connection (the crash watch's, the probe's) on the simulated network. */
export class SimLink implements DatabaseLink {
  readonly #connection: SimConnection;

  constructor(connection: SimConnection) {
    this.#connection = connection;
  }

  get ready(): boolean {
    return this.#connection.ready;
  }

  connect(): Promise<void> {
    return this.#connection.connect();
  }

  async replicationInfo(): Promise<ReplicationInfo> {
    return parseReplicationInfo(String(await this.#connection.call(["INFO"])));
  }

  async configGet(name: string): Promise<string | undefined> {
    const reply = (await this.#connection.call(["CONFIG", "GET", name])) as string[];
    return reply[1];
  }

  async configSet(name: string, value: string): Promise<void> {
    await this.#connection.call(["CONFIG", "SET", name, value]);
  }

  async setName(name: string): Promise<void> {
    await this.#connection.call(["CLIENT", "SETNAME", name]);
  }

  on(event: LinkEvent, listener: () => void): void {
    this.#connection.on(event, listener);
  }

  off(event: LinkEvent, listener: () => void): void {
    this.#connection.off(event, listener);
  }

  disconnect(): void {
    this.#connection.disconnect();
  }
}

/** The agent's own database connection (the `Database` port) on the simulated network. */
export class SimDatabase implements Database {
  readonly #cluster: RedisCluster;
  readonly #host: () => string;
  readonly #connection: SimConnection;

  constructor(cluster: RedisCluster, host: () => string, address: string, commandTimeoutMs: number) {
    this.#cluster = cluster;
    this.#host = host;
    this.#connection = new SimConnection(cluster, host, address, {
      name: "shardguard-agent",
      connectTimeoutMs: Math.max(commandTimeoutMs, 1000),
      commandTimeoutMs,
      reconnectMs: 200,
    });
  }

  async replicationInfo(): Promise<ReplicationInfo> {
    return parseReplicationInfo(String(await this.#connection.call(["INFO"])));
  }

  async replicaOf(host: string, port: number): Promise<void> {
    await this.#connection.call(["REPLICAOF", host, String(port)]);
  }

  async promote(): Promise<void> {
    await this.#connection.call(["REPLICAOF", "NO", "ONE"]);
  }

  async configGet(names: readonly string[]): Promise<Record<string, string>> {
    const values: Record<string, string> = {};
    for (const name of names) {
      const reply = (await this.#connection.call(["CONFIG", "GET", name])) as string[];
      if (reply[1] !== undefined) values[name] = reply[1];
    }
    return values;
  }

  async configSet(values: Readonly<Record<string, string>>): Promise<void> {
    for (const [name, value] of Object.entries(values))
      await this.#connection.call(["CONFIG", "SET", name, value]);
  }

  async pauseWrites(timeoutMs: number): Promise<void> {
    await this.#connection.call(["CLIENT", "PAUSE", String(timeoutMs), "WRITE"]);
  }

  async resumeWrites(): Promise<void> {
    await this.#connection.call(["CLIENT", "UNPAUSE"]);
  }

  async clientNames(): Promise<string[]> {
    return parseClientNames(String(await this.#connection.call(["CLIENT", "LIST", "TYPE", "normal"])));
  }

  waitReady(timeoutMs: number): Promise<boolean> {
    if (this.#connection.ready) return Promise.resolve(true);
    return new Promise((resolve) => {
      const onReady = () => finish(true);
      const timer = this.#cluster.sched.schedule(timeoutMs, () => finish(false));
      const finish = (ready: boolean) => {
        this.#cluster.sched.cancel(timer);
        this.#connection.off("ready", onReady);
        resolve(ready);
      };
      this.#connection.on("ready", onReady);
    });
  }

  dial(address: string, options: DialOptions): DatabaseLink {
    return new SimLink(new SimConnection(this.#cluster, this.#host, address, options));
  }

  async close(): Promise<void> {
    this.#connection.disconnect();
  }
}
