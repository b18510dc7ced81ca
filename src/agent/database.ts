import { Redis } from "ioredis";
import { Backoff } from "./backoff.ts";
import type { AgentLogger } from "./log.ts";
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
  close(): Promise<void>;
}

export interface RedisDatabaseOptions {
  readonly address: string;
  readonly username?: string | undefined;
  readonly password?: string | undefined;
  /** Longest one command may take before it counts as failed. */
  readonly commandTimeoutMs: number;
  readonly logger: AgentLogger;
}

/**
 * The agent's connection to its database (Redis, Valkey, KeyDB, SableDB) through ioredis.
 * No offline queue and no per-command retries: a command to a database that is down fails at
 * once, so the heartbeat reports `db_status: down` instead of waiting. Reconnects use capped
 * exponential back-off with jitter.
 */
export class RedisDatabase implements Database {
  private readonly client: Redis;
  private readonly logger: AgentLogger;
  private lastErrorLogged = 0;

  constructor(options: RedisDatabaseOptions) {
    const [host, port] = splitAddress(options.address);
    const reconnect = new Backoff({ baseMs: 100, capMs: 2000, floorMs: 50 });
    this.logger = options.logger;
    this.client = new Redis({
      host,
      port,
      username: options.username,
      password: options.password,
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
      this.logger.info("database connection ready", { redis: options.address });
    });
    this.client.on("error", (error: Error) => {
      // ioredis emits one error per failed reconnect; once every 10 s is enough to tell the story.
      const now = Date.now();
      if (now - this.lastErrorLogged < 10_000) return;
      this.lastErrorLogged = now;
      this.logger.warn("database connection error", { redis: options.address, error: error.message });
    });
  }

  async replicationInfo(): Promise<ReplicationInfo> {
    return readReplicationInfo(this.client);
  }

  async replicaOf(host: string, port: number): Promise<void> {
    await this.client.replicaof(host, port);
  }

  async promote(): Promise<void> {
    await this.client.replicaof("NO", "ONE");
  }

  async configGet(names: readonly string[]): Promise<Record<string, string>> {
    const values: Record<string, string> = {};
    for (const name of names) {
      const reply = (await this.client.config("GET", name)) as string[];
      for (let index = 0; index + 1 < reply.length; index += 2) {
        values[reply[index] as string] = reply[index + 1] as string;
      }
    }
    return values;
  }

  async configSet(values: Readonly<Record<string, string>>): Promise<void> {
    for (const [name, value] of Object.entries(values)) {
      await this.client.config("SET", name, value);
    }
  }

  async pauseWrites(timeoutMs: number): Promise<void> {
    await this.client.call("CLIENT", "PAUSE", String(timeoutMs), "WRITE");
  }

  async resumeWrites(): Promise<void> {
    await this.client.call("CLIENT", "UNPAUSE");
  }

  async clientNames(): Promise<string[]> {
    return parseClientNames(String(await this.client.call("CLIENT", "LIST", "TYPE", "normal")));
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

  async close(): Promise<void> {
    this.client.disconnect();
  }
}

/**
 * `INFO replication` and `INFO server` in one round trip (`INFO server` carries run_id, the
 * identity of the database process), parsed. Used on the agent's own database and by its probe.
 */
export async function readReplicationInfo(client: Redis): Promise<ReplicationInfo> {
  const replies = (await client.pipeline().info("replication").info("server").exec()) ?? [];
  const texts: string[] = [];
  for (const [error, text] of replies) {
    if (error) throw error;
    texts.push(String(text));
  }
  return parseReplicationInfo(texts.join("\n"));
}

/** "host:port" -> [host, port]; the address was validated by the options schema. */
export function splitAddress(address: string): [string, number] {
  const colon = address.lastIndexOf(":");
  return [address.slice(0, colon), Number(address.slice(colon + 1))];
}
