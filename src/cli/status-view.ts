import { stripVTControlCharacters } from "node:util";
import type { FailoverConfig } from "../core/config.ts";
import { guardMembers } from "../core/decide/view.ts";
import { decide } from "../core/decide.ts";
import { isReportCurrent } from "../core/freshness.ts";
import type { HistoryRecord } from "../core/model.ts";
import {
  agentAgeMs,
  comparableLag,
  describeAge,
  offsetAgeMs,
  type ReportState,
  reportState,
  type TopologyRole,
  topologyRole,
} from "../core/node-age.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import { colors as pc } from "./colors.ts";

export interface NodeStatus {
  readonly node_id: string;
  /**
   * The role the topology gives the node (`topologyRole`, src/core/node-age.ts): one `primary` per
   * shard at most; the old primary after a kill is `failed`, an agent gone silent `unknown`.
   */
  readonly role: TopologyRole;
  /** Why the role differs from the report: "last seen as primary 1.7 s ago". */
  readonly role_note: string | undefined;
  /** The role in the node's last report. */
  readonly reported_role: string;
  readonly address: string;
  /** The replication offset of the node's last report, read `offset_age_ms` ago. */
  readonly last_txn_id: number;
  /** ms since the offset was read (the database's last answer); negative when dated ahead of the reader. */
  readonly offset_age_ms: number;
  /** ms since the agent last wrote its report, whatever its database's state. */
  readonly agent_age_ms: number;
  /** heard: within the failure timeout; quiet: a replica within its keepalive; stale: neither. */
  readonly report: ReportState;
  /**
   * Offset bytes behind the topology's primary, when the two reports can be compared
   * (`comparableLag`); undefined otherwise, with `lag_note` saying why.
   */
  readonly lag: number | undefined;
  readonly lag_note: string | undefined;
  readonly db_status: string;
  readonly primary_link: string | undefined;
  /** A replica's own probe of its primary: ok, unreachable, restarted, fenced. */
  readonly primary_probe: string | undefined;
  readonly priority: number;
  /** Drained by an operator (\`shardguard drain\`): never promoted until undrained. */
  readonly drained: boolean;
  readonly epoch: number;
  /** The longest its agent stays silent while nothing it reports changes (ms); 0 when unknown. */
  readonly keepalive_ms: number;
}

/** What the controller's decision for the shard is at this moment, as `decide()` gives it. */
export interface ControllerView {
  /** `decide()`'s kind: `none` while it waits or has nothing to do. */
  readonly decision: string;
  /** The reason code of a `none` decision (`healthy`, `awaiting_reports`, ...). */
  readonly code: string | undefined;
  readonly reason: string;
  /** `awaiting_reports`: the quiet nodes whose reports it waits for. */
  readonly awaiting: readonly string[] | undefined;
  /** The one line `status --shard` prints. */
  readonly line: string;
}

export interface ShardStatus {
  readonly shard: string;
  readonly status: string;
  readonly epoch: number | undefined;
  readonly primary: { readonly node_id: string; readonly address: string } | undefined;
  readonly phase: string | undefined;
  readonly paused_reason: string | undefined;
  /** Nodes drained for maintenance (never promoted until undrained). */
  readonly drained: readonly string[];
  /**
   * The shard's old primaries that nobody is known to have fenced (\`topology.deposed\`), online or
   * offline: the next node promoted, or brought online, fences each first (src/core/depose.ts).
   */
  readonly deposed: readonly { readonly node_id: string; readonly address: string }[];
  /**
   * What the primary's replicas say of it when its own heartbeat is stale: serving without its
   * agent's heartbeats (failsafe: a store outage for its agent, or its agent down), or fenced.
   */
  readonly primary_seen_by_replicas: string | undefined;
  readonly controller: ControllerView;
  /**
   * Where an assumption a guarantee rests on (docs/safety.md) is broken now, one line each
   * (\`brokenAssumptions\`); empty when none is.
   */
  readonly assumptions: readonly string[];
  readonly nodes: readonly NodeStatus[];
  readonly malformed: readonly { sk: string; field: string; reason: string }[];
}

export interface StatusOptions {
  /** When this reader asked each node to report (a REPORT it sent, AWS-aligned ms): `status --fresh`. */
  readonly reportsAskedAt?: Readonly<Record<string, number>>;
}

const ROLE_ORDER: Record<TopologyRole, number> = {
  primary: 0,
  promoting: 1,
  unconfirmed: 2,
  replica: 3,
  failed: 4,
  unknown: 5,
};

/**
 * The operator's view of one shard, computed from one snapshot at `nowMs` (the AWS-aligned clock)
 * with the decision's own clock predicates: every offset with its age, a lag only between
 * comparable reports, roles as the topology gives them, and what `decide()` answers now.
 */
