import { readFileSync } from "node:fs";
import { parseAddress } from "../core/address.ts";
import { ConfigurationError, errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import type { AgentDeps } from "./context.ts";
import { redisConnectSettings } from "./database.ts";
import type { AgentOptions } from "./options.ts";
import { evictApplicationClients } from "./sentinel-eviction.ts";
import { SentinelFeed } from "./sentinel-feed.ts";
import { announcedAddress, SentinelServer } from "./sentinel-server.ts";

/**
 * How often, at most, a client's question makes the endpoint read the shard itself rather than
 * answer from the heartbeat loop's last snapshot: bounds both the staleness of an answer and the
 * table reads a crowd of reconnecting clients can cause (5 per second per agent).
 */
const REFRESH_MS = 200;

/**
 * Most Sentinel clients served at once: at most half of the process's open-file limit, so that
 * a crowd of clients can never leave the agent without descriptors for its own database and
 * table connections (a starved heartbeat loop would look like a dead primary), and at most 4096.
 */
export function maxSentinelConnections(limitsText = readProcLimits()): number {
  const soft = /^Max open files\s+(\d+)/m.exec(limitsText ?? "")?.[1];
  return soft === undefined ? 512 : Math.max(16, Math.min(4096, Math.floor(Number(soft) / 2)));
}

function readProcLimits(): string | undefined {
  try {
    return readFileSync("/proc/self/limits", "utf8");
  } catch {
    return undefined;
  }
}

/**
 * The agent's Sentinel-protocol endpoint, wired: a feed tapped into the agent's heartbeat store
 * (every snapshot the agent reads is what it answers from; every heartbeat it writes carries the
 * endpoint's address, so the other agents list it in `SENTINEL sentinels`) and the TCP server.
 */
export class SentinelEndpoint {
  readonly #feed: SentinelFeed;
  readonly #server: SentinelServer;
  readonly #advertised: string;
  readonly #bind: string;
  readonly #port: number;
  #announced: string | undefined;

  constructor(init: { options: AgentOptions; nodeId: string; deps: AgentDeps; logger: Logger }) {
    const { options, deps, logger } = init;
    this.#advertised = options.address ?? options.redis;
    this.#bind = options.sentinelBind ?? parseAddress(this.#advertised).host;
    this.#port = options.sentinelPort ?? 0;
    const monotonicNow = deps.monotonicNow ?? (() => performance.now());
    this.#feed = new SentinelFeed({
      shard: options.shard,
      nodeId: init.nodeId,
      failureTimeoutMs: options.failureTimeoutMs,
      refreshMs: REFRESH_MS,
      storeTimeoutMs: options.storeTimeoutMs ?? Math.max(options.heartbeatIntervalMs, 1000),
      read: () => deps.heartbeats.snapshot(options.shard),
      clock: deps.clock,
      monotonicNow,
      logger,
    });
    this.#server = new SentinelServer({
      shard: options.shard,
      host: this.#bind,
      port: this.#port,
      password: options.sentinelPassword,
      tls: options.sentinelTls ? sentinelCertificate(options) : undefined,
      feed: this.#feed,
      logger,
      limits: { maxConnections: maxSentinelConnections() },
      onEvents: (events) => {
        const demoted = events.some(
          (event) => event.channel === "+switch-master" && oldMasterOf(event.message) === this.#advertised,
        );
        if (demoted) this.#evict(options, logger);
      },
    });
  }

  /** The agent's ports with the heartbeat store tapped. */
  wrap(deps: AgentDeps): AgentDeps {
    return { ...deps, heartbeats: this.#feed.tap(deps.heartbeats, () => this.#announced) };
  }

  /** host:port clients and other agents reach the endpoint on (after `listen`). */
  get address(): string | undefined {
    return this.#announced;
  }

  async listen(): Promise<void> {
    let port: number;
    try {
      ({ port } = await this.#server.listen());
    } catch (error) {
      throw new ConfigurationError(
        `--sentinel-port: cannot listen on ${this.#bind}:${this.#port}: ${errorMessage(error)}`,
      );
    }
    this.#announced = announcedAddress(this.#bind, port, this.#advertised);
  }

  /** This node was the primary clients were given and no longer is: drop its application clients. */
  #evict(options: AgentOptions, logger: Logger): void {
    evictApplicationClients({
      address: options.redis,
      connection: redisConnectSettings(options).redisOptions,
      timeoutMs: options.redisTimeoutMs ?? Math.max(options.heartbeatIntervalMs, 1000),
    }).then(
      (closed) =>
        logger.info("sentinel endpoint: closed the application connections of the old primary", { closed }),
      (error: unknown) =>
        logger.warn("sentinel endpoint: could not close the old primary's application connections", {
          error: errorMessage(error),
        }),
    );
  }

  async close(): Promise<void> {
    this.#feed.stop();
    await this.#server.close();
  }
}

/** The endpoint serves the agent's own certificate (--redis-cert / --redis-key), as read for its database connections. */
function sentinelCertificate(options: AgentOptions): { cert: string; key: string } {
  const tls = redisConnectSettings(options).redisOptions.tls;
  if (typeof tls?.cert !== "string" || typeof tls.key !== "string")
    throw new ConfigurationError(
      "--sentinel-tls: needs --redis-cert and --redis-key, the certificate it serves",
    );
  return { cert: tls.cert, key: tls.key };
}

/** "<name> <old-ip> <old-port> <new-ip> <new-port>" -> "old-ip:old-port". */
function oldMasterOf(message: string): string {
  const [, ip, port] = message.split(" ");
  return `${ip}:${port}`;
}
