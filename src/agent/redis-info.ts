import type { ClockSample } from "../core/clock-step.ts";
import { MalformedRecord } from "../core/errors.ts";
import type { Role } from "../core/model.ts";

/** One replica as its primary sees it (an `INFO replication` `slaveN:` line). */
export interface ReplicaEntry {
  /** host:port the replica announced; matches its agent's `--address` when both are set alike. */
  readonly address: string;
  /** Redis: `wait_bgsave`, `send_bulk`, `online`...; only `online` has completed its full sync. */
  readonly state: string;
  readonly offset: number;
  /** Seconds since the replica last acknowledged. */
  readonly lagSeconds: number;
}

/** A replica's view of its primary. */
export interface PrimaryLink {
  readonly host: string;
  readonly port: number;
  readonly link: "up" | "down";
  /** Seconds since the replica last heard from its primary; undefined when the link never came up. */
  readonly lastIoSecondsAgo: number | undefined;
  readonly syncInProgress: boolean;
}

/** The parts of `INFO replication` the agent reports, in Shardguard's vocabulary. */
export interface ReplicationInfo {
  readonly role: Role;
  /** The node's replication offset (`master_repl_offset`): the heartbeat's `last_txn_id`. */
  readonly offset: number;
  /** Replication lineage (`master_replid`): the heartbeat's `repl_id`. */
  readonly replId: string;
  /**
   * The earlier lineage this node's data continues (`master_replid2`, up to `second_repl_offset`
   * - 1): a replica promoted, or a primary that restarted from its RDB (Redis 7 gives it a new
   * replication id and keeps the old one here). Undefined when there is none.
   */
  readonly prior?: { readonly replId: string; readonly offset: number } | undefined;
  /** Set on a replica only. */
  readonly primary: PrimaryLink | undefined;
  /** Replicas connected to this node (a primary's, or a replica's own sub-replicas). */
  readonly replicas: readonly ReplicaEntry[];
  /** `run_id` from `INFO server` when it was read: new on every start of the database process. */
  readonly runId?: string | undefined;
  /**
   * A primary's count of replicas that acknowledged within `min-replicas-max-lag`
   * (`min_slaves_good_slaves`, refreshed by Redis's once-a-second replication cron); printed only
   * while `min-replicas-to-write` is set. Fewer than `min-replicas-to-write`: writes answer `NOREPLICAS`.
   */
  readonly goodReplicas?: number | undefined;
  /**
   * The server's wall clock (`server_time_usec` of `INFO server`, Redis 7) and the agent's
   * monotonic instants around the read (`readReplicationInfo`): `clockStepBack` judges two of them.
   */
  readonly clock?: ClockSample | undefined;
  /** `server_time_usec` as parsed; `readReplicationInfo` turns it into `clock`. */
  readonly serverTimeUs?: number | undefined;
}

/**
 * Redis, Valkey and KeyDB spell the same fields `master`/`slave`; newer forks add
 * `primary`/`replica` aliases. Both spellings are folded onto one before reading.
 */
function normalizeKey(key: string): string {
  return key.replaceAll("master", "primary").replaceAll("slave", "replica");
}

function parseFields(text: string): Map<string, string> {
  const fields = new Map<string, string>();
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    const colon = line.indexOf(":");
    if (colon <= 0) continue;
    const key = normalizeKey(line.slice(0, colon));
    // The first spelling wins so that an alias printed later cannot override the original.
    if (!fields.has(key)) fields.set(key, line.slice(colon + 1));
  }
  return fields;
}

function integer(fields: Map<string, string>, key: string): number | undefined {
  const raw = fields.get(key);
  if (raw === undefined) return undefined;
  const value = Number(raw);
  return Number.isInteger(value) ? value : undefined;
}