export function shardStatus(
  snapshot: ShardSnapshot,
  nowMs: number,
  config: FailoverConfig,
  options: StatusOptions = {},
): ShardStatus {
  const topology = snapshot.topology;
  const primaryId = topology?.primary_node_id;
  const primaryBeat = snapshot.nodes.find((node) => node.node_id === primaryId);
  const nodes = snapshot.nodes
    .map((node): NodeStatus => {
      const role = topologyRole(node, topology, config, nowMs);
      const lag =
        node.node_id === primaryId || role.role === "failed" || role.role === "unknown"
          ? undefined
          : comparableLag(primaryBeat, node, config, nowMs);
      return {
        node_id: node.node_id,
        role: role.role,
        role_note: role.note,
        reported_role: node.role,
        address: node.node_address,
        last_txn_id: node.last_txn_id,
        offset_age_ms: Math.round(offsetAgeMs(node, nowMs)),
        agent_age_ms: Math.round(agentAgeMs(node, nowMs)),
        report: reportState(node, config, nowMs),
        lag: lag?.known ? lag.bytes : undefined,
        lag_note: lag && !lag.known ? lag.why : undefined,
        db_status: node.db_status,
        primary_link: node.primary_link,
        primary_probe: node.primary_probe,
        priority: node.priority,
        drained: topology?.drained?.includes(node.node_id) === true,
        epoch: node.epoch,
        keepalive_ms: node.keepalive_ms ?? 0,
      };
    })
    .sort((a, b) => ROLE_ORDER[a.role] - ROLE_ORDER[b.role] || a.node_id.localeCompare(b.node_id));
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
    drained: topology?.drained ?? [],
    deposed: topology?.deposed ?? [],
    primary_seen_by_replicas: primaryId ? seenByReplicas(primaryId, nodes) : undefined,
    controller: controllerView(snapshot, config, nowMs, options),
    assumptions: brokenAssumptions(snapshot, config, nowMs),
    nodes,
    malformed: snapshot.malformed.map((item) => ({ ...item })),
  };
}

/**
 * The assumptions of guarantee 1 (docs/safety.md) that the snapshot shows broken: a member of the
 * primary's replica set whose agent's last report no longer stands ("every member's agent runs":
 * its database may replicate and acknowledge \`WAIT\` unseen, and no failover promotes past it until
 * its agent reports: gate \`member_unheard\`), and a replica the primary's last report lists that no
 * heartbeat names ("every replica that acknowledges is one the primary's agent can name": gate
 * \`outsider_unheard\` holds failovers until an agent runs on it).
 */
export function brokenAssumptions(snapshot: ShardSnapshot, config: FailoverConfig, nowMs: number): string[] {
  const primaryId = snapshot.topology?.primary_node_id;
  const broken: string[] = [];
  for (const id of guardMembers(snapshot, primaryId) ?? []) {
    const node = snapshot.nodes.find((candidate) => candidate.node_id === id);
    if (node !== undefined && isReportCurrent(node, config, nowMs)) continue;
    const heard =
      node === undefined ? "has no heartbeat" : `last heard ${describeAge(agentAgeMs(node, nowMs))}`;
    broken.push(
      `member ${id} ${heard}: it may hold acknowledged writes; no failover promotes past it until its agent reports (assumption: every member's agent runs)`,
    );
  }
  const primary = snapshot.nodes.find((node) => node.node_id === primaryId);
  const named = new Set(snapshot.nodes.map((node) => node.node_address));
  for (const address of primary?.outsiders ?? []) {
    if (named.has(address)) continue;
    broken.push(
      `replica ${address} acknowledges writes and no agent names it: a failover waits for it until an agent runs on it (assumption: every replica that acknowledges has an agent)`,
    );
  }
  return broken;
}

/**
 * What the controller does with the shard now, from `decide()` itself (the same rules, the reader's
 * settings): "awaiting reports from n2 (quiet, heard 19 s ago, REPORT sent 0.4 s ago)".
 */
export function controllerView(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  nowMs: number,
  options: StatusOptions = {},
): ControllerView {
  const decision = decide(snapshot, config, nowMs);
  const code = decision.kind === "none" ? decision.code : undefined;
  const awaiting = decision.kind === "none" ? decision.awaiting : undefined;
  let line: string;
  if (code === "awaiting_reports" && awaiting !== undefined && awaiting.length > 0) {
    const each = awaiting.map((id) => {
      const node = snapshot.nodes.find((candidate) => candidate.node_id === id);
      const asked = options.reportsAskedAt?.[id];
      const parts = [
        "quiet",
        node ? `heard ${describeAge(agentAgeMs(node, nowMs))}` : undefined,
        asked === undefined ? undefined : `REPORT sent ${describeAge(nowMs - asked)}`,
      ];
      return `${id} (${parts.filter(Boolean).join(", ")})`;
    });
    line = `awaiting reports from ${each.join(", ")}`;
  } else if (code === "healthy") {
    line = `nothing to do: ${decision.reason}`;
  } else if (code !== undefined) {
    line = `waiting (${code}): ${decision.reason}`;
  } else {
    line = `next: ${decision.kind}: ${decision.reason}`;
  }
  return { decision: decision.kind, code, reason: decision.reason, awaiting, line: `controller: ${line}` };
}

