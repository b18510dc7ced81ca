import { parseAddress } from "./address.ts";
import { isAnswerCurrent, isReportCurrent } from "./freshness.ts";
import type { Heartbeat, Topology } from "./model.ts";
import { offsetAgeMs } from "./node-age.ts";

/**
 * What the agent's Sentinel-protocol endpoint answers for a given shard state (docs/sentinel.md).
 * Pure: the adapter (src/agent/sentinel-server.ts) builds a view from the snapshot the agent read,
 * asks here, and encodes the reply in RESP2 or RESP3.
 *
 * The shard id is the Sentinel "master name". The one deliberate difference from Sentinel: while
 * the topology is failing over or offline there is no master to give, so
 * `get-master-addr-by-name` answers null (Sentinel answers the old address until the promotion is
 * confirmed) and `masters` flags the entry `s_down,o_down`; clients then retry discovery.
 */

/** A protocol-neutral reply; maps become flat arrays in RESP2. */
export type SentinelReply =
  | { readonly type: "status"; readonly value: string }
  | { readonly type: "error"; readonly message: string }
  | { readonly type: "integer"; readonly value: number }
  | { readonly type: "bulk"; readonly value: string }
  /** RESP2 `$-1`, RESP3 `_`. */
  | { readonly type: "null" }
  /** RESP2 `*-1`, RESP3 `_`: Sentinel's answer for an unknown master name. */
  | { readonly type: "nullArray" }
  | { readonly type: "array"; readonly items: readonly SentinelReply[] }
  | { readonly type: "map"; readonly entries: ReadonlyArray<readonly [string, SentinelReply]> };

export const reply = {
  status: (value: string): SentinelReply => ({ type: "status", value }),
  error: (message: string): SentinelReply => ({ type: "error", message }),
  integer: (value: number): SentinelReply => ({ type: "integer", value }),
  bulk: (value: string): SentinelReply => ({ type: "bulk", value }),
  null: { type: "null" } as SentinelReply,
  nullArray: { type: "nullArray" } as SentinelReply,
  array: (items: readonly SentinelReply[]): SentinelReply => ({ type: "array", items }),
  /** String-valued fields (Sentinel sends every field of an instance as a bulk string). */
  fields: (fields: ReadonlyArray<readonly [string, string | number]>): SentinelReply => ({
    type: "map",
    entries: fields.map(([key, value]) => [key, { type: "bulk", value: String(value) }] as const),
  }),
};

/** What the adapter knows when it answers: the last shard snapshot the agent read. */
export interface SentinelView {
  readonly shard: string;
  /** undefined before the controller initialised the shard. */
  readonly topology: Topology | undefined;
  readonly nodes: readonly Heartbeat[];
  /** This agent's node id (its Sentinel run id). */
  readonly selfNodeId: string;
  /** ms on the AWS-aligned clock (heartbeat freshness). */
  readonly nowMs: number;
  /** A heartbeat older than this reports its node down (`s_down`). */
  readonly failureTimeoutMs: number;
}

export interface Endpoint {
  readonly nodeId: string;
  readonly host: string;
  readonly port: number;
}

/** The master as the topology gives it to clients. */
export type MasterState =
  /** No topology yet (the controller has not initialised the shard). */
  | { readonly kind: "unknown" }
  /** online or paused (maintenance): the primary serves. */
  | { readonly kind: "serving"; readonly primary: Endpoint }
  /** failing over or offline: no master to give; `last` is the address the topology still names. */
  | { readonly kind: "down"; readonly last: Endpoint | undefined; readonly failingOver: boolean };

function endpoint(nodeId: string, address: string): Endpoint {
  return { nodeId, ...parseAddress(address) };
}

export function masterState(topology: Topology | undefined): MasterState {
  if (topology === undefined) return { kind: "unknown" };
  const named =
    topology.primary_node_id !== undefined && topology.primary_address !== undefined
      ? endpoint(topology.primary_node_id, topology.primary_address)
      : undefined;
  if ((topology.status === "online" || topology.status === "paused") && named) {
    return { kind: "serving", primary: named };
  }
  return { kind: "down", last: named, failingOver: topology.status === "failing_over" };
}

/**
 * The node's report stands: its database answered within its keepalive plus the failure timeout
 * (a quiet replica writes only on a change and at its keepalive), and is up.
 */
function fresh(heartbeat: Heartbeat, view: SentinelView): boolean {
  return isAnswerCurrent(heartbeat, view, view.nowMs) && heartbeat.db_status === "up";
}

function agentFresh(heartbeat: Heartbeat, view: SentinelView): boolean {
  return isReportCurrent(heartbeat, view, view.nowMs);
}

