import { stripVTControlCharacters } from "node:util";
import pc from "picocolors";
import type { HistoryRecord } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";

export interface NodeStatus {
  readonly node_id: string;
  readonly role: string;
  readonly address: string;
  readonly last_txn_id: number;
  /** Replication offset bytes behind the primary; undefined when there is no primary heartbeat. */
  readonly lag: number | undefined;
  readonly heartbeat_age_ms: number;
  readonly db_status: string;
  readonly primary_link: string | undefined;
  readonly priority: number;
  readonly epoch: number;
  readonly stale: boolean;
}

export interface ShardStatus {
  readonly shard: string;
  readonly status: string;
  readonly epoch: number | undefined;
  readonly primary: { readonly node_id: string; readonly address: string } | undefined;
  readonly phase: string | undefined;
  readonly paused_reason: string | undefined;
  readonly nodes: readonly NodeStatus[];
  readonly malformed: readonly { sk: string; field: string; reason: string }[];
}

/**
 * The operator's view of one shard, computed from one snapshot. `nowMs` is the AWS-aligned clock;
 * a node is stale when its heartbeat is older than `failureTimeoutMs`.
 */
export function shardStatus(snapshot: ShardSnapshot, nowMs: number, failureTimeoutMs: number): ShardStatus {
  const topology = snapshot.topology;
  const primaryId = topology?.primary_node_id;
  const primaryBeat = snapshot.nodes.find((node) => node.node_id === primaryId);
  const nodes = snapshot.nodes
    .map((node): NodeStatus => {
      const age = Math.max(0, nowMs - Math.floor(node.last_updated / 1000));
      return {
        node_id: node.node_id,
        role: node.role,
        address: node.node_address,
        last_txn_id: node.last_txn_id,
        lag: primaryBeat ? Math.max(0, primaryBeat.last_txn_id - node.last_txn_id) : undefined,
        heartbeat_age_ms: age,
        db_status: node.db_status,
        primary_link: node.primary_link,
        priority: node.priority,
        epoch: node.epoch,
        stale: age > failureTimeoutMs,
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
    nodes,
    malformed: snapshot.malformed.map((item) => ({ ...item })),
  };
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
    node.stale ? pc.red(formatDuration(node.heartbeat_age_ms)) : formatDuration(node.heartbeat_age_ms),
    node.db_status === "up" ? node.db_status : pc.red(node.db_status),
    node.primary_link === "down" ? pc.red("down") : (node.primary_link ?? "-"),
    String(node.priority),
  ]);
  const lines = [
    headline,
    rows.length > 0
      ? table(["NODE", "ROLE", "ADDRESS", "LAST_TXN_ID", "LAG", "HEARTBEAT", "DB", "LINK", "PRIORITY"], rows)
      : "  (no node heartbeats)",
  ];
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
