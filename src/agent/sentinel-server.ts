import { createServer, type Server, type Socket } from "node:net";
import { createServer as createTlsServer } from "node:tls";
import { parseAddress } from "../core/address.ts";
import { errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import {
  type EventMemory,
  INITIAL_EVENT_MEMORY,
  type MasterState,
  reply as replies,
  type SentinelEvent,
  sentinelEvents,
} from "../core/sentinel.ts";
import type { SentinelFeed } from "./sentinel-feed.ts";
import { encodeFrame, type Frame, RequestReader } from "./sentinel-resp.ts";
import { SentinelSession } from "./sentinel-session.ts";
import { AuthThrottle, type AuthThrottlePolicy } from "./sentinel-throttle.ts";

export interface SentinelLimits {
  readonly maxConnections: number;
  readonly maxPendingBytes: number;
  readonly maxArguments: number;
  readonly maxQueuedCommands: number;
  readonly maxOutputBytes: number;
  readonly idleTimeoutMs: number;
}

/** Limits that keep a misbehaving or hostile client from costing the agent more than a bounded amount. */
export const SENTINEL_LIMITS: SentinelLimits = {
  /** Connections beyond this are answered `-ERR max number of clients reached` and closed. */
  maxConnections: 4096,
  /** An unfinished command may not buffer more than this (Sentinel commands are a few hundred bytes). */
  maxPendingBytes: 64 * 1024,
  maxArguments: 64,
  /** Parsed commands waiting for their turn before the connection stops reading. */
  maxQueuedCommands: 32,
  /** Replies and messages a client has not read; past it the connection is closed (slow subscriber). */
  maxOutputBytes: 1024 * 1024,
  /**
   * A connection that is not subscribed and sends nothing for this long is closed, so idle
   * connections cannot hold the slots; subscribers are idle by nature and are kept. 0 = never.
   */
  idleTimeoutMs: 60_000,
};

/** TLS for the endpoint: its own server certificate, and optionally client certificates. */
export interface SentinelTls {
  readonly cert: string;
  readonly key: string;
  /** When set, clients must present a certificate this CA bundle (PEM) signed. */
  readonly ca?: string | undefined;
}

export interface SentinelServerOptions {
  readonly shard: string;
  readonly host: string;
  /** 0 picks a free port (in-process tests). */
  readonly port: number;
  readonly password: string | undefined;
  /** Serve TLS with this certificate and key (PEM) instead of plain TCP. */
  readonly tls?: SentinelTls | undefined;
  readonly feed: SentinelFeed;
  readonly logger: Logger;
  readonly limits?: Partial<SentinelLimits>;
  /** Back-off for wrong passwords (per client address). @default AUTH_THROTTLE_POLICY */
  readonly authThrottle?: Partial<AuthThrottlePolicy>;
  /** Called with the events of each topology move, after they were published. */
  readonly onEvents?: (events: readonly SentinelEvent[]) => void;
}

interface Connection {
  readonly socket: Socket;
  readonly session: SentinelSession;
  readonly queue: Array<readonly string[] | { fatal: string }>;
  busy: boolean;
  closing: boolean;
}

/**
 * The agent's Sentinel-protocol endpoint (docs/sentinel.md): a TCP server whose answers come
 * from the SentinelFeed (the shard as the agent reads it) through the pure core
 * (src/core/sentinel.ts), and which publishes `+switch-master`, `+sdown`/`-sdown`,
 * `+odown`/`-odown` to subscribers when the topology moves.
 */
export class SentinelServer {
  readonly #options: SentinelServerOptions;
  readonly #limits: SentinelLimits;
  readonly #server: Server;
  readonly #connections = new Set<Connection>();
  readonly #throttle: AuthThrottle;
  #nextId = 1;
  #memory: EventMemory = INITIAL_EVENT_MEMORY;
  #lastRefusalLog = Number.NEGATIVE_INFINITY;
  #address: { host: string; port: number } | undefined;

  constructor(options: SentinelServerOptions) {
    this.#options = options;
    this.#limits = { ...SENTINEL_LIMITS, ...options.limits };
    this.#throttle = new AuthThrottle(() => performance.now(), options.authThrottle);
    const socketOptions = { noDelay: true, keepAlive: true, keepAliveInitialDelay: 60_000 };
    const accept = (socket: Socket) => this.#accept(socket);
    const tls = options.tls;
    // A TLS client is accepted once its handshake is done; one that never finishes it is dropped after 5 s.
    this.#server = tls
      ? createTlsServer(
          {
            ...socketOptions,
            cert: tls.cert,
            key: tls.key,
            handshakeTimeout: 5000,
            ...(tls.ca === undefined ? {} : { ca: tls.ca, requestCert: true, rejectUnauthorized: true }),
          },
          accept,
        )
      : createServer(socketOptions, accept);
    this.#server.on("error", (error) =>
      options.logger.error("sentinel endpoint error", { error: errorMessage(error) }),
    );
    options.feed.onSnapshot((state) => this.#observe(state));
    options.feed.watchWhile(() => this.subscribers > 0);
  }

  /** Where it listens, once `listen` resolved. */
  get address(): { host: string; port: number } | undefined {
    return this.#address;
  }

  get connections(): number {
    return this.#connections.size;
  }

  get subscribers(): number {
    let count = 0;
    for (const connection of this.#connections) if (connection.session.subscriptions > 0) count++;
    return count;
  }

  listen(): Promise<{ host: string; port: number }> {
    return new Promise((resolve, reject) => {
      const onError = (error: Error) => reject(error);
      this.#server.once("error", onError);
      this.#server.listen(this.#options.port, this.#options.host, () => {
        this.#server.off("error", onError);
        const bound = this.#server.address();
        const port = typeof bound === "object" && bound !== null ? bound.port : this.#options.port;
        this.#address = { host: this.#options.host, port };
        this.#options.logger.info("sentinel endpoint listening", { host: this.#options.host, port });
        resolve(this.#address);
      });
    });
  }

  /** Stops accepting, closes every client connection. Safe to call twice. */
  close(): Promise<void> {
    for (const connection of this.#connections) connection.socket.destroy();
    this.#connections.clear();
    return new Promise((resolve) => {
      if (!this.#server.listening) {
        resolve();
        return;
      }
      this.#server.close(() => resolve());
    });
  }

  #observe(state: MasterState): void {
    const { memory, events } = sentinelEvents(this.#options.shard, this.#memory, state);
    this.#memory = memory;
    for (const event of events) {
      this.#options.logger.info("sentinel event", { channel: event.channel, message: event.message });
      for (const connection of this.#connections) {
        for (const frame of connection.session.messagesFor(event.channel, event.message))
          this.#write(connection, frame);
      }
    }
    if (events.length > 0) this.#options.onEvents?.(events);
  }

  #accept(socket: Socket): void {
    socket.on("error", () => {
      // A client that reset its connection is gone; nothing to do but forget it.
    });
    if (this.#connections.size >= this.#limits.maxConnections) {
      const now = performance.now();
      if (now - this.#lastRefusalLog >= 30_000) {
        this.#lastRefusalLog = now;
        this.#options.logger.warn("sentinel endpoint: connection refused, limit reached", {
          maxConnections: this.#limits.maxConnections,
        });
      }
      socket.end(encodeFrame(replies.error("ERR max number of clients reached"), 2));
      socket.destroySoon();
      return;
    }
    const peer = socket.remoteAddress ?? "unknown";
    const throttle = this.#throttle;
    const session = new SentinelSession(this.#nextId++, {
      password: this.#options.password,
      view: () => this.#options.feed.view(),
      subscribed: () => void this.#options.feed.refresh(),
      authThrottle: {
        allowed: () => throttle.blockedFor(peer) === 0,
        failed: () => {
          throttle.failed(peer);
          const blockedMs = throttle.blockedFor(peer);
          if (blockedMs > 0)
            this.#options.logger.warn("sentinel endpoint: wrong passwords, address blocked", {
              client: peer,
              blockedMs,
            });
        },
        succeeded: () => throttle.succeeded(peer),
      },
    });
    const connection: Connection = { socket, session, queue: [], busy: false, closing: false };
    this.#connections.add(connection);
    this.#armIdleTimeout(connection);
    socket.on("timeout", () => {
      if (connection.session.subscriptions === 0) this.#end(connection);
    });
    const reader = new RequestReader({
      maxPendingBytes: this.#limits.maxPendingBytes,
      maxArguments: this.#limits.maxArguments,
      onCommand: (args) => this.#enqueue(connection, args),
      onFatal: (message) => this.#enqueue(connection, { fatal: message }),
    });
    socket.on("data", (chunk: Buffer) => reader.feed(chunk));
    socket.on("close", () => {
      connection.closing = true;
      this.#connections.delete(connection);
    });
  }

  #enqueue(connection: Connection, item: readonly string[] | { fatal: string }): void {
    if (connection.closing) return;
    connection.queue.push(item);
    if (connection.queue.length >= this.#limits.maxQueuedCommands) connection.socket.pause();
    if (!connection.busy) void this.#drain(connection);
  }

  async #drain(connection: Connection): Promise<void> {
    connection.busy = true;
    try {
      while (connection.queue.length > 0 && !connection.closing) {
        const item = connection.queue.shift() as readonly string[] | { fatal: string };
        if (connection.queue.length < this.#limits.maxQueuedCommands) connection.socket.resume();
        if ("fatal" in item) {
          this.#write(connection, replies.error(item.fatal));
          this.#end(connection);
          return;
        }
        let outcome: Awaited<ReturnType<SentinelSession["handle"]>>;
        try {
          outcome = await connection.session.handle(item);
        } catch (error) {
          outcome = { frames: [replies.error(`ERR shard topology unavailable: ${errorMessage(error)}`)] };
        }
        for (const frame of outcome.frames) this.#write(connection, frame);
        if (outcome.close) {
          this.#end(connection);
          return;
        }
        this.#armIdleTimeout(connection);
      }
    } finally {
      connection.busy = false;
    }
  }

  #write(connection: Connection, frame: Frame): void {
    if (connection.closing) return;
    connection.socket.write(encodeFrame(frame, connection.session.protocol));
    if (connection.socket.writableLength > this.#limits.maxOutputBytes) {
      this.#options.logger.warn("sentinel endpoint: closing a client that does not read its replies", {
        client: connection.session.id,
        pendingBytes: connection.socket.writableLength,
      });
      connection.closing = true;
      connection.socket.destroy();
    }
  }

  /** Subscribers wait for events, so only a connection with no subscription times out. */
  #armIdleTimeout(connection: Connection): void {
    const idle = connection.session.subscriptions === 0 ? this.#limits.idleTimeoutMs : 0;
    connection.socket.setTimeout(idle);
  }

  #end(connection: Connection): void {
    connection.closing = true;
    connection.queue.length = 0;
    connection.socket.destroySoon();
  }
}

/** host:port other agents and clients are told to reach this endpoint on. */
export function announcedAddress(bindHost: string, port: number, advertisedAddress: string): string {
  const wildcard = bindHost === "0.0.0.0" || bindHost === "::" || bindHost === "";
  return `${wildcard ? parseAddress(advertisedAddress).host : bindHost}:${port}`;
}
