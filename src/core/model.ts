import { z } from "zod";

/**
 * The data model, one zod schema per stored item and per command. Field names follow the
 * SableDB seed (`node_id`, `node_address`, `role`, `last_updated` in µs, `last_txn_id`,
 * `primary_node_id`). Everything read from DynamoDB or SQS is parsed with these schemas.
 */

/**
 * Shard and node ids: short enough that `<prefix>_<shard>_<node>_dlq` (an older release's per-node dead-letter queue) fits SQS's 80 characters, and
 * without `_`, the separator of queue names, so (shard "a-b", node "c") and (shard "a", node "b-c")
 * can never share a queue.
 */
export const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9-]{0,23}$/;
export const ID_RULE = "must be 1-24 letters, digits or '-', starting with a letter or digit";
export const idSchema = z.string().regex(ID_PATTERN, ID_RULE);

/** host:port as other nodes reach it. */
export const addressSchema = z.string().regex(/^[^\s:]+:\d{1,5}$/, "must be host:port");

export const ROLES = ["primary", "replica"] as const;
export type Role = (typeof ROLES)[number];

/**
 * How a primary's agent saw its own database die (docs/agent.md#the-crash-fast-path): `refused`
 * (nothing listens on its port), `reset` (the connection was accepted and reset before any
 * reply), `restarted` (a new process, another `run_id`, answers and does not continue the data).
 * A timeout is never one of them: a stalled database (SIGSTOP, DEBUG SLEEP, a busy script) is
 * not a dead one.
 */
export const CRASH_STATES = ["refused", "reset", "restarted"] as const;
export type CrashState = (typeof CRASH_STATES)[number];

export const crashReportSchema = z.object({
  state: z.enum(CRASH_STATES),
  /** The process that died: the `run_id` the agent last read from it ("" when never read). */
  run_id: z.string(),
  /** µs (AWS-aligned) of the first observation after the database last answered. */
  first_seen: z.number().int().nonnegative(),
  /** µs of the latest observation; `last_seen - first_seen` is how long the death was confirmed. */
  last_seen: z.number().int().nonnegative(),
});
export type CrashReport = z.output<typeof crashReportSchema>;

