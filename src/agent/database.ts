import { readFileSync } from "node:fs";
import type { ConnectionOptions } from "node:tls";
import { Redis, type RedisOptions } from "ioredis";
import { parseAddress } from "../core/address.ts";
import { ConfigurationError, errorMessage, ShardguardError } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import { Backoff } from "./backoff.ts";
import { type AgentOptions, settingLabel } from "./options.ts";
import { parseClientNames, parseReplicationInfo, type ReplicationInfo } from "./redis-info.ts";

/** What the agent does to its own database. One implementation (ioredis); an interface so loops stay readable. */
export interface Database {
  replicationInfo(): Promise<ReplicationInfo>;
  /** `REPLICAOF host port` */
  replicaOf(host: string, port: number): Promise<void>;
  /** `REPLICAOF NO ONE` */
  promote(): Promise<void>;
  configGet(names: readonly string[]): Promise<Record<string, string>>;
  configSet(values: Readonly<Record<string, string>>): Promise<void>;
  /** `CLIENT PAUSE <ms> WRITE`: holds writes (not reads) for a planned switchover. */
  pauseWrites(timeoutMs: number): Promise<void>;
  /** `CLIENT UNPAUSE`: ends a pause early. */
  resumeWrites(): Promise<void>;
  /** Names of the normal clients connected (`CLIENT LIST TYPE normal`), unnamed ones left out. */
  clientNames(): Promise<string[]>;
  /** Resolves once connected, or after `timeoutMs` (the loops report a database that stays down). */
  waitReady(timeoutMs: number): Promise<boolean>;
  /**
   * Opens another connection, with this one's credentials and TLS, to a database at `address`: the
   * crash watch's to its own, a replica's probe to its primary. The simulator (src/dev/sim/) answers
   * it from its model; production opens an ioredis connection.
   */
  dial(address: string, options: DialOptions): DatabaseLink;
  close(): Promise<void>;
}

/** How a dialled connection connects and how long it waits. */
export interface DialOptions {
  /** Client name (`CLIENT SETNAME`), as `CLIENT LIST` shows it. */
  readonly name: string;
  readonly connectTimeoutMs: number;
  /** Longest one command may take. @default none */
  readonly commandTimeoutMs?: number;
  /**
   * `undefined`: connects only on `connect()` and never again once closed (a one-off check, a
   * watch that must hear the close). A number: connects at once and reconnects that many ms after
   * every close.
   */
  readonly reconnectMs?: number;
}

export type LinkEvent = "ready" | "close" | "end";

/** One dialled connection: the few commands the crash watch and the probe send, and its life events. */
export interface DatabaseLink {
  /** Connected and answering commands. */
  readonly ready: boolean;
  /**
   * Connects a link dialled without `reconnectMs`; rejects with an error whose `code` is the
   * socket's (`ECONNREFUSED`: nothing listens, `ECONNRESET`: accepted then reset), if any.
   */
  connect(): Promise<void>;
  /** `INFO replication` + `INFO server`, parsed. */
  replicationInfo(): Promise<ReplicationInfo>;
  /** `CONFIG GET name`: the value, undefined when the setting is unknown. */
  configGet(name: string): Promise<string | undefined>;
  configSet(name: string, value: string): Promise<void>;
  /** `CLIENT SETNAME` */
  setName(name: string): Promise<void>;
  /** `ready`: (re)connected; `close`: a connection closed; `end`: closed for good (no reconnect). */
  on(event: LinkEvent, listener: () => void): void;
  off(event: LinkEvent, listener: () => void): void;
  disconnect(): void;
}

/**
 * Dials \`address\` once and runs \`ask\` on the link, connecting included, within \`timeoutMs\`
 * (rejects with "no answer within …" past it: a hung database accepts the TCP connection and never
 * answers the client's ready check, which no socket timeout covers); the link is closed after. The
 * successor's fence of a deposed primary, a replica's read of the primary it is about to follow.
 */
