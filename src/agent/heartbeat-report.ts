import { keepaliveMs } from "../core/agent-cycle.ts";
import type { HeartbeatInput } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import type { AgentContext } from "./context.ts";
import type { ProbeResult } from "./primary-probe.ts";
import type { ReplicationInfo } from "./redis-info.ts";
import { unnamedReplicas } from "./write-guard.ts";

/** The heartbeat a cycle writes: of the database that answered, or the down report. */

function primaryNodeIdOf(ctx: AgentContext, info: ReplicationInfo): string | undefined {
  if (!info.primary) return undefined;
  return ctx.knownNodes.get(`${info.primary.host}:${info.primary.port}`);
}

/** The heartbeat of a database that answered. */
export function heartbeatFromInfo(
  ctx: AgentContext,
  info: ReplicationInfo,
  nowMs: number,
  probed?: ProbeResult,
  answeredFromMs = nowMs,
): HeartbeatInput {
  const micros = Math.floor(nowMs * 1000);
  const heartbeat: HeartbeatInput = {
    shard: ctx.shard,
    node_id: ctx.nodeId,
    node_address: ctx.address,
    role: info.role,
    last_updated: Math.floor(Math.min(answeredFromMs, nowMs) * 1000),
    agent_updated: micros,
    db_status: "up",
    last_txn_id: info.offset,
    repl_id: info.replId,
    epoch: ctx.highestEpoch,
    priority: ctx.options.priority,
    keepalive_ms: keepaliveOf(ctx, info.role),
    role_since: Math.floor(
      (ctx.dbRecord.roleSeen?.role === info.role ? ctx.dbRecord.roleSeen.since : answeredFromMs) * 1000,
    ),
  };
  // Redis's own earlier lineage, else the one the probe remembers from its primary's report while
  // this replica is on the primary's replication id (a full sync clears a replica's own
  // \`master_replid2\`: \`RememberedPrior\`, src/core/identity.ts). The controller then finds the
  // replica holding the shard's lineage up to that offset (simulator seed 7046).
  const prior = priorLineageOf(ctx.probe.withPrior(info));
  if (prior !== undefined) heartbeat.prior_lineage = prior;
  const behind = ctx.dbRecord.restartedBehind;
  if (behind !== undefined) {
    if (info.replId === behind.repl_id && info.offset < behind.last_txn_id)
      heartbeat.restarted_behind = behind;
    // Caught up (or on another lineage now): what it held is held again, or judged by the lineage.
    else ctx.dbRecord.restartedBehind = undefined;
  }
  if (info.role === "primary") {
    const outsiders = unnamedReplicas(ctx, info);
    if (outsiders.length > 0) heartbeat.outsiders = outsiders;
  }
  if (info.primary) {
    const primaryNodeId = primaryNodeIdOf(ctx, info);
    if (primaryNodeId !== undefined) heartbeat.primary_node_id = primaryNodeId;
    heartbeat.primary_link = info.primary.link;
    if (probed !== undefined) {
      heartbeat.primary_probe = probed;
      // Only with `fenced`, where it is used (gate member_unheard) and stays put (the primary takes
      // no write): the offset of a serving primary moves with every write, and would make every
      // report differ from the last, so a quiet replica would write every cycle.
      if (probed === "fenced") heartbeat.primary_probe_offset = ctx.probe.primaryOffset;
    }
    if (info.primary.lastIoSecondsAgo !== undefined) heartbeat.lag_s = info.primary.lastIoSecondsAgo;
  }
  return heartbeat;
}

function priorLineageOf(info: ReplicationInfo): HeartbeatInput["prior_lineage"] {
  return info.prior === undefined
    ? undefined
    : { repl_id: info.prior.replId, last_txn_id: info.prior.offset };
}

/**
 * The heartbeat of a database that does not answer, or answers as a process that restarted
 * without its data (fenced): the agent is alive, the database it served is not. Built on the
 * report of the database's last answer, written or not (\`lastAnswered\`): \`last_updated\` keeps
 * that answer's time so the controller sees the database's age, never the agent's; \`repl_id\` and
 * \`last_txn_id\` stay the dead process's last (what it may have acknowledged: gate
 * \`replica_down_ahead\`). \`prior_lineage\` is what the restarted process answering now
 * (\`restarted\`) holds of an earlier lineage: read this cycle, never carried over. The last
 * answer's own \`prior_lineage\` goes on as \`answered_prior_lineage\`: the link the dead process's
 * \`repl_id\` continues (simulator seed 72080).
 */