export const heartbeatSchema = z.object({
  shard: idSchema,
  node_id: idSchema,
  node_address: addressSchema,
  role: z.enum(ROLES),
  /**
   * µs since 1970 on the AWS-aligned clock of the last heartbeat in which the database answered.
   * An agent whose database is down keeps writing (`db_status: "down"`) without advancing it,
   * so a live agent never makes a dead database look healthy.
   */
  last_updated: z.number().int().nonnegative(),
  /** µs of this write, whatever the database's state: tells "agent alive" from "database alive". */
  agent_updated: z.number().int().nonnegative().optional(),
  /**
   * The longest this agent goes without writing again while nothing it reports changes, ms: its
   * report stands that long (`isReportCurrent` in decide.ts). A quiet replica writes only on a
   * change and at this keepalive; absent (older agents): every heartbeat is due within the failure
   * timeout.
   */
  keepalive_ms: z.number().int().nonnegative().optional(),
  /**
   * µs of this agent's last heartbeat that ended a time of at least the failure timeout without
   * reaching the coordination store (a store outage, or this agent cut off). While it is recent, other
   * agents not heard yet may be held back by the same outage: `decide()` waits for them
   * (`store_recovering`) rather than take their silence for failure.
   */
  store_resumed_at: z.number().int().nonnegative().optional(),
  /**
   * µs (AWS-aligned) of the first read in which this agent found its database in its current
   * `role`. A node the topology names primary that answers as a replica this long takes no writes:
   * past the failure timeout the controller replaces it (gate `primary_demoted_grace`). Absent
   * (older agents): the topology's `updated_at` stands in.
   */
  role_since: z.number().int().nonnegative().optional(),
  db_status: z.enum(["up", "down"]).default("up"),
  /** With `db_status: down`: the agent's evidence that the process died (not merely stalled). */
  db_crash: crashReportSchema.optional(),
  /** Redis: the replication offset. Higher is more up to date. */
  last_txn_id: z.number().int().nonnegative(),
  /** Replication lineage (Redis `master_replid`): only nodes of the old primary's lineage may be promoted. */
  repl_id: z.string().default(""),
  /**
   * The earlier lineage this node's data continues, up to `last_txn_id` of it (Redis
   * `master_replid2` and `second_repl_offset` - 1): a promoted replica's old primary's, or its own
   * from before a restart from its RDB (Redis 7 gives such a primary a new `master_replid`); for a
   * replica whose full sync cleared its own, its primary's, remembered while it is linked on the
   * primary's `master_replid` and kept while it stays on it (`RememberedPrior`, src/core/identity.ts:
   * simulator seeds 343143, 7046). With `db_status: down` and a `restarted` crash report, what the
   * new process answering in place of the dead one holds: a candidate when the shard is offline on
   * that lineage.
   */
  prior_lineage: z
    .object({ repl_id: z.string().min(1), last_txn_id: z.number().int().nonnegative() })
    .optional(),
  /**
   * With \`db_status: down\`: the \`prior_lineage\` of the database's last answer, the one this
   * report's \`repl_id\` and \`last_txn_id\` are (the dead process's own \`master_replid2\` and
   * \`second_repl_offset\` - 1). A fact of the shard's lineage history, never what the node holds
   * now: a target that applied its PROMOTE and died before the change completed takes its
   * promotion's link with it otherwise (simulator seed 72080: the shard went offline on the
   * target's new lineage and the parked replica holding every write was "foreign" for good).
   */
  answered_prior_lineage: z
    .object({ repl_id: z.string().min(1), last_txn_id: z.number().int().nonnegative() })
    .optional(),
  /**
   * The last answer of this node's previous database process, when the process answering now
   * restarted behind it on the same lineage (a replica back from an RDB older than what it
   * acknowledged): \`repl_id\`, the offset it had answered (\`last_txn_id\`) and when
   * (\`last_updated\`, µs). What it held past its current offset it may have acknowledged
   * (\`WAIT 1\`), and the old primary may be the only copy left (gate \`replica_down_ahead\`;
   * nemesis seed 6803). Reported only while the new process holds less of that lineage.
   */
  restarted_behind: z
    .object({
      repl_id: z.string().min(1),
      last_txn_id: z.number().int().nonnegative(),
      last_updated: z.number().int().nonnegative(),
    })
    .optional(),
  primary_node_id: idSchema.optional(),
  /** The replica's own view of its link to the primary. */
  primary_link: z.enum(["up", "down"]).optional(),
  /**
   * Replica: its own probe of the primary (a connection of its agent, like Sentinel's): `ok`,
   * `unreachable` (no answer within the probe timeout: dead or hung), `restarted` (back as a new
   * process that does not continue the lineage; the replica stays parked), `fenced` (it refuses
   * every write: its agent fenced it, or it has fewer good replicas than its
   * `min-replicas-to-write` and answers `NOREPLICAS`).
   */
  primary_probe: z.enum(["ok", "unreachable", "restarted", "fenced"]).optional(),
  /**
   * Replica: the primary's replication offset (`master_repl_offset`) in the answer its probe got,
   * read in the same round trip as `primary_probe`. With `fenced` the primary takes no write past
   * it: a candidate holding it holds every write any member acknowledged (gate `member_unheard`).
   */
  primary_probe_offset: z.number().int().nonnegative().optional(),
  /**
   * Primary: the addresses of replicas its database lists as acknowledging that no heartbeat names
   * (a database without an agent; an agent silent past its report window). They may hold writes no
   * node with an agent has: a failover waits for them (gate \`outsider_unheard\`). Read from the
   * database's last answer; kept in the down report of a database that stopped answering, dropped
   * when it restarted without its data (its replicas resync from the new process).
   */
  outsiders: z.array(addressSchema).optional(),
  /** Replica: seconds since it last heard from its primary (Redis `master_last_io_seconds_ago`). */
  lag_s: z.number().int().nonnegative().optional(),
  /** Highest command epoch this agent applied. */
  epoch: z.number().int().nonnegative().default(0),
  /** 0 = never promote; otherwise lower values are preferred. */
  priority: z.number().int().nonnegative().default(100),
  /** host:port of the agent's Sentinel-protocol endpoint, when it serves one (docs/sentinel.md). */
  sentinel_address: addressSchema.optional(),
  ttl: z.number().int().optional(),
});
export type Heartbeat = z.output<typeof heartbeatSchema>;
export type HeartbeatInput = z.input<typeof heartbeatSchema>;

export const SHARD_STATUSES = ["online", "failing_over", "offline", "paused"] as const;
export type ShardStatus = (typeof SHARD_STATUSES)[number];