export async function askOnce<T>(
  db: Pick<Database, "dial">,
  address: string,
  options: { readonly name: string; readonly timeoutMs: number },
  ask: (link: DatabaseLink) => Promise<T>,
): Promise<T> {
  const link = db.dial(address, {
    name: options.name,
    connectTimeoutMs: options.timeoutMs,
    commandTimeoutMs: options.timeoutMs,
  });
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      (async () => {
        await link.connect();
        return await ask(link);
      })(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no answer within ${options.timeoutMs} ms`)),
          options.timeoutMs,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
    link.disconnect();
  }
}

/** A dialled connection through ioredis. */
export class RedisLink implements DatabaseLink {
  readonly #client: Redis;
  /** ioredis rejects connect() with "Connection is closed"; the socket's own error carries the code. */
  #socketError: { code?: string } | undefined;

  constructor(address: string, options: DialOptions, connection?: RedisConnectSettings) {
    const { host, port } = parseAddress(address);
    const reconnectMs = options.reconnectMs;
    this.#client = new Redis({
      host,
      port,
      lazyConnect: reconnectMs === undefined,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      connectTimeout: options.connectTimeoutMs,
      ...(options.commandTimeoutMs === undefined ? {} : { commandTimeout: options.commandTimeoutMs }),
      retryStrategy: () => (reconnectMs === undefined ? null : reconnectMs),
      ...connection?.redisOptions,
      connectionName: options.name,
    });
    this.#client.on("error", (error: { code?: string }) => {
      this.#socketError ??= error;
    });
  }

  get ready(): boolean {
    return this.#client.status === "ready";
  }

  async connect(): Promise<void> {
    try {
      await this.#client.connect();
    } catch (error) {
      const code = this.#socketError?.code ?? (error as { code?: string }).code;
      throw Object.assign(new Error(errorMessage(error), { cause: error }), { code });
    }
  }

  replicationInfo(): Promise<ReplicationInfo> {
    return readReplicationInfo(this.#client);
  }

  async configGet(name: string): Promise<string | undefined> {
    const reply = (await this.#client.config("GET", name)) as string[];
    return reply[1];
  }

  async configSet(name: string, value: string): Promise<void> {
    await this.#client.config("SET", name, value);
  }

  async setName(name: string): Promise<void> {
    await this.#client.client("SETNAME", name);
  }

  on(event: LinkEvent, listener: () => void): void {
    this.#client.on(event, listener);
  }

  off(event: LinkEvent, listener: () => void): void {
    this.#client.off(event, listener);
  }

  disconnect(): void {
    this.#client.disconnect();
  }
}

/** A database refused the agent for a reason its operator must fix: credentials, ACL, TLS. */
export class DatabaseAccessError extends ShardguardError {
  override name = "DatabaseAccessError";
  override readonly retryable = true;
}

/** How every connection the agent opens to a database authenticates and encrypts. */
export interface RedisConnectSettings {
  /** Spread into each `new Redis({...})`: credentials, TLS, no CLIENT SETINFO (one ACL permission less). */
  readonly redisOptions: Pick<RedisOptions, "username" | "password" | "tls" | "disableClientInfo">;
  /** certificate verification is off (--redis-tls-insecure). */
  readonly insecure: boolean;
  /** Which setting to check for an error of a connection or a command; undefined when none is to blame. */
  hint(error: unknown): string | undefined;
}

const settingsCache = new WeakMap<AgentOptions, RedisConnectSettings>();

/** Node's codes for a server certificate it could not trust. */
const UNTRUSTED_CERT = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "CERT_SIGNATURE_FAILURE",
  "CERT_UNTRUSTED",
]);

/**
 * The credentials and TLS settings of every connection the agent opens to a database (its own,
 * the probe of its primary, the crash watch, the Sentinel endpoint's eviction), with the files
 * read once per options object. Throws a ConfigurationError naming the setting of a file it
 * cannot read.
 */
export function redisConnectSettings(options: AgentOptions): RedisConnectSettings {
  const cached = settingsCache.get(options);
  if (cached) return cached;
  const read = (key: "redisPasswordFile" | "redisCa" | "redisCert" | "redisKey", path: string): string => {
    try {
      return readFileSync(path, "utf8");
    } catch (error) {
      throw new ConfigurationError(`${settingLabel(key)}: cannot read ${path}: ${errorMessage(error)}`);
    }
  };
  let password = options.redisPassword;
  if (options.redisPasswordFile !== undefined) {
    password = read("redisPasswordFile", options.redisPasswordFile).replace(/\r?\n$/, "");
    if (password === "")
      throw new ConfigurationError(
        `${settingLabel("redisPasswordFile")}: ${options.redisPasswordFile} is empty`,
      );
  }
  let tls: ConnectionOptions | undefined;
  if (options.redisTls) {
    tls = {
      ca: options.redisCa === undefined ? undefined : read("redisCa", options.redisCa),
      cert: options.redisCert === undefined ? undefined : read("redisCert", options.redisCert),
      key: options.redisKey === undefined ? undefined : read("redisKey", options.redisKey),
      servername: options.redisServername,
      rejectUnauthorized: !options.redisTlsInsecure,
      ...(options.redisTlsInsecure ? { checkServerIdentity: () => undefined } : {}),
    };
  }
  const user = `${settingLabel("redisUsername")} "${options.redisUsername ?? "default"}"`;
  const passwordSetting = settingLabel(options.redisPasswordFile ? "redisPasswordFile" : "redisPassword");
  const settings: RedisConnectSettings = {
    redisOptions: { username: options.redisUsername, password, tls, disableClientInfo: true },
    insecure: options.redisTls && options.redisTlsInsecure,
    hint: (error) => {
      const message = errorMessage(error);
      const code = String((error as { code?: unknown } | undefined)?.code ?? "");
      if (/^(WRONGPASS|NOAUTH)|invalid (username-)?password/i.test(message))
        return `the database refused the credentials: check ${user} and ${passwordSetting}`;
      if (/^NOPERM/.test(message))
        return `the ACL user ${user} lacks a command the agent needs: give it the rule in docs/agent.md#tls-and-acl-users`;
      if (UNTRUSTED_CERT.has(code))
        return `the database's certificate is not signed by a CA in ${settingLabel("redisCa")}${options.redisCa ? ` ${options.redisCa}` : ""}`;
      if (code === "CERT_HAS_EXPIRED" || code === "CERT_NOT_YET_VALID")
        return `the database's certificate is outside its validity period (${code}); it is checked against ${settingLabel("redisCa")}`;
      if (code === "ERR_TLS_CERT_ALTNAME_INVALID")
        return `the database's certificate does not name the host dialled: set ${settingLabel("redisServername")} to a name it carries`;
      if (
        /alert (certificate expired|bad certificate|unknown ca|certificate required|certificate unknown)/i.test(
          message,
        )
      )
        return `the database rejected the agent's client certificate: check ${settingLabel("redisCert")} and ${settingLabel("redisKey")} (expired, or not signed by the CA the database trusts)`;
      return undefined;
    },
  };
  settingsCache.set(options, settings);
  return settings;
}

