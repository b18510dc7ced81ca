import { splitAddress } from "../core/sentinel.ts";
import type { AgentDeps } from "./context.ts";
import type { AgentLogger } from "./log.ts";
import type { AgentOptions } from "./options.ts";
import { SentinelFeed } from "./sentinel-feed.ts";
import { announcedAddress, SentinelServer } from "./sentinel-server.ts";

/**
 * How often, at most, a client's question makes the endpoint read the shard itself rather than
 * answer from the heartbeat loop's last snapshot: bounds both the staleness of an answer and the
 * table reads a crowd of reconnecting clients can cause (5 per second per agent).
 */
const REFRESH_MS = 200;

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
  #announced: string | undefined;

  constructor(init: { options: AgentOptions; nodeId: string; deps: AgentDeps; logger: AgentLogger }) {
    const { options, deps, logger } = init;
    this.#advertised = options.address ?? options.redis;
    this.#bind = options.sentinelBind ?? splitAddress(this.#advertised).host;
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
      port: options.sentinelPort ?? 0,
      password: options.sentinelPassword,
      feed: this.#feed,
      logger,
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
    const { port } = await this.#server.listen();
    this.#announced = announcedAddress(this.#bind, port, this.#advertised);
  }

  async close(): Promise<void> {
    this.#feed.stop();
    await this.#server.close();
  }
}