/**
 * The phases of one failover, in order. `promote` is the point of no return: abort is allowed
 * only before the PROMOTE command is sent. `catch_up` is used by planned switchovers only (writes
 * paused on the old primary, waiting for the target to reach its offset).
 */
export const FAILOVER_PHASES = [
  "locked",
  "epoch_bumped",
  "catch_up",
  "promote",
  "confirm",
  "repoint",
  "cleanup",
] as const;
export type FailoverPhase = (typeof FAILOVER_PHASES)[number];

export const candidateSchema = z.object({
  node_id: idSchema,
  node_address: addressSchema,
  last_txn_id: z.number().int().nonnegative(),
  priority: z.number().int().nonnegative(),
  eligible: z.boolean(),
  /** Why the node is not eligible (or "eligible"). */
  reason: z.string(),
});
export type Candidate = z.output<typeof candidateSchema>;

/**
 * The replication lineage a failover must stay within: the old primary's `repl_id` and the
 * last offset it reported. Kept in the topology so it survives the deletion of the old
 * primary's heartbeat (offline shards, continued failovers).
 */
export const lineageSchema = z.object({
  node_id: idSchema.optional(),
  repl_id: z.string(),
  last_txn_id: z.number().int().nonnegative(),
});
export type Lineage = z.output<typeof lineageSchema>;

/** The in-progress change stored in the topology, so that another controller can continue it (`continue_failover`). */
export const failoverStateSchema = z.object({
  kind: z.enum(["failover", "switchover", "bring_online"]),
  old_primary_node_id: idSchema.optional(),
  new_primary_node_id: idSchema,
  new_primary_address: addressSchema,
  reason: z.string(),
  started_at: z.number().int(),
  candidates: z.array(candidateSchema).default([]),
  /** ms at which each phase began. */
  phase_started: z.record(z.string(), z.number().int()).default({}),
  lineage: lineageSchema.optional(),
  /**
   * A deposing promotion (src/core/depose.ts): the old primary, outside whose replica set the new
   * one is, whose agent is not heard. The new primary's agent fences this database first and
   * catches up with its final offset before it detaches, or does not promote at all.
   */
  depose: z.object({ node_id: idSchema, address: addressSchema }).optional(),
  /**
   * The lineage link the target's report showed when the plan was decided (\`LineageLink\`,
   * src/core/identity.ts): its replication id continues its \`prior_lineage\` up to that offset (a
   * database restarted from its RDB, or a replica that followed one). Recorded in
   * \`topology.ancestry\` with the promotion's own link when the change completes on that
   * database, so the shard's history reaches the new primary from the lineage it was ranked on
   * (simulator seed 282286).
   */
  target_link: z
    .object({
      repl_id: z.string().min(1).max(64),
      until: z.number().int().nonnegative(),
      by: z.string().min(1).max(64),
    })
    .optional(),
});
export type FailoverState = z.output<typeof failoverStateSchema>;

export const topologySchema = z.object({
  shard: idSchema,
  /** Fencing token: bumped by compare-and-set on every change of primary. */
  epoch: z.number().int().nonnegative(),
  primary_node_id: idSchema.optional(),
  primary_address: addressSchema.optional(),
  status: z.enum(SHARD_STATUSES),
  phase: z.enum(FAILOVER_PHASES).optional(),
  failover: failoverStateSchema.optional(),
  /** ms */
  updated_at: z.number().int(),
  /** ms; no automatic failover before it. */
  cooldown_until: z.number().int().optional(),
  paused_reason: z.string().optional(),
  /** The lineage of the last primary while the shard is offline (a returning node must match it). */
  lineage: lineageSchema.optional(),
  /**
   * Old primaries nobody is known to have fenced (\`deposedAfter\`, src/core/depose.ts), online and
   * offline alike: each primary the shard replaced (and a failover's target past its PROMOTE that a
   * replan or going offline replaced), with \`epoch\`, the epoch of the topology that deposed it.
   * Every promotion's target fences each of these databases before it opens its writes
   * (\`deposedAddresses\`), so one that was hung or cut off through its own successor's epoch is
   * still fenced by the later ones (nemesis seeds 6303, 6811). An entry is dropped when the node is
   * the shard's primary again, or when its own agent reports its database a replica at that epoch
   * or later; at most 16, the latest kept.
   */
  deposed: z
    .array(
      z.object({
        node_id: idSchema,
        address: addressSchema,
        /** The epoch of the topology that deposed it (absent: written by an older controller). */
        epoch: z.number().int().nonnegative().optional(),
      }),
    )
    .max(16)
    .optional(),
  /**
   * Nodes drained for maintenance (\`shardguard drain\`, sorted): never promoted until undrained
   * (they count as priority 0: core/drain.ts), while they go on replicating.
   */
  drained: z.array(idSchema).optional(),
  /**
   * The shard's lineage history, most recent last (at most \`MAX_LINEAGE_LINKS\`, src/core/identity.ts): each change of
   * primary records that the new primary's lineage continues the one before up to its offset
   * (\`LineageLink\`, src/core/identity.ts). A replica restarted from an RDB older than the last
   * promotion holds an ancestor of the primary's lineage; only this history shows it.
   */
  ancestry: z
    .array(
      z.object({
        repl_id: z.string().min(1).max(64),
        until: z.number().int().nonnegative(),
        by: z.string().min(1).max(64),
      }),
    )
    .max(64)
    .optional(),
});
export type Topology = z.output<typeof topologySchema>;

