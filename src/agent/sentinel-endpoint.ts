import { readFileSync } from "node:fs";
import { parseAddress } from "../core/address.ts";
import { ConfigurationError, errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import type { AgentDeps } from "./context.ts";
import { redisConnectSettings } from "./database.ts";
import { type AgentOptions, settingLabel } from "./options.ts";
import { evictApplicationClients } from "./sentinel-eviction.ts";
import { SentinelFeed } from "./sentinel-feed.ts";
import { announcedAddress, SentinelServer, type SentinelTls } from "./sentinel-server.ts";

/** Where a protected endpoint listens: only this host's processes can reach it. */
export const PROTECTED_BIND = "127.0.0.1";

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
  /** Protected mode on a node other hosts reach: the loopback endpoint is not for them to list. */
  readonly #unlisted: boolean;

  constructor(init: { options: AgentOptions; nodeId: string; deps: AgentDeps; logger: Logger }) {
    const { options, deps, logger } = init;
    this.#advertised = options.address ?? options.redis;
    const password = sentinelPassword(options);
    const plan = sentinelBind(options, password !== undefined);
    this.#bind = plan.host;
    this.#unlisted = plan.protectedMode && !isLoopback(parseAddress(this.#advertised).host);
    if (plan.protectedMode)
      logger.warn(
        `sentinel endpoint in protected mode: no Sentinel password is set, so it listens on ${PROTECTED_BIND} only and other hosts cannot reach it; set ${settingLabel("sentinelPasswordFile")} or ${settingLabel("sentinelPassword")}, or choose an address with ${settingLabel("sentinelBind")}, or turn this off with --sentinel-protected-mode no`,
        { bind: PROTECTED_BIND, wouldBind: plan.unprotectedHost },
      );
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
      password,
      tls: options.sentinelTls ? sentinelTls(options) : undefined,
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

  /**
   * The agent's ports with the heartbeat store tapped. Heartbeats carry the endpoint's address
   * unless it is protected on a node other hosts reach (their clients would dial their own loopback).
   */
  wrap(deps: AgentDeps): AgentDeps {
    const listed = () => (this.#unlisted ? undefined : this.#announced);
    return { ...deps, heartbeats: this.#feed.tap(deps.heartbeats, listed) };
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

type SentinelFileSetting = "sentinelPasswordFile" | "sentinelCert" | "sentinelKey" | "sentinelCa";

/** Reads a file a setting names; the error names the setting and the file, never its content. */
function readSettingFile(key: SentinelFileSetting, path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (error) {
    throw new ConfigurationError(`${settingLabel(key)}: cannot read ${path}: ${errorMessage(error)}`);
  }
}

/** The password clients must give: the variable, or the file read once at start. */
export function sentinelPassword(options: AgentOptions): string | undefined {
  if (options.sentinelPasswordFile === undefined) return options.sentinelPassword;
  const password = readSettingFile("sentinelPasswordFile", options.sentinelPasswordFile).replace(
    /\r?\n$/,
    "",
  );
  if (password === "")
    throw new ConfigurationError(
      `${settingLabel("sentinelPasswordFile")}: ${options.sentinelPasswordFile} is empty`,
    );
  return password;
}

/**
 * Where the endpoint listens. As Redis and Sentinel do, an endpoint nobody chose to expose stays
 * local: with no password and no `--sentinel-bind`, only loopback, unless protected mode is off.
 */
export function sentinelBind(
  options: Pick<AgentOptions, "sentinelBind" | "sentinelProtectedMode" | "address" | "redis">,
  hasPassword: boolean,
): { host: string; protectedMode: boolean; unprotectedHost: string } {
  const unprotectedHost = options.sentinelBind ?? parseAddress(options.address ?? options.redis).host;
  const protectedMode = options.sentinelProtectedMode && !hasPassword && options.sentinelBind === undefined;
  return { host: protectedMode ? PROTECTED_BIND : unprotectedHost, protectedMode, unprotectedHost };
}

/** The endpoint's own server certificate, and the CA its clients' certificates must chain to. */
function sentinelTls(options: AgentOptions): SentinelTls {
  if (options.sentinelCert === undefined || options.sentinelKey === undefined)
    throw new ConfigurationError(
      `${settingLabel("sentinelTls")}: needs ${settingLabel("sentinelCert")} and ${settingLabel("sentinelKey")}`,
    );
  return {
    cert: readSettingFile("sentinelCert", options.sentinelCert),
    key: readSettingFile("sentinelKey", options.sentinelKey),
    ca: options.sentinelCa === undefined ? undefined : readSettingFile("sentinelCa", options.sentinelCa),
  };
}

function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "").toLowerCase();
  return bare === "localhost" || bare === "::1" || /^127\.\d+\.\d+\.\d+$/.test(bare);
}

/** "<name> <old-ip> <old-port> <new-ip> <new-port>" -> "old-ip:old-port". */
function oldMasterOf(message: string): string {
  const [, ip, port] = message.split(" ");
  return `${ip}:${port}`;
}