export interface RedisDatabaseOptions {
  readonly address: string;
  /** Credentials and TLS (`redisConnectSettings`). @default none: plain TCP, the default user */
  readonly connection?: RedisConnectSettings | undefined;
  /** Longest one command may take before it counts as failed. */
  readonly commandTimeoutMs: number;
  readonly logger: Logger;
}

/**
 * The agent's connection to its database (Redis, Valkey, KeyDB, SableDB) through ioredis.
 * No offline queue and no per-command retries: a command to a database that is down fails at
 * once, so the heartbeat reports `db_status: down` instead of waiting. Reconnects use capped
 * exponential back-off with jitter.
 */
export class RedisDatabase implements Database {
  private readonly client: Redis;
  private readonly logger: Logger;
  private readonly connection: RedisConnectSettings | undefined;
  private lastErrorLogged = 0;
  /** The last connection error, explained: a command refused while disconnected says why. */
  private lastConnectionError: string | undefined;

  constructor(options: RedisDatabaseOptions) {
    const { host, port } = parseAddress(options.address);
    const reconnect = new Backoff({ baseMs: 100, capMs: 2000, floorMs: 50 });
    this.logger = options.logger;
    this.connection = options.connection;
    if (options.connection?.insecure)
      this.logger.warn(
        `TLS certificate verification is OFF (${settingLabel("redisTlsInsecure")}): anyone on the path can pose as the database`,
        { redis: options.address },
      );
    this.client = new Redis({
      host,
      port,
      ...options.connection?.redisOptions,
      enableOfflineQueue: false,
      maxRetriesPerRequest: 0,
      commandTimeout: options.commandTimeoutMs,
      connectTimeout: Math.max(options.commandTimeoutMs, 1000),
      // The agent's own commands are few; a name makes them easy to find in CLIENT LIST.
      connectionName: "shardguard-agent",
      retryStrategy: () => reconnect.next(),
    });
    this.client.on("ready", () => {
      reconnect.reset();
      this.lastConnectionError = undefined;
      this.logger.info("database connection ready", { redis: options.address });
    });
    this.client.on("error", (error: Error) => {
      const hint = this.connection?.hint(error);
      this.lastConnectionError = hint ? `${error.message} (${hint})` : error.message;
      // ioredis emits one error per failed reconnect; once every 10 s is enough to tell the story.
      const now = Date.now();
      if (now - this.lastErrorLogged < 10_000) return;
      this.lastErrorLogged = now;
      this.logger.warn("database connection error", {
        redis: options.address,
        error: this.lastConnectionError,
      });
    });
  }