/** `ip=127.0.0.1,port=6380,state=online,offset=42,lag=0` */
function parseReplicaEntry(value: string): ReplicaEntry | undefined {
  const parts = new Map<string, string>();
  for (const pair of value.split(",")) {
    const eq = pair.indexOf("=");
    if (eq > 0) parts.set(pair.slice(0, eq), pair.slice(eq + 1));
  }
  const ip = parts.get("ip");
  const port = Number(parts.get("port"));
  if (!ip || !Number.isInteger(port)) return undefined;
  return {
    address: `${ip}:${port}`,
    state: parts.get("state") ?? "unknown",
    offset: Number(parts.get("offset") ?? 0) || 0,
    lagSeconds: Number(parts.get("lag") ?? 0) || 0,
  };
}

/** Parses the text of `INFO replication`; throws MalformedRecord when the role is missing or unknown. */
export function parseReplicationInfo(text: string): ReplicationInfo {
  const fields = parseFields(text);
  const rawRole = fields.get("role");
  const normalizedRole = rawRole === undefined ? undefined : normalizeKey(rawRole);
  if (normalizedRole !== "primary" && normalizedRole !== "replica") {
    throw new MalformedRecord(
      `INFO replication has no usable role (got ${JSON.stringify(rawRole)})`,
      "role",
      "expected master or slave",
    );
  }
  const replicas: ReplicaEntry[] = [];
  for (const [key, value] of fields) {
    if (!/^replica\d+$/.test(key)) continue;
    const entry = parseReplicaEntry(value);
    if (entry) replicas.push(entry);
  }
  let primary: PrimaryLink | undefined;
  if (normalizedRole === "replica") {
    const lastIo = integer(fields, "primary_last_io_seconds_ago");
    primary = {
      host: fields.get("primary_host") ?? "",
      port: integer(fields, "primary_port") ?? 0,
      link: fields.get("primary_link_status") === "up" ? "up" : "down",
      lastIoSecondsAgo: lastIo === undefined || lastIo < 0 ? undefined : lastIo,
      syncInProgress: fields.get("primary_sync_in_progress") === "1",
    };
  }
  return {
    role: normalizedRole,
    offset: Math.max(0, integer(fields, "primary_repl_offset") ?? 0),
    replId: fields.get("primary_replid") ?? "",
    prior: priorLineage(fields),
    primary,
    replicas,
    runId: fields.get("run_id"),
    goodReplicas: integer(fields, "min_replicas_good_replicas"),
    serverTimeUs: integer(fields, "server_time_usec"),
  };
}

const NO_REPL_ID = /^0+$/;

/** `master_replid2` and the last offset of it this node holds; undefined when Redis shows none. */
function priorLineage(fields: Map<string, string>): ReplicationInfo["prior"] {
  const replId = fields.get("primary_replid2");
  const second = integer(fields, "second_repl_offset");
  if (replId === undefined || replId === "" || NO_REPL_ID.test(replId)) return undefined;
  if (second === undefined || second < 1) return undefined;
  return { replId, offset: second - 1 };
}

/** host:port a replica replicates from (as set with REPLICAOF); undefined for a primary. */
export function replicatingFrom(info: ReplicationInfo): string | undefined {
  return info.primary === undefined ? undefined : `${info.primary.host}:${info.primary.port}`;
}

/**
 * Replicas whose full sync has completed (the only ones that may enter the replica set), and that
 * acknowledged within `maxLagSeconds` when it is given.
 */
export function syncedReplicaAddresses(
  info: ReplicationInfo,
  maxLagSeconds = Number.POSITIVE_INFINITY,
): string[] {
  return info.replicas
    .filter((replica) => replica.state === "online" && replica.lagSeconds <= maxLagSeconds)
    .map((replica) => replica.address);
}

/** The `name=` of every line of `CLIENT LIST` output that has one. */
export function parseClientNames(text: string): string[] {
  const names: string[] = [];
  for (const line of text.split("\n")) {
    const name = / name=(\S*)/.exec(line)?.[1];
    if (name) names.push(name);
  }
  return names;
}