/** Other agents of the shard that serve the protocol (fresh or not; flags say which). */
function peerSentinels(view: SentinelView): Heartbeat[] {
  return view.nodes.filter((node) => node.sentinel_address !== undefined && node.node_id !== view.selfNodeId);
}

function replicasOf(view: SentinelView, primaryId: string | undefined): Heartbeat[] {
  return view.nodes
    .filter((node) => node.role === "replica" && node.node_id !== primaryId)
    .sort((a, b) => a.node_id.localeCompare(b.node_id));
}

function masterFields(view: SentinelView): SentinelReply | undefined {
  const topology = view.topology;
  const state = masterState(topology);
  if (topology === undefined || state.kind === "unknown") return undefined;
  const primary = state.kind === "serving" ? state.primary : state.last;
  if (primary === undefined) return undefined;
  const flags =
    state.kind === "serving"
      ? "master"
      : `master,s_down,o_down${state.failingOver ? ",failover_in_progress" : ""}`;
  const replicas = replicasOf(view, primary.nodeId).filter((node) => fresh(node, view));
  const sentinels = peerSentinels(view).filter((node) => agentFresh(node, view));
  return reply.fields([
    ["name", view.shard],
    ["ip", primary.host],
    ["port", primary.port],
    ["runid", primary.nodeId],
    ["flags", flags],
    ["down-after-milliseconds", view.failureTimeoutMs],
    ["config-epoch", topology.epoch],
    ["num-slaves", replicas.length],
    ["num-other-sentinels", sentinels.length],
    // The controller decides with its own quorum setting; one agent's answer stands for it.
    ["quorum", 1],
    ["parallel-syncs", replicas.length],
    ["shardguard-status", topology.status],
  ]);
}

function replicaFields(view: SentinelView, node: Heartbeat): SentinelReply {
  const { host, port } = parseAddress(node.node_address);
  const up = fresh(node, view);
  const followed = node.primary_node_id
    ? (view.nodes.find((other) => other.node_id === node.primary_node_id)?.node_address ??
      (view.topology?.primary_node_id === node.primary_node_id ? view.topology.primary_address : undefined))
    : undefined;
  const master = followed ? parseAddress(followed) : { host: "?", port: 0 };
  return reply.fields([
    ["name", node.node_address],
    ["ip", host],
    ["port", port],
    ["runid", node.node_id],
    ["flags", up ? "slave" : "slave,s_down,disconnected"],
    ["role-reported", "slave"],
    ["master-link-status", node.primary_link === "up" ? "ok" : "err"],
    ["master-host", master.host],
    ["master-port", master.port],
    ["slave-priority", node.priority],
    // What is known and how old it is: a quiet replica's offset is as old as its last report.
    ["slave-repl-offset", node.last_txn_id],
    ["info-refresh", Math.max(0, Math.round(offsetAgeMs(node, view.nowMs)))],
    // Known only while the link was up at that report; Sentinel's "down since" is not reported.
    ...(node.primary_link === "up" ? ([["master-link-down-time", 0]] as const) : []),
  ]);
}

function sentinelFields(view: SentinelView, node: Heartbeat): SentinelReply {
  const { host, port } = parseAddress(node.sentinel_address ?? node.node_address);
  return reply.fields([
    ["name", node.node_id],
    ["ip", host],
    ["port", port],
    ["runid", node.node_id],
    ["flags", agentFresh(node, view) ? "sentinel" : "sentinel,s_down,disconnected"],
  ]);
}

const NO_SUCH_MASTER = reply.error("ERR No such master with that name");

const UNSUPPORTED = new Set([
  "failover",
  "reset",
  "monitor",
  "remove",
  "set",
  "config",
  "flushconfig",
  "simulate-failure",
  "debug",
]);

/**
 * The reply to `ROLE` or `SENTINEL <subcommand> ...` (args without the command name; names are
 * case-insensitive, the master name is not). Anything else this endpoint does not answer.
 */