function downHeartbeat(
  ctx: AgentContext,
  snapshot: ShardSnapshot | undefined,
  nowMs: number,
  restarted?: ReplicationInfo,
): HeartbeatInput | undefined {
  const previous =
    ctx.lastAnswered ?? ctx.lastHeartbeat ?? snapshot?.nodes.find((node) => node.node_id === ctx.nodeId);
  if (previous === undefined) return undefined;
  const {
    prior_lineage: answeredPrior,
    answered_prior_lineage: carriedPrior,
    store_resumed_at: _resumed,
    outsiders,
    ...kept
  } = previous;
  const heartbeat: HeartbeatInput = {
    ...kept,
    node_address: ctx.address,
    agent_updated: Math.floor(nowMs * 1000),
    db_status: "down",
    db_crash: ctx.crash,
    primary_link: previous.role === "replica" ? "down" : previous.primary_link,
    epoch: ctx.highestEpoch,
    priority: ctx.options.priority,
    keepalive_ms: keepaliveOf(ctx, previous.role),
  };
  const prior = restarted === undefined ? undefined : priorLineageOf(restarted);
  if (prior !== undefined) heartbeat.prior_lineage = prior;
  // The link the dead process's lineage continues, from its last answer (a down report built on an
  // earlier down report carries it on): a promoted target that died keeps its promotion's link.
  const linked = previous.db_status === "down" ? carriedPrior : answeredPrior;
  if (linked !== undefined) heartbeat.answered_prior_lineage = linked;
  // The dead process's outsiders may hold what it acknowledged last (gate outsider_unheard); a
  // process restarted without its data makes them resync from it: they hold nothing to wait for.
  if (outsiders !== undefined && restarted === undefined && ctx.crash?.state !== "restarted") {
    heartbeat.outsiders = outsiders;
  }
  return heartbeat;
}

/** The heartbeat's `keepalive_ms` (`keepaliveMs` in src/core/agent-cycle.ts). */
export function keepaliveOf(ctx: AgentContext, role: "primary" | "replica"): number {
  return keepaliveMs(ctx.cycleState(), ctx.options, role, ctx.monotonicNow());
}

/**
 * This cycle's heartbeat: of the database that answered, else the down report (undefined: none
 * yet). \`generation\`: the role generation when this cycle read \`info\` (\`ctx.roleGeneration\`
 * then). An answer read before a role change since (a PROMOTE or REPLICAOF applied while this cycle
 * ran, beside the forced cycle that confirms it) is not the database's last answer: it never
 * replaces \`lastAnswered\`, which a down report is built on (fresh CI run of the twenty-second
 * session: a heartbeat cycle that read INFO before PROMOTE finished after the forced cycle; the
 * database died, and its down report named the lineage the node had left, which the controller
 * stored with its offline mark).
 */
export function buildHeartbeat(
  ctx: AgentContext,
  info: ReplicationInfo | undefined,
  snapshot: ShardSnapshot | undefined,
  now: number,
  probed: ProbeResult | undefined,
  answeredFrom: number | undefined,
  generation: number = ctx.roleGeneration,
): HeartbeatInput | undefined {
  // A restarted primary reports itself down with its old lineage: its new data is nobody's.
  const answered =
    info && !ctx.dbRestarted ? heartbeatFromInfo(ctx, info, now, probed, answeredFrom) : undefined;
  if (answered !== undefined && generation === ctx.roleGeneration) ctx.schedule.lastAnswered = answered;
  const heartbeat = answered ?? downHeartbeat(ctx, snapshot, now, ctx.dbRestarted ? info : undefined);
  const resumedAt = ctx.store.resumedAtFor(now);
  if (heartbeat !== undefined && resumedAt !== undefined) heartbeat.store_resumed_at = resumedAt;
  return heartbeat;
}