  /**
   * Runs commands; a refusal the operator must fix (credentials, ACL, TLS) comes back as a
   * DatabaseAccessError that keeps the database's reply and names the setting to check.
   */
  private async run<T>(commands: () => Promise<T>): Promise<T> {
    try {
      return await commands();
    } catch (error) {
      const hint = this.connection?.hint(error);
      if (hint !== undefined)
        throw new DatabaseAccessError(`${errorMessage(error)} (${hint})`, { cause: error });
      // Refused at once by the client while it reconnects: why it is not connected is the news.
      if (this.client.status !== "ready" && this.lastConnectionError !== undefined)
        throw new DatabaseAccessError(`not connected: ${this.lastConnectionError}`, { cause: error });
      throw error;
    }
  }

  async replicationInfo(): Promise<ReplicationInfo> {
    return this.run(() => readReplicationInfo(this.client));
  }

  async replicaOf(host: string, port: number): Promise<void> {
    await this.run(() => this.client.replicaof(host, port));
  }

  async promote(): Promise<void> {
    await this.run(() => this.client.replicaof("NO", "ONE"));
  }

  async configGet(names: readonly string[]): Promise<Record<string, string>> {
    const values: Record<string, string> = {};
    for (const name of names) {
      const reply = (await this.run(() => this.client.config("GET", name))) as string[];
      for (let index = 0; index + 1 < reply.length; index += 2) {
        values[reply[index] as string] = reply[index + 1] as string;
      }
    }
    return values;
  }

  async configSet(values: Readonly<Record<string, string>>): Promise<void> {
    for (const [name, value] of Object.entries(values)) {
      await this.run(() => this.client.config("SET", name, value));
    }
  }

  async pauseWrites(timeoutMs: number): Promise<void> {
    await this.run(() => this.client.call("CLIENT", "PAUSE", String(timeoutMs), "WRITE"));
  }

  async resumeWrites(): Promise<void> {
    await this.run(() => this.client.call("CLIENT", "UNPAUSE"));
  }

  async clientNames(): Promise<string[]> {
    return parseClientNames(
      String(await this.run(() => this.client.call("CLIENT", "LIST", "TYPE", "normal"))),
    );
  }

  async waitReady(timeoutMs: number): Promise<boolean> {
    if (this.client.status === "ready") return true;
    return new Promise((resolve) => {
      const timer = setTimeout(() => finish(false), timeoutMs);
      const onReady = () => finish(true);
      const finish = (ready: boolean) => {
        clearTimeout(timer);
        this.client.off("ready", onReady);
        resolve(ready);
      };
      this.client.on("ready", onReady);
    });
  }

  dial(address: string, options: DialOptions): DatabaseLink {
    return new RedisLink(address, options, this.connection);
  }

  async close(): Promise<void> {
    this.client.disconnect();
  }
}

/**
 * `INFO replication` and `INFO server` in one round trip (`INFO server` carries run_id, the
 * identity of the database process), parsed. Used on the agent's own database and by its probe.
 */
export async function readReplicationInfo(client: Redis): Promise<ReplicationInfo> {
  const sentAtMs = performance.now();
  const replies = (await client.pipeline().info("replication").info("server").exec()) ?? [];
  const receivedAtMs = performance.now();
  const texts: string[] = [];
  for (const [error, text] of replies) {
    if (error) throw error;
    texts.push(String(text));
  }
  const info = parseReplicationInfo(texts.join("\n"));
  return info.serverTimeUs === undefined
    ? info
    : { ...info, clock: { serverTimeMs: info.serverTimeUs / 1000, sentAtMs, receivedAtMs } };
}