export function answerSentinel(command: string, args: readonly string[], view: SentinelView): SentinelReply {
  const name = command.toLowerCase();
  if (name === "role") return reply.array([reply.bulk("sentinel"), reply.array([reply.bulk(view.shard)])]);
  if (name !== "sentinel") return reply.error(`ERR unknown command '${command}'`);
  const sub = args[0]?.toLowerCase();
  const master = args[1];
  const arity = (count: number) =>
    args.length === count
      ? undefined
      : reply.error(`ERR wrong number of arguments for 'sentinel|${sub}' command`);
  switch (sub) {
    case "get-master-addr-by-name": {
      const wrong = arity(2);
      if (wrong) return wrong;
      if (master !== view.shard) return reply.nullArray;
      const state = masterState(view.topology);
      if (state.kind !== "serving") return reply.nullArray;
      return reply.array([reply.bulk(state.primary.host), reply.bulk(String(state.primary.port))]);
    }
    case "masters": {
      const wrong = arity(1);
      if (wrong) return wrong;
      const entry = masterFields(view);
      return reply.array(entry ? [entry] : []);
    }
    case "master": {
      const wrong = arity(2);
      if (wrong) return wrong;
      const entry = master === view.shard ? masterFields(view) : undefined;
      return entry ?? NO_SUCH_MASTER;
    }
    case "replicas":
    case "slaves": {
      const wrong = arity(2);
      if (wrong) return wrong;
      if (master !== view.shard || view.topology === undefined) return NO_SUCH_MASTER;
      const state = masterState(view.topology);
      const primaryId =
        state.kind === "serving"
          ? state.primary.nodeId
          : state.kind === "down"
            ? state.last?.nodeId
            : undefined;
      return reply.array(replicasOf(view, primaryId).map((node) => replicaFields(view, node)));
    }
    case "sentinels": {
      const wrong = arity(2);
      if (wrong) return wrong;
      if (master !== view.shard || view.topology === undefined) return NO_SUCH_MASTER;
      return reply.array(peerSentinels(view).map((node) => sentinelFields(view, node)));
    }
    case "myid": {
      const wrong = arity(1);
      return wrong ?? reply.bulk(view.selfNodeId);
    }
    case undefined:
      return reply.error("ERR wrong number of arguments for 'sentinel' command");
    default:
      if (UNSUPPORTED.has(sub)) {
        return reply.error(
          `ERR SENTINEL ${sub.toUpperCase()} is not supported by Shardguard: the controller decides failovers (use shardguard switchover, pause or resume)`,
        );
      }
      return reply.error(`ERR unknown subcommand '${args[0]}'. Try SENTINEL HELP.`);
  }
}

/**
 * Every channel an event is ever published on (`sentinelEvents`). A pattern subscription is
 * matched against these once, when it is made, never against each event.
 */
export const SENTINEL_CHANNELS = ["+switch-master", "+sdown", "+odown", "-sdown", "-odown"] as const;

export type SentinelChannel = (typeof SENTINEL_CHANNELS)[number];

/** One Sentinel event: published on channel `channel` with payload `message`. */
export interface SentinelEvent {
  readonly channel: SentinelChannel;
  readonly message: string;
}

/** What the event stream remembers between two views. */
export interface EventMemory {
  readonly state: MasterState;
  /** The last primary given to clients: the "old" address of the next `+switch-master`. */
  readonly lastServed: Endpoint | undefined;
}

export const INITIAL_EVENT_MEMORY: EventMemory = { state: { kind: "unknown" }, lastServed: undefined };

function instance(shard: string, at: Endpoint): string {
  return `master ${shard} ${at.host} ${at.port}`;
}

function sameEndpoint(a: Endpoint, b: Endpoint): boolean {
  return a.nodeId === b.nodeId && a.host === b.host && a.port === b.port;
}

/**
 * The events a move from the remembered state to `next` publishes, as Sentinel names them:
 * `+sdown`/`+odown` when the master stops being served (failing over, offline), `-sdown`/`-odown`
 * when the same master is served again, `+switch-master <name> <old-ip> <old-port> <new-ip>
 * <new-port>` when another one is.
 */
export function sentinelEvents(
  shard: string,
  memory: EventMemory,
  next: MasterState,
): { memory: EventMemory; events: SentinelEvent[] } {
  const events: SentinelEvent[] = [];
  const previous = memory.state;
  if (next.kind === "serving") {
    // An agent started mid-failover never served the old primary: the topology still names it.
    const old = memory.lastServed ?? (previous.kind === "down" ? previous.last : undefined);
    if (old !== undefined && !sameEndpoint(old, next.primary)) {
      const payload = `${shard} ${old.host} ${old.port} ${next.primary.host} ${next.primary.port}`;
      events.push({ channel: "+switch-master", message: payload });
    } else if (old !== undefined && previous.kind === "down") {
      events.push({ channel: "-sdown", message: instance(shard, old) });
      events.push({ channel: "-odown", message: instance(shard, old) });
    }
    return { memory: { state: next, lastServed: next.primary }, events };
  }
  if (next.kind === "down" && previous.kind === "serving") {
    events.push({ channel: "+sdown", message: instance(shard, previous.primary) });
    events.push({ channel: "+odown", message: instance(shard, previous.primary) });
  }
  return { memory: { state: next, lastServed: memory.lastServed }, events };
}
