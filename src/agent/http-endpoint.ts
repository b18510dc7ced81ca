import { readFileSync } from "node:fs";
import {
  createServer as createHttpServer,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import { Counter, collectDefaultMetrics, Gauge, Registry } from "prom-client";
import { parseAddress } from "../core/address.ts";
import { ConfigurationError, errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import { type CheckAnswer, type CheckName, type RoleFacts, runCheck } from "../core/role-check.ts";
import type { AgentContext } from "./context.ts";
import type { AgentOptions } from "./options.ts";

/**
 * The agent's optional HTTP endpoint (`--http-port`): Patroni's role checks, so HAProxy's
 * `option httpchk GET /primary` and load balancers' target groups send clients to the node that
 * takes writes (src/core/role-check.ts decides), a `/status` document, and Prometheus `/metrics`.
 * Answers are computed from what the agent's loops last saw, never from a new store or database
 * call, so a crowd of checkers costs nothing and a hung store cannot hang a check.
 */

/** Path → the check it answers (Patroni's names and aliases). */
const CHECK_PATHS: Readonly<Record<string, CheckName | "read-only">> = {
  "/primary": "primary",
  "/master": "primary",
  "/leader": "primary",
  "/read-write": "primary",
  "/replica": "replica",
  "/read-only": "read-only",
  "/health": "health",
};

/** Most checkers served at once; a check is one small request, so a handful are plenty. */
export const MAX_CONNECTIONS = 256;
/**
 * Most connections from one client address: a slow or idle client (slowloris) holding every slot
 * would turn the load balancer's checks away, so the primary would leave the pool. One HAProxy keeps
 * one check connection per server; a NAT or several balancers share an address with room to spare.
 */
export const MAX_CONNECTIONS_PER_ADDRESS = 32;
/** A request must arrive whole within this, so idle or slow sockets cannot pile up. */
const REQUEST_TIMEOUT_MS = 5_000;
/**
 * How often Node checks the request and headers timeouts (its default is 30 s, so a slowloris
 * connection would hold its slot for up to 35 s instead of 5).
 */
const TIMEOUT_CHECK_INTERVAL_MS = 1_000;

/** What the agent's context says, as the role checks read it. */
export function roleFactsOf(ctx: AgentContext): RoleFacts {
  const info = ctx.lastInfo;
  const link = info?.primary;
  const topology = ctx.lastTopology;
  // The crash watch hears the database die at once (its connection closes); the heartbeat cycle's
  // INFO may take up to the database timeout to fail. Either is the database down.
  const dbUp = ctx.dbUp && ctx.crash === undefined;
  return {
    dbUp,
    role: dbUp ? info?.role : undefined,
    confirmedPrimary: ctx.confirmed,
    unconfirmedReason: ctx.unconfirmedReason,
    fencedBecause: fencedBecause(ctx),
    topologyPrimary:
      topology?.primary_address !== undefined && topology.status !== "offline"
        ? topology.primary_address
        : undefined,
    link:
      link === undefined
        ? undefined
        : {
            primary: `${link.host}:${link.port}`,
            up: link.link === "up",
            lastIoSecondsAgo: link.lastIoSecondsAgo,
            syncing: link.syncInProgress,
          },
    maxIoSilenceSeconds: Math.max(1, Math.ceil(ctx.options.failureTimeoutMs / 1000)),
  };
}

function fencedBecause(ctx: AgentContext): string | undefined {
  if (ctx.state.state.fence !== undefined) return "the agent fenced this primary";
  if (ctx.appliedGuard === "fence") return "the write guard refuses writes";
  if (ctx.dbRestarted) return "the database restarted without its data while primary";
  if (ctx.monotonicNow() < ctx.promotionFenceUntil)
    return "freshly promoted: waiting out the old primary's guard window";
  return undefined;
}

export function answerCheck(path: string, facts: RoleFacts): CheckAnswer | undefined {
  const check = CHECK_PATHS[path];
  if (check === undefined) return undefined;
  if (check !== "read-only") return runCheck(check, facts);
  const primary = runCheck("primary", facts);
  return primary.ok ? primary : runCheck("replica", facts);
}

/** The agent's metrics, read from its context at each scrape, plus the counters its loops bump. */
export class AgentMetrics {
  readonly registry = new Registry();
  readonly commands: Counter<"outcome">;
  readonly storeErrors: Counter<"operation">;

  constructor(ctx: AgentContext) {
    const registers = [this.registry];
    this.registry.setDefaultLabels({ shard: ctx.shard, node: ctx.nodeId });
    collectDefaultMetrics({ register: this.registry, prefix: "shardguard_agent_" });
    this.commands = new Counter({
      name: "shardguard_agent_commands_total",
      help: "Commands received from the controller, by outcome (applied, ignored, refused, rejected, failed).",
      labelNames: ["outcome"],
      registers,
    });
    this.storeErrors = new Counter({
      name: "shardguard_agent_store_errors_total",
      help: "Coordination store calls that failed or timed out, by operation.",
      labelNames: ["operation"],
      registers,
    });
    const gauge = (name: string, help: string, read: () => number | undefined) =>
      new Gauge({
        name,
        help,
        registers,
        collect() {
          const value = read();
          if (value !== undefined) this.set(value);
        },
      });
    new Gauge({
      name: "shardguard_agent_role",
      help: "1 for the database's role as last read (primary or replica), 0 for the other.",
      labelNames: ["role"],
      registers,
      collect() {
        const role = ctx.dbUp ? ctx.lastInfo?.role : undefined;
        this.set({ role: "primary" }, role === "primary" ? 1 : 0);
        this.set({ role: "replica" }, role === "replica" ? 1 : 0);
      },
    });
    new Gauge({
      name: "shardguard_agent_check",
      help: "1 when the HTTP role check would answer 200 (primary, replica, health).",
      labelNames: ["check"],
      registers,
      collect() {
        const facts = roleFactsOf(ctx);
        for (const check of ["primary", "replica", "health"] as const) {
          this.set({ check }, runCheck(check, facts).ok ? 1 : 0);
        }
      },
    });
    gauge("shardguard_agent_fenced", "1 while this node's writes are fenced.", () =>
      fencedBecause(ctx) === undefined ? 0 : 1,
    );
    gauge("shardguard_agent_epoch", "The highest topology epoch this agent obeyed.", () => ctx.highestEpoch);
    gauge(
      "shardguard_agent_topology_epoch",
      "The epoch of the topology last read.",
      () => ctx.lastTopology?.epoch,
    );
    gauge(
      "shardguard_agent_heartbeat_age_seconds",
      "Seconds since the last heartbeat write that succeeded.",
      () => (ctx.monotonicNow() - ctx.lastHeartbeatWrittenAt) / 1000,
    );
    gauge("shardguard_agent_database_up", "1 while the database answers.", () => (ctx.dbUp ? 1 : 0));
    gauge("shardguard_agent_store_up", "1 while the coordination store answers.", () =>
      ctx.storeUp ? 1 : 0,
    );
    gauge("shardguard_agent_replication_offset_bytes", "The database's replication offset.", () =>
      ctx.dbUp ? ctx.lastInfo?.offset : undefined,
    );
    gauge(
      "shardguard_agent_primary_link_up",
      "A replica's link to its primary: 1 up, 0 down (absent on a primary).",
      () => (ctx.lastInfo?.primary === undefined ? undefined : ctx.lastInfo.primary.link === "up" ? 1 : 0),
    );
    gauge("shardguard_agent_crash_reported", "1 while this agent reports its database crashed.", () =>
      ctx.crash === undefined ? 0 : 1,
    );
  }
}

/** The HTTP server. */
export class HttpEndpoint {
  readonly #ctx: AgentContext;
  readonly #server: Server;
  readonly #bind: string;
  readonly #port: number;
  readonly #logger: Logger;
  readonly metrics: AgentMetrics;
  #address: string | undefined;

  constructor(ctx: AgentContext, options: AgentOptions, logger: Logger) {
    this.#ctx = ctx;
    this.#logger = logger;
    this.metrics = new AgentMetrics(ctx);
    this.#bind = options.httpBind ?? parseAddress(ctx.address).host;
    this.#port = options.httpPort ?? 0;
    const handler = (request: IncomingMessage, response: ServerResponse) => {
      this.#handle(request, response).catch((error: unknown) => {
        logger.warn("http request failed", { path: request.url, error: errorMessage(error) });
        if (!response.headersSent) response.writeHead(500, { "content-type": "text/plain" });
        response.end("internal error\n");
      });
    };
    const serverOptions = { connectionsCheckingInterval: TIMEOUT_CHECK_INTERVAL_MS };
    this.#server = options.httpTls
      ? createHttpsServer({ ...tlsOf(options), ...serverOptions }, handler)
      : createHttpServer(serverOptions, handler);
    this.#server.maxConnections = MAX_CONNECTIONS;
    const perAddress = new Map<string, number>();
    this.#server.on("connection", (socket: Socket) => {
      const address = socket.remoteAddress ?? "";
      const open = (perAddress.get(address) ?? 0) + 1;
      if (open > MAX_CONNECTIONS_PER_ADDRESS) {
        socket.destroy();
        return;
      }
      perAddress.set(address, open);
      socket.once("close", () => {
        const left = (perAddress.get(address) ?? 1) - 1;
        if (left > 0) perAddress.set(address, left);
        else perAddress.delete(address);
      });
    });
    this.#server.requestTimeout = REQUEST_TIMEOUT_MS;
    this.#server.headersTimeout = REQUEST_TIMEOUT_MS;
    this.#server.keepAliveTimeout = REQUEST_TIMEOUT_MS;
  }

  /** host:port it listens on, once listening. */
  get address(): string | undefined {
    return this.#address;
  }

  async listen(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.#server.once("error", reject);
      this.#server.listen(this.#port, this.#bind, () => {
        this.#server.off("error", reject);
        resolve();
      });
    });
    const { port } = this.#server.address() as AddressInfo;
    this.#address = `${this.#bind}:${port}`;
    this.#logger.info("http endpoint listening", { address: this.#address });
  }

  async close(): Promise<void> {
    if (!this.#server.listening) return;
    await new Promise<void>((resolve) => {
      this.#server.close(() => resolve());
      this.#server.closeAllConnections();
    });
  }

  async #handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const path = (request.url ?? "/").split("?")[0] ?? "/";
    const head = request.method === "HEAD";
    if (request.method !== "GET" && !head) {
      response.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain" });
      response.end("method not allowed\n");
      return;
    }
    if (path === "/metrics") {
      const body = await this.metrics.registry.metrics();
      response.writeHead(200, { "content-type": this.metrics.registry.contentType });
      response.end(head ? undefined : body);
      return;
    }
    const facts = roleFactsOf(this.#ctx);
    if (path === "/status" || path === "/") {
      const body = `${JSON.stringify(this.#status(facts))}\n`;
      response.writeHead(200, { "content-type": "application/json" });
      response.end(head ? undefined : body);
      return;
    }
    const answer = answerCheck(path, facts);
    if (answer === undefined) {
      response.writeHead(404, { "content-type": "text/plain" });
      response.end(head ? undefined : "not found\n");
      return;
    }
    response.writeHead(answer.ok ? 200 : 503, { "content-type": "text/plain" });
    response.end(head ? undefined : `${answer.reason}\n`);
  }

  #status(facts: RoleFacts) {
    const ctx = this.#ctx;
    const topology = ctx.lastTopology;
    return {
      shard: ctx.shard,
      node: ctx.nodeId,
      address: ctx.address,
      role: facts.role ?? null,
      epoch: ctx.highestEpoch,
      fenced: facts.fencedBecause ?? null,
      database_up: ctx.dbUp,
      store_up: ctx.storeUp,
      ms_since_heartbeat_written: Math.round(ctx.monotonicNow() - ctx.lastHeartbeatWrittenAt),
      replication_offset: ctx.dbUp ? (ctx.lastInfo?.offset ?? null) : null,
      primary_link: facts.link ?? null,
      topology:
        topology === undefined
          ? null
          : { epoch: topology.epoch, status: topology.status, primary: topology.primary_node_id ?? null },
      checks: {
        primary: runCheck("primary", facts),
        replica: runCheck("replica", facts),
        health: runCheck("health", facts),
      },
    };
  }
}

function tlsOf(options: AgentOptions): { cert: Buffer; key: Buffer } {
  const read = (file: string | undefined, what: string) => {
    if (file === undefined) throw new ConfigurationError(`--http-tls needs ${what}`);
    try {
      return readFileSync(file);
    } catch (error) {
      throw new ConfigurationError(`cannot read ${what} ${file}: ${errorMessage(error)}`);
    }
  };
  return { cert: read(options.httpCert, "--http-cert"), key: read(options.httpKey, "--http-key") };
}
