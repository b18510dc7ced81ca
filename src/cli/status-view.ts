import { stripVTControlCharacters } from "node:util";
import pc from "picocolors";
import { MAX_CLOCK_SKEW_MS } from "../core/decide.ts";
import type { HistoryRecord } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";

export interface NodeStatus {
  readonly node_id: string;
  readonly role: string;
  readonly address: string;
  readonly last_txn_id: number;
  /**
   * Replication offset bytes behind the primary; undefined when there is no primary heartbeat, or
   * the node is quiet (its offset is as old as its last write).
   */
  readonly lag: number | undefined;
  /** Negative when the heartbeat is dated ahead of the reader's clock. */
  readonly heartbeat_age_ms: number;
  readonly db_status: string;
  readonly primary_link: string | undefined;
  /** A replica's own probe of its primary: ok, unreachable, restarted, fenced. */
  readonly primary_probe: string | undefined;
  readonly priority: number;
  readonly epoch: number;
  /** The longest its agent stays silent while nothing it reports changes (ms); 0 when unknown. */
  readonly keepalive_ms: number;
  /** Silent past the failure timeout, within its keepalive: its report stands. */
  readonly quiet: boolean;
  /** Silent past its keepalive and the failure timeout. */
  readonly stale: boolean;
}

export interface ShardStatus {
  readonly shard: string;
  readonly status: string;
  readonly epoch: number | undefined;
  readonly primary: { readonly node_id: string; readonly address: string } | undefined;
  readonly phase: string | undefined;
  readonly paused_reason: string | undefined;
  /**
   * What the primary's replicas say of it when its own heartbeat is stale: serving without its
   * agent's heartbeats (failsafe: a store outage for its agent, or its agent down), or fenced.
   */
  readonly primary_seen_by_replicas: string | undefined;
  readonly nodes: readonly NodeStatus[];
  readonly malformed: readonly { sk: string; field: string; reason: string }[];
}

/**
 * The operator's view of one shard, computed from one snapshot. `nowMs` is the AWS-aligned clock;
 * a node is quiet when its heartbeat is older than `failureTimeoutMs` but within its keepalive on top
 * of it (a replica following a fresh primary writes only on a change), stale when older than that.
 */
export function shardStatus(snapshot: ShardSnapshot, nowMs: number, failureTimeoutMs: number): ShardStatus {
  const topology = snapshot.topology;
  const primaryId = topology?.primary_node_id;
  const primaryBeat = snapshot.nodes.find((node) => node.node_id === primaryId);
  const nodes = snapshot.nodes
    .map((node): NodeStatus => {
      const age = nowMs - Math.floor(node.last_updated / 1000);
      // A primary is judged by the failure timeout alone, as decide() judges it.
      const keepalive = node.role === "primary" ? 0 : (node.keepalive_ms ?? 0);
      const stale = age > keepalive + failureTimeoutMs || age < -MAX_CLOCK_SKEW_MS;
      const quiet = !stale && age > failureTimeoutMs;
      return {
        node_id: node.node_id,
        role: node.role,
        address: node.node_address,
        last_txn_id: node.last_txn_id,
        lag: primaryBeat && !quiet ? Math.max(0, primaryBeat.last_txn_id - node.last_txn_id) : undefined,
        heartbeat_age_ms: age,
        db_status: node.db_status,
        primary_link: node.primary_link,
        primary_probe: node.primary_probe,
        priority: node.priority,
        epoch: node.epoch,
        keepalive_ms: keepalive,
        quiet,
        stale,
      };
    })
    .sort(
      (a, b) =>
        Number(b.role === "primary") - Number(a.role === "primary") || a.node_id.localeCompare(b.node_id),
    );
  return {
    shard: snapshot.shard,
    status: topology?.status ?? "unknown",
    epoch: topology?.epoch,
    primary:
      topology?.primary_node_id && topology.primary_address
        ? { node_id: topology.primary_node_id, address: topology.primary_address }
        : undefined,
    phase: topology?.status === "failing_over" ? topology.phase : undefined,
    paused_reason: topology?.paused_reason,
    primary_seen_by_replicas: primaryId ? seenByReplicas(primaryId, nodes) : undefined,
    nodes,
    malformed: snapshot.malformed.map((item) => ({ ...item })),
  };
}

/**
 * When the primary's heartbeat is stale but replicas' heartbeats are fresh, what those replicas
 * see: the database serving (failsafe: the agent is cut off from the store or down, and the
 * replica-set guard is the fence), or refusing writes (fenced by its agent: the controller
 * replaces it). Undefined while the primary's heartbeat is fresh or no replica is heard.
 */