export const lockSchema = z.object({
  owner: z.string().min(1),
  /** ms on the AWS-aligned clock; expiry is enforced in the condition, never by TTL. */
  expires_at: z.number().int(),
  for_primary: z.string().optional(),
  ttl: z.number().int().optional(),
  /** Raised by one on every acquisition; a fenced write names the fence it holds. */
  fence: z.number().int().nonnegative().optional(),
});
export type Lock = z.output<typeof lockSchema>;

export const historyRecordSchema = z.object({
  shard: idSchema,
  epoch: z.number().int().nonnegative(),
  kind: z.enum(["failover", "switchover", "bring_online", "offline"]),
  at: z.number().int(),
  old_primary_node_id: z.string().optional(),
  new_primary_node_id: z.string().optional(),
  reason: z.string(),
  candidates: z.array(candidateSchema).default([]),
  /** Duration of each phase in ms. */
  phase_timings: z.record(z.string(), z.number()).default({}),
});
export type HistoryRecord = z.output<typeof historyRecordSchema>;

/**
 * PROMOTE and REPLICAOF change who is primary (checked against the topology); PAUSE_WRITES holds a
 * switchover's old primary; REPORT asks a quiet agent to write its heartbeat now and every cycle
 * for \`timeout_ms\` (it changes nothing in the database).
 */
export const COMMAND_TYPES = ["PROMOTE", "REPLICAOF", "PAUSE_WRITES", "REPORT"] as const;
export type CommandType = (typeof COMMAND_TYPES)[number];

/**
 * The longest `timeout_ms` a command may carry (10 min). A switchover's pause lasts its catch_up,
 * promote and confirm bounds (19 s with the defaults) and a REPORT the lock's lease (60 s): both
 * far below. A command past it fails the schema, so a forged "pause for 1,000 days" is refused
 * before anything reads it (issue 38).
 */
export const MAX_COMMAND_TIMEOUT_MS = 10 * 60_000;

export const commandSchema = z
  .object({
    type: z.enum(COMMAND_TYPES),
    shard: idSchema,
    /** A safe integer (zod's `int()`): past 2^53 `epoch + 1` no longer changes the number. */
    epoch: z.number().int().nonnegative(),
    command_id: z.string().min(1).max(128),
    /** ms on the sender's AWS-aligned clock. */
    issued_at: z.number().int().nonnegative(),
    primary: z.object({ node_id: idSchema, address: addressSchema }).optional(),
    /** PAUSE_WRITES: how long the database holds writes; REPORT: how long the agent reports every cycle. */
    timeout_ms: z.number().int().positive().max(MAX_COMMAND_TIMEOUT_MS).optional(),
  })
  .superRefine((command, ctx) => {
    if (command.type === "REPLICAOF" && !command.primary) {
      ctx.addIssue({ code: "custom", path: ["primary"], message: "REPLICAOF needs the new primary" });
    }
    if ((command.type === "PAUSE_WRITES" || command.type === "REPORT") && !command.timeout_ms) {
      ctx.addIssue({ code: "custom", path: ["timeout_ms"], message: `${command.type} needs timeout_ms` });
    }
  });
export type Command = z.output<typeof commandSchema>;
