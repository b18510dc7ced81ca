import type { FailoverConfig } from "./config.ts";
import { agentAgeMs, heartbeatAgeMs, isAgentHeard, isFresh, isReportCurrent } from "./freshness.ts";
import type { Heartbeat, Topology } from "./model.ts";

/**
 * What a node's report says now and how old it is, for the views that show reports to people and
 * clients (`shardguard status`, the Sentinel endpoint's replica answers). The clock predicates are
 * the decision's own (freshness.ts); this file only names what follows from them for display: a
 * quiet replica's offset is as old as its last write, so a lag is computed only between reports
 * that can be compared, and a node's role is the one the topology gives it, not the one its last
 * report claims.
 */

/**
 * How much the node's report says about now: `heard` (its agent wrote within the failure timeout),
 * `quiet` (a replica silent within its keepalive: its report stands, its offset is as old as its
 * write), `stale` (neither: a primary is judged by the failure timeout alone, as `decide()` does).
 */
export type ReportState = "heard" | "quiet" | "stale";

export function reportState(node: Heartbeat, config: FailoverConfig, now: number): ReportState {
  if (isAgentHeard(node, config, now)) return "heard";
  return node.role === "replica" && isReportCurrent(node, config, now) ? "quiet" : "stale";
}

/** ms since the node's offset was read: its database's last answer (negative: dated ahead of `now`). */
export function offsetAgeMs(node: Heartbeat, now: number): number {
  return heartbeatAgeMs(node, now);
}

/** ms since the node's agent last wrote, whatever its database's state. */
export { agentAgeMs };

/** A replica's lag behind the primary, or why it cannot be told from the two reports. */
export type LagReading =
  | { readonly known: true; readonly bytes: number }
  | { readonly known: false; readonly code: UnknownLag; readonly why: string };

/** Why a lag is unknown; `read_before_primary` is the one a fresh report from the replica fixes. */
export type UnknownLag =
  | "no_primary"
  | "primary_not_recent"
  | "not_recent"
  | "other_lineage"
  | "read_before_primary";

/**
 * The replica's lag behind `primary` in offset bytes, from the two reports, when they can be
 * compared: both databases answered within the failure timeout, on one lineage, and the replica's
 * offset was read no earlier than the primary's. Then `primary − replica` is never more than the lag
 * at either reading (both offsets only grow): a lower bound of the replica's lag when it wrote, and
 * the honest number for an in-sync replica (about 0). A replica read before the primary counts the
 * writes in between as lag — 50 KB for an in-sync quiet replica at 2.5 KB/s and 20 s — so its lag
 * is unknown instead, with the reason.
 */
export function comparableLag(
  primary: Heartbeat | undefined,
  replica: Heartbeat,
  config: FailoverConfig,
  now: number,
): LagReading {
  if (primary === undefined) return { known: false, code: "no_primary", why: "no primary report" };
  const stale = (node: Heartbeat, whose: string): string | undefined => {
    if (node.db_status !== "up") return `${whose} database is down`;
    if (!isFresh(node, config, now)) return `${whose} offset was read ${describeAge(offsetAgeMs(node, now))}`;
    return undefined;
  };
  const primaryStale = stale(primary, "the primary's");
  if (primaryStale !== undefined) return { known: false, code: "primary_not_recent", why: primaryStale };
  const replicaStale = stale(replica, "its");
  if (replicaStale !== undefined) return { known: false, code: "not_recent", why: replicaStale };
  if (replica.repl_id !== primary.repl_id) {
    return { known: false, code: "other_lineage", why: "another lineage than the primary's" };
  }
  const earlierMs = (primary.last_updated - replica.last_updated) / 1000;
  if (earlierMs > 0) {
    return {
      known: false,
      code: "read_before_primary",
      why: `its offset was read ${describeAge(earlierMs).replace(" ago", "")} before the primary's`,
    };
  }
  return { known: true, bytes: Math.max(0, primary.last_txn_id - replica.last_txn_id) };
}

/**
 * The role the topology gives a node. `primary` only for the node the topology names whose
 * database answers as primary within the failure timeout, so one shard never shows two; a node
 * whose agent reports its database down is `failed` (the old primary after a kill: "last seen as
 * primary 1.7 s ago"); a node whose agent fell silent (neither heard nor quiet) is `unknown`; one
 * that still answers as primary where the topology names another is `unconfirmed`
 * (its agent fences it), as is the topology's named primary answering as a replica; a failover's
 * target until the failover completes is `promoting`.
 */
export type TopologyRole = "primary" | "replica" | "promoting" | "unconfirmed" | "failed" | "unknown";

export interface RoleReading {
  readonly role: TopologyRole;
  /** What the report says when the role differs from it: "last seen as primary 1.7 s ago". */
  readonly note: string | undefined;
}

export function topologyRole(
  node: Heartbeat,
  topology: Topology | undefined,
  config: FailoverConfig,
  now: number,
): RoleReading {
  const named = topology?.primary_node_id === node.node_id;
  const target =
    topology?.status === "failing_over" && topology.failover?.new_primary_node_id === node.node_id;
  const answering = node.db_status === "up" && isFresh(node, config, now);
  const lastSeen = `last seen as ${node.role} ${describeAge(offsetAgeMs(node, now))}`;
  if (!answering) {
    if (node.db_status === "down") return { role: "failed", note: lastSeen };
    if (reportState(node, config, now) === "quiet") return { role: "replica", note: undefined };
    return { role: "unknown", note: `agent silent; ${lastSeen}` };
  }
  if (node.role === "primary") {
    if (named && !target) return { role: "primary", note: undefined };
    if (target) return { role: "promoting", note: "answers as primary; the failover is not complete" };
    const other = topology?.primary_node_id;
    return {
      role: "unconfirmed",
      note: other
        ? `answers as primary; the topology names ${other} (its agent fences it)`
        : `answers as primary; the shard is ${topology?.status ?? "not initialized"}`,
    };
  }
  if (target) return { role: "promoting", note: "the failover's target; answers as replica" };
  if (named) return { role: "unconfirmed", note: "the topology names it primary; it answers as replica" };
  return { role: "replica", note: undefined };
}

/** "0.2 s ago", "19 s ago", "3 min ago"; "1.2 s ahead" for a time dated ahead of the reader. */
export function describeAge(ms: number): string {
  const magnitude = Math.abs(ms);
  const text =
    magnitude < 10_000
      ? `${(magnitude / 1000).toFixed(1)} s`
      : magnitude < 120_000
        ? `${Math.round(magnitude / 1000)} s`
        : `${Math.round(magnitude / 60_000)} min`;
  return ms < 0 ? `${text} ahead` : `${text} ago`;
}