export function seenByReplicas(primaryId: string, nodes: readonly NodeStatus[]): string | undefined {
  const primary = nodes.find((node) => node.node_id === primaryId);
  if (primary !== undefined && !primary.stale) return undefined;
  const replicas = nodes.filter(
    (node) => node.node_id !== primaryId && !node.stale && node.db_status === "up",
  );
  if (replicas.length === 0) return undefined;
  const by = (probe: string) =>
    replicas.filter((node) => node.primary_probe === probe).map((node) => node.node_id);
  const serving = replicas
    .filter((node) => node.primary_link === "up" && (node.primary_probe ?? "ok") === "ok")
    .map((node) => node.node_id);
  const fenced = by("fenced");
  if (fenced.length > 0) {
    return `fenced: ${fenced.join(", ")} find ${primaryId} refusing every write (its agent fenced it); the controller replaces it`;
  }
  if (serving.length * 2 > replicas.length) {
    return `failsafe: ${primaryId} serves without its agent's heartbeats (its agent is cut off from the store, or down); ${serving.join(", ")} see it serving and are its write guard`;
  }
  const down = replicas.filter((node) => !serving.includes(node.node_id)).map((node) => node.node_id);
  return `down: ${down.join(", ")} report ${primaryId} unreachable, restarted or its link down`;
}

const STATUS_COLOUR: Record<string, (text: string) => string> = {
  online: pc.green,
  paused: pc.yellow,
  failing_over: pc.yellow,
  offline: pc.red,
  unknown: pc.red,
};

/** Aligns rows of cells into columns. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  // Widths ignore colour escapes so coloured cells still align.
  const visible = (text: string) => stripVTControlCharacters(text).length;
  const widths = header.map((cell, index) =>
    Math.max(visible(cell), ...rows.map((row) => visible(row[index] ?? ""))),
  );
  const line = (cells: readonly string[]) =>
    cells
      .map((cell, index) => cell + " ".repeat((widths[index] ?? 0) - visible(cell)))
      .join("  ")
      .trimEnd();
  return [pc.bold(line(header)), ...rows.map(line)].join("\n");
}

export function formatDuration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 120_000) return `${(ms / 1000).toFixed(1)}s`;
  return `${Math.round(ms / 60_000)}m`;
}

/** A heartbeat's age; one dated ahead of the reader's clock shows as "+1.2s ahead". */
function formatAge(ms: number): string {
  return ms < 0 ? `+${formatDuration(-ms)} ahead` : formatDuration(ms);
}

export function renderShardStatus(status: ShardStatus): string {
  const colour = STATUS_COLOUR[status.status] ?? ((text: string) => text);
  const headline = [
    pc.bold(`shard ${status.shard}`),
    colour(status.status),
    `epoch ${status.epoch ?? "-"}`,
    `primary ${status.primary ? `${status.primary.node_id} (${status.primary.address})` : "none"}`,
    status.phase ? `phase ${status.phase}` : "",
    status.paused_reason ? `paused: ${status.paused_reason}` : "",
  ]
    .filter(Boolean)
    .join("  ");
  const rows = status.nodes.map((node) => [
    node.node_id,
    node.role === "primary" ? pc.bold(node.role) : node.role,
    node.address,
    String(node.last_txn_id),
    node.lag === undefined ? "-" : String(node.lag),
    node.stale
      ? pc.red(formatAge(node.heartbeat_age_ms))
      : node.quiet
        ? `${formatAge(node.heartbeat_age_ms)} (quiet)`
        : formatAge(node.heartbeat_age_ms),
    node.db_status === "up" ? node.db_status : pc.red(node.db_status),
    node.primary_link === "down" ? pc.red("down") : (node.primary_link ?? "-"),
    node.primary_probe === undefined || node.primary_probe === "ok"
      ? (node.primary_probe ?? "-")
      : pc.red(node.primary_probe),
    String(node.priority),
  ]);
  const lines = [
    headline,
    rows.length > 0
      ? table(
          ["NODE", "ROLE", "ADDRESS", "LAST_TXN_ID", "LAG", "HEARTBEAT", "DB", "LINK", "PROBE", "PRIORITY"],
          rows,
        )
      : "  (no node heartbeats)",
  ];
  if (status.primary_seen_by_replicas) lines.push(pc.yellow(`  ${status.primary_seen_by_replicas}`));
  for (const item of status.malformed)
    lines.push(pc.red(`  malformed item ${item.sk}: ${item.field}: ${item.reason}`));
  return lines.join("\n");
}

export function renderHistory(shard: string, records: readonly HistoryRecord[]): string {
  if (records.length === 0) return `shard ${shard}: no failovers recorded`;
  return records
    .map((record) => {
      const when = new Date(record.at).toISOString();
      const move = `${record.old_primary_node_id ?? "-"} -> ${record.new_primary_node_id ?? "-"}`;
      const timings = Object.entries(record.phase_timings)
        .map(([phase, ms]) => `${phase} ${formatDuration(ms)}`)
        .join(", ");
      const candidates = record.candidates
        .map((c) => `${c.node_id}@${c.last_txn_id}${c.eligible ? "" : ` (${c.reason})`}`)
        .join(", ");
      return [
        `${pc.bold(`epoch ${record.epoch}`)}  ${when}  ${record.kind}  ${move}`,
        `  reason: ${record.reason}`,
        candidates ? `  candidates: ${candidates}` : "",
        timings ? `  phases: ${timings}` : "",
      ]
        .filter(Boolean)
        .join("\n");
    })
    .join("\n");
}