/**
 * When the primary's heartbeat is stale but replicas' heartbeats are fresh, what those replicas
 * see: the database serving (failsafe: the agent is cut off from the store or down, and the
 * replica-set guard is the fence), or refusing writes (fenced by its agent: the controller
 * replaces it). Undefined while the primary's heartbeat is fresh or no replica is heard.
 */
export function seenByReplicas(primaryId: string, nodes: readonly NodeStatus[]): string | undefined {
  const primary = nodes.find((node) => node.node_id === primaryId);
  if (primary?.role === "primary") return undefined;
  const replicas = nodes.filter(
    (node) => node.node_id !== primaryId && node.report !== "stale" && node.db_status === "up",
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

const ROLE_COLOUR: Record<TopologyRole, (text: string) => string> = {
  primary: pc.bold,
  replica: (text) => text,
  promoting: pc.yellow,
  unconfirmed: pc.yellow,
  failed: pc.red,
  unknown: pc.red,
};

const count = (value: number) => value.toLocaleString("en-US");

/** "71,648, 0.2 s ago" for a report heard now; "1,190 as of 19 s ago, quiet" for an older one. */
export function describeOffset(node: NodeStatus): string {
  const age = describeAge(node.offset_age_ms);
  if (node.report === "heard" && node.db_status === "up") return `${count(node.last_txn_id)}, ${age}`;
  const why = node.report === "quiet" ? ", quiet" : node.db_status === "up" ? "" : ", database down";
  return `${count(node.last_txn_id)} as of ${age}${why}`;
}

export interface RenderOptions {
  /** Add the controller's line (`status --shard`). */
  readonly controllerLine?: boolean;
}

export function renderShardStatus(status: ShardStatus, options: RenderOptions = {}): string {
  const colour = STATUS_COLOUR[status.status] ?? ((text: string) => text);
  const headline = [
    pc.bold(`shard ${status.shard}`),
    colour(status.status),
    `epoch ${status.epoch ?? "-"}`,
    `primary ${status.primary ? `${status.primary.node_id} (${status.primary.address})` : "none"}`,
    status.phase ? `phase ${status.phase}` : "",
    status.paused_reason ? `paused: ${status.paused_reason}` : "",
    status.drained.length > 0 ? pc.yellow(`drained: ${status.drained.join(", ")}`) : "",
    status.deposed.length > 0
      ? pc.yellow(
          `old primaries not known fenced (the next promotion fences them): ${status.deposed.map((old) => `${old.node_id} (${old.address})`).join(", ")}`,
        )
      : "",
  ]
    .filter(Boolean)
    .join("  ");
  const rows = status.nodes.map((node) => {
    const role = node.role_note ? `${node.role} (${node.role_note})` : node.role;
    const offset = describeOffset(node);
    const heartbeat = describeAge(node.agent_age_ms);
    return [
      node.node_id,
      ROLE_COLOUR[node.role](role),
      node.address,
      node.report === "stale" ? pc.red(offset) : offset,
      node.lag !== undefined ? count(node.lag) : node.lag_note !== undefined ? "?" : "-",
      node.report === "stale"
        ? pc.red(heartbeat)
        : node.report === "quiet"
          ? `${heartbeat} (quiet)`
          : heartbeat,
      node.db_status === "up" ? node.db_status : pc.red(node.db_status),
      node.primary_link === "down" ? pc.red("down") : (node.primary_link ?? "-"),
      node.primary_probe === undefined || node.primary_probe === "ok"
        ? (node.primary_probe ?? "-")
        : pc.red(node.primary_probe),
      node.drained ? pc.yellow(`${node.priority} (drained)`) : String(node.priority),
    ];
  });
  const lines = [
    headline,
    rows.length > 0
      ? table(
          ["NODE", "ROLE", "ADDRESS", "OFFSET", "LAG", "HEARTBEAT", "DB", "LINK", "PROBE", "PRIORITY"],
          rows,
        )
      : "  (no node heartbeats)",
  ];
  const unknownLag = status.nodes.filter((node) => node.lag_note !== undefined);
  if (unknownLag.length > 0) {
    lines.push(
      pc.dim(
        `  lag ?: ${unknownLag.map((node) => `${node.node_id}: ${node.lag_note}`).join("; ")}` +
          (unknownLag.some((node) => node.report === "quiet")
            ? " (a quiet replica writes on a change and at its keepalive; --fresh asks it to report now)"
            : ""),
      ),
    );
  }
  if (status.primary_seen_by_replicas) lines.push(pc.yellow(`  ${status.primary_seen_by_replicas}`));
  for (const broken of status.assumptions) lines.push(pc.red(`  assumption broken: ${broken}`));
  for (const item of status.malformed)
    lines.push(pc.red(`  malformed item ${item.sk}: ${item.field}: ${item.reason}`));
  if (options.controllerLine) lines.push(`  ${status.controller.line}`);
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
