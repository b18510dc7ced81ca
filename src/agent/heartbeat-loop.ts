import { CRASH_CONFIRM_MS } from "../core/crash.ts";
import { errorMessage } from "../core/errors.ts";
import { type DatabaseIdentity, judgeRestart } from "../core/identity.ts";
import type { HeartbeatInput } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import type { Wake } from "../core/wake.ts";
import { GUARD_MAX_LAG_S, nodeIdsByAddress } from "../core/write-guard.ts";
import { Backoff, sleep } from "./backoff.ts";
import type { AgentContext } from "./context.ts";
import { assessTopology, type TopologyVerdict, topologyPrimary } from "./fencing.ts";
import { becomeReplicaOf } from "./node-control.ts";
import { isParked, type ProbeResult } from "./primary-probe.ts";
import { type ReplicationInfo, syncedReplicaAddresses } from "./redis-info.ts";
import { withStoreTimeout } from "./scheduling.ts";
import { endFailsafe, observeStoreWitnesses, tryEnforceWriteGuard } from "./write-guard.ts";

/** What one cycle achieved; the loop paces itself on it. */
export interface HeartbeatCycleResult {
  readonly dbUp: boolean;
  readonly storeUp: boolean;
  readonly heartbeatWritten: boolean;
  /** Nothing to report: the cycle left the store alone (its keepalive not due). */
  readonly quiet?: boolean;
}

/**
 * Reads INFO. `answeredFrom` (AWS-aligned ms) is taken before the request: the database was alive
 * at least then, and a crash the watch observes after it is never dated before `last_updated`.
 */
async function readInfo(
  ctx: AgentContext,
): Promise<{ info: ReplicationInfo; answeredFrom: number } | undefined> {
  const answeredFrom = ctx.deps.clock.now();
  try {
    const info = await ctx.db.replicationInfo();
    if (!ctx.dbUp) ctx.logger.info("database answers", { redis: ctx.options.redis, role: info.role });
    ctx.dbUp = true;
    ctx.lastInfo = info;
    ctx.lastInfoGeneration = ctx.roleGeneration;
    if (ctx.roleSeen?.role !== info.role) ctx.roleSeen = { role: info.role, since: answeredFrom };
    // A restarted primary is harmless once it follows a primary (a command or a step-down did it).
    if (info.role === "replica") ctx.dbRestarted = false;
    // While connected, the replica acknowledges every second: the primary counts it until then.
    if (info.role === "replica" && info.primary?.link === "up") ctx.primaryContactAt = ctx.monotonicNow();
    const previousRunId = ctx.identity?.runId;
    checkIdentity(ctx, info);
    persistRestarted(ctx);
    if (ctx.dbRestarted) {
      // The process this node served as primary is gone; what answers is fenced and reported down.
      if (ctx.crash?.state !== "restarted") recordRestart(ctx, previousRunId);
    } else if (ctx.crash !== undefined) {
      ctx.logger.info("database answers again", {
        ...ctx.epochContext,
        runId: info.runId,
        crash: ctx.crash.state,
      });
      ctx.crash = undefined;
    }
    return { info, answeredFrom };
  } catch (error) {
    if (ctx.dbUp || ctx.lastInfo === undefined) {
      ctx.logger.warn("database does not answer; heartbeats report db_status down", {
        redis: ctx.options.redis,
        error: errorMessage(error),
      });
    }
    ctx.dbUp = false;
    return undefined;
  }
}

function recordRestart(ctx: AgentContext, previousRunId: string | undefined): void {
  const now = Math.floor(ctx.deps.clock.now() * 1000);
  ctx.crash = {
    state: "restarted",
    run_id: ctx.crash?.run_id ?? previousRunId ?? "",
    first_seen: ctx.crash?.first_seen ?? now,
    last_seen: now,
  };
}

/**
 * A database whose run_id changed is a new process. If it was this shard's primary and its
 * replication lineage does not continue the old one (same replid, offset not behind), it restarted
 * empty or from an old snapshot: it must not serve, nor feed its replicas, before the controller
 * replaced it (guarantee 5, docs/agent.md#database-identity).
 */
function checkIdentity(ctx: AgentContext, info: ReplicationInfo): void {
  if (info.runId === undefined) return;
  const previous = ctx.identity;
  const current = {
    runId: info.runId,
    replId: info.replId,
    offset: info.offset,
    role: info.role,
    synced: syncedReplicaAddresses(info).length,
  };
  ctx.identity = current;
  const verdict = judgeRestart(previous, current, {
    named: ctx.lastTopology ? topologyPrimary(ctx.lastTopology)?.node_id === ctx.nodeId : false,
    guardMembers: ctx.guardMembers,
  });
  if (verdict.kind === "lost-data") ctx.dbRestarted = true;
  // The new identity and the verdict on it are written together, in one atomic update: an agent
  // killed between the two would leave its successor judging the empty process "the same" and
  // opening it (data-safety's seed-3102 test caught it under load).
  persistIdentity(ctx, current);
  if (verdict.kind === "same") return;
  // The guard's settings died with the old process.
  ctx.appliedGuard = undefined;
  if (verdict.kind === "harmless") {
    ctx.logger.warn("database restarted", {
      ...ctx.epochContext,
      runId: info.runId,
      continues: verdict.continues,
      why: verdict.reason,
    });
    return;
  }
  ctx.logger.error("database restarted without its data: fenced until it follows the shard's primary", {
    ...ctx.epochContext,
    runId: info.runId,
    previousRunId: previous?.runId,
    replId: info.replId,
    previousReplId: previous?.replId,
    offset: info.offset,
    previousOffset: previous?.offset,
  });
}

/** Longest the state dir's copy of the database's offset lags behind (it is only written then). */
const IDENTITY_PERSIST_MS = 5_000;

/**
 * Keeps the state dir's copy of the database identity and restart flag: at once when the process,
 * lineage or role changed, every IDENTITY_PERSIST_MS for the offset (an older offset only makes
 * the restarted agent's judgement more lenient, never fence a healthy process).
 */
function persistIdentity(ctx: AgentContext, current: DatabaseIdentity): void {
  const stored = ctx.state.state.db_identity;
  const now = ctx.monotonicNow();
  const changed =
    stored === undefined ||
    stored.run_id !== current.runId ||
    stored.repl_id !== current.replId ||
    stored.role !== current.role;
  const flagChanged = (ctx.state.state.db_restarted === true) !== ctx.dbRestarted;
  if (changed || flagChanged || now - ctx.identityPersistedAt >= IDENTITY_PERSIST_MS) {
    ctx.state.update({
      db_identity: {
        run_id: current.runId,
        repl_id: current.replId,
        offset: current.offset,
        role: current.role,
        synced: current.synced,
      },
      db_restarted: ctx.dbRestarted ? true : undefined,
    });
    ctx.identityPersistedAt = now;
  }
}

/** The restart flag survives an agent restart: a database it fenced stays fenced. */
function persistRestarted(ctx: AgentContext): void {
  if ((ctx.state.state.db_restarted === true) !== ctx.dbRestarted) {
    ctx.state.update({ db_restarted: ctx.dbRestarted ? true : undefined });
  }
}

const CONFLICT_REMINDER_MS = 30_000;

/**
 * This agent's address belongs to another node id in the topology. Acting on it could only make
 * the database follow itself or demote the shard's primary, so the agent touches nothing, writes
 * no heartbeat, and says what to do.
 */
function reportIdentityConflict(ctx: AgentContext, owner: string): void {
  const now = ctx.monotonicNow();
  if (now - ctx.lastConflictReport < CONFLICT_REMINDER_MS) return;
  ctx.lastConflictReport = now;
  ctx.logger.error(
    "identity conflict: the topology names another node at this agent's address; the database is left as it is",
    {
      ...ctx.epochContext,
      address: ctx.address,
      topologyNode: owner,
      agentNode: ctx.nodeId,
      fix: `restart this agent with --node-id ${owner} (or restore its state dir ${ctx.options.stateDir})`,
    },
  );
}

/**
 * The topology names this node primary but its database answers as a replica (restarted from a
 * config file with \`replicaof\`, an operator's REPLICAOF): no node takes the shard's writes. The
 * agent does not promote it back itself: a database restarted empty would then feed nothing to
 * its replicas in a full sync, and only the controller can tell which node holds every
 * acknowledged write. Its heartbeat says \`role: replica\` since \`role_since\`; past the failure
 * timeout the controller fails over to the replica holding the most (gate \`primary_demoted_grace\`).
 */
function reportNamedReplica(ctx: AgentContext, snapshot: ShardSnapshot, info: ReplicationInfo): void {
  const named = snapshot.topology ? topologyPrimary(snapshot.topology)?.node_id === ctx.nodeId : false;
  const namedButReplica = named && info.role === "replica";
  if (namedButReplica && !ctx.namedButReplica) {
    ctx.logger.error(
      "the topology names this node primary but its database is a replica: no node takes writes",
      {
        ...ctx.epochContext,
        replicatingFrom: info.primary ? `${info.primary.host}:${info.primary.port}` : undefined,
        link: info.primary?.link,
        action: "the controller fails over once this lasts the failure timeout",
      },
    );
  }
  ctx.namedButReplica = namedButReplica;
}

/** A replica probes its primary (or the one it was parked from); a primary closes its probe. */
async function probePrimary(ctx: AgentContext, info: ReplicationInfo): Promise<ProbeResult | undefined> {
  if (info.role !== "replica" || !info.primary) {
    ctx.probe.close();
    return undefined;
  }
  if (!isParked(info)) ctx.probe.track(`${info.primary.host}:${info.primary.port}`);
  if (ctx.probe.address === undefined) return undefined;
  try {
    return await ctx.probe.probe(info);
  } catch (error) {
    ctx.logger.warn("primary probe failed", { ...ctx.epochContext, error: errorMessage(error) });
    return undefined;
  }
}

function storeFailed(ctx: AgentContext, what: string, error: unknown): void {
  ctx.count("store_error", what);
  ctx.storeFailingSince ??= ctx.deps.clock.now();
  if (ctx.storeUp) {
    ctx.logger.warn("coordination store unreachable", { operation: what, error: errorMessage(error) });
  }
  ctx.storeUp = false;
}

function storeAnswered(ctx: AgentContext): void {
  if (!ctx.storeUp) ctx.logger.info("coordination store reachable again");
  ctx.storeUp = true;
}

async function readSnapshot(ctx: AgentContext): Promise<ShardSnapshot | undefined> {
  try {
    const snapshot = await withStoreTimeout(
      ctx.deps.heartbeats.snapshot(ctx.shard),
      ctx.storeTimeoutMs,
      `snapshot of shard ${ctx.shard}`,
    );
    storeAnswered(ctx);
    ctx.topologyRead = true;
    ctx.lastTopology = snapshot.topology;
    // Freshest heartbeat per address and per node id; stale ones only for members and the primary.
    const known = nodeIdsByAddress(
      snapshot.nodes.map((node) => ({ ...node, written_us: node.agent_updated ?? node.last_updated })),
      ctx.deps.clock.now(),
      ctx.options.replicaKeepaliveMs + ctx.options.failureTimeoutMs,
      (claim) => ctx.guardMembers.includes(claim.node_id) || claim.node_id === ctx.nodeId,
    );
    ctx.knownNodes.clear();
    for (const [address, id] of known) ctx.knownNodes.set(address, id);
    const primary = snapshot.topology ? topologyPrimary(snapshot.topology) : undefined;
    if (primary) ctx.knownNodes.set(primary.address, primary.node_id);
    return snapshot;
  } catch (error) {
    storeFailed(ctx, "snapshot", error);
    return undefined;
  }
}

function verdictFor(ctx: AgentContext, snapshot: ShardSnapshot, info: ReplicationInfo): TopologyVerdict {
  const broken = snapshot.malformed.find((item) => item.sk === "TOPOLOGY");
  if (broken !== undefined) {
    // Fail closed: a topology that cannot be read confirms nobody (it is not "no topology yet").
    return {
      kind: "keep",
      primaryConfirmed: false,
      reason: `the topology item is malformed (${broken.field}: ${broken.reason})`,
    };
  }
  const named = snapshot.topology ? topologyPrimary(snapshot.topology) : undefined;
  if (named !== undefined && named.address === ctx.address && named.node_id !== ctx.nodeId) {
    // Never follow itself: another node id owns this address (a lost state dir, a copied config).
    return { kind: "keep", primaryConfirmed: false, reason: "identity conflict", conflict: named.node_id };
  }
  const verdict = assessTopology(snapshot.topology, {
    nodeId: ctx.nodeId,
    role: info.role,
    replicatingFrom: info.primary ? `${info.primary.host}:${info.primary.port}` : undefined,
    highestEpoch: ctx.highestEpoch,
    promotedEpoch: ctx.state.state.promoted_epoch,
  });
  // A parked replica waits for its own primary to come back holding its data, or for a new
  // decision: a newer, committed topology that names the same address again is followed (a
  // failover still under way names the old primary until its point of no return).
  const stillParkedFrom =
    verdict.kind === "repoint" &&
    (verdict.epoch === ctx.probe.parkedAtEpoch || snapshot.topology?.status !== "online");
  if (
    verdict.kind === "repoint" &&
    isParked(info) &&
    verdict.target.address === ctx.probe.address &&
    stillParkedFrom
  ) {
    return { kind: "keep", primaryConfirmed: false, reason: `parked from ${verdict.target.node_id}` };
  }
  return verdict;
}

/**
 * Demotes, repoints or lifts the write fence as the topology requires. Returns fresh INFO and
 * the role generation it belongs to.
 */
async function reconcile(
  ctx: AgentContext,
  snapshot: ShardSnapshot,
): Promise<{ info: ReplicationInfo; generation: number }> {
  return ctx.roleLock.run(async () => {
    // Re-read under the lock: a command may have changed the role since the cycle began.
    const info = await ctx.db.replicationInfo();
    const verdict = verdictFor(ctx, snapshot, info);
    if (verdict.kind === "keep") return { info, generation: ctx.roleGeneration };
    ctx.logger.warn(
      verdict.kind === "demote"
        ? "stepping down: not the topology's primary"
        : "following the topology's primary",
      {
        ...ctx.epochContext,
        reason: verdict.reason,
        primary: verdict.target.node_id,
        primaryAddress: verdict.target.address,
        topologyEpoch: verdict.epoch,
      },
    );
    const next = await becomeReplicaOf(ctx, verdict.target);
    ctx.state.update({ highest_epoch: Math.max(ctx.highestEpoch, verdict.epoch), promoted_epoch: undefined });
    return { info: next, generation: ctx.roleGeneration };
  });
}

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
    role_since: Math.floor((ctx.roleSeen?.role === info.role ? ctx.roleSeen.since : answeredFromMs) * 1000),
  };
  const prior = priorLineageOf(info);
  if (prior !== undefined) heartbeat.prior_lineage = prior;
  if (info.primary) {
    const primaryNodeId = primaryNodeIdOf(ctx, info);
    if (primaryNodeId !== undefined) heartbeat.primary_node_id = primaryNodeId;
    heartbeat.primary_link = info.primary.link;
    if (probed !== undefined) {
      heartbeat.primary_probe = probed;
      heartbeat.primary_probe_offset = ctx.probe.primaryOffset;
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
 * `store_resumed_at` for the heartbeat written at `nowMs`: this write's own time when it ends an
 * outage of at least the failure timeout, else this process's last such return (the controller
 * looks only at recent ones).
 */
function storeResumedAt(ctx: AgentContext, nowMs: number): number | undefined {
  const since = ctx.storeFailingSince;
  if (since !== undefined && nowMs - since >= ctx.options.failureTimeoutMs) return Math.floor(nowMs * 1000);
  return ctx.storeResumedAt;
}

/**
 * The heartbeat of a database that does not answer, or answers as a process that restarted
 * without its data (fenced): the agent is alive, the database it served is not. `last_updated`
 * keeps its old value so the controller sees the database's age, never the agent's; `repl_id` and
 * `last_txn_id` stay the dead process's. `prior_lineage` is what the restarted process answering
 * now (`restarted`) holds of an earlier lineage: read this cycle, never carried over.
 */
function downHeartbeat(
  ctx: AgentContext,
  snapshot: ShardSnapshot | undefined,
  nowMs: number,
  restarted?: ReplicationInfo,
): HeartbeatInput | undefined {
  const previous = ctx.lastHeartbeat ?? snapshot?.nodes.find((node) => node.node_id === ctx.nodeId);
  if (previous === undefined) return undefined;
  const { prior_lineage: _carried, store_resumed_at: _resumed, ...kept } = previous;
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
  return heartbeat;
}

/**
 * One heartbeat cycle: INFO, one shard snapshot (topology included), fencing by the topology,
 * the heartbeat write, the replica set, and shard registration.
 */
/**
 * A database that answers as a new process (restarted: its write guard died with the old one)
 * gets the guard at once, from what the agent already knows, without waiting for this cycle's
 * store calls (slow or failing during an outage: seconds in which the new process took writes).
 */
async function guardNewProcess<T extends { info: ReplicationInfo } | undefined>(
  ctx: AgentContext,
  read: T,
): Promise<T> {
  const info = read?.info;
  if (info?.role === "primary" && ctx.appliedGuard === undefined && (ctx.topologyRead || ctx.dbRestarted)) {
    await ctx.roleLock.run(() => tryEnforceWriteGuard(ctx, info));
  }
  return read;
}

/**
 * The longest this agent will go without writing again while nothing it reports changes (the
 * heartbeat's `keepalive_ms`). A primary: `primaryKeepaliveMs`. A replica with nothing to watch
 * (database up, following, link up, probe ok, the topology online with its primary fresh):
 * `replicaKeepaliveMs`; otherwise, like an agent whose database is down or dead, every cycle.
 */
export function keepaliveOf(ctx: AgentContext, role: "primary" | "replica"): number {
  const watching =
    !ctx.dbUp ||
    ctx.dbRestarted ||
    ctx.crash !== undefined ||
    ctx.doubtSince !== undefined ||
    ctx.topologyDoubt ||
    ctx.monotonicNow() < ctx.reportUntil;
  if (watching) return ctx.options.heartbeatIntervalMs;
  return role === "primary" ? ctx.options.primaryKeepaliveMs : ctx.options.replicaKeepaliveMs;
}

/**
 * What a heartbeat reports, without what moves on its own (timestamps, the offset, the link's
 * last I/O, a crash report's latest sighting): a heartbeat whose signature equals the last one
 * written is written only at the keepalive.
 */
export function reportSignature(heartbeat: HeartbeatInput): string {
  const {
    last_updated: _updated,
    agent_updated: _agent,
    last_txn_id: _offset,
    lag_s: _lag,
    ttl: _ttl,
    db_crash: crash,
    ...stable
  } = heartbeat;
  const crashed = crash === undefined ? undefined : { ...crash, last_seen: undefined };
  return JSON.stringify({ ...stable, db_crash: crashed }, Object.keys({ ...stable, db_crash: 0 }).sort());
}

/**
 * The cycle reads the topology and writes whatever it reports: asked to, never written, the last
 * store call failed, or the keepalive of the last heartbeat written would pass before the next cycle.
 */
function storeDue(ctx: AgentContext): boolean {
  if (ctx.storeRequested || !ctx.topologyRead || ctx.lastHeartbeat === undefined || inDoubt(ctx)) return true;
  const keepalive = ctx.lastHeartbeat.keepalive_ms ?? 0;
  return ctx.monotonicNow() - ctx.lastHeartbeatWrittenAt >= keepalive - ctx.options.heartbeatIntervalMs / 2;
}

/**
 * A replica's topology read shows something to watch: the shard neither online nor paused, a
 * primary other than the one it follows, or that primary's heartbeat stale or its database down.
 */
function topologyToWatch(ctx: AgentContext, snapshot: ShardSnapshot, info: ReplicationInfo): boolean {
  if (info.role !== "replica") return false;
  const topology = snapshot.topology;
  // Paused: no automatic action to report for (a switchover asks with REPORT).
  if (topology === undefined || (topology.status !== "online" && topology.status !== "paused")) return true;
  const named = topologyPrimary(topology);
  const following = info.primary ? `${info.primary.host}:${info.primary.port}` : undefined;
  if (named === undefined || named.address !== following) return true;
  const primary = snapshot.nodes.find((node) => node.node_id === named.node_id);
  if (primary === undefined || primary.db_status !== "up") return true;
  return ctx.deps.clock.now() - primary.last_updated / 1000 > ctx.options.failureTimeoutMs;
}

/** This cycle's heartbeat: of the database that answered, else the down report (undefined: none yet). */
function buildHeartbeat(
  ctx: AgentContext,
  info: ReplicationInfo | undefined,
  snapshot: ShardSnapshot | undefined,
  now: number,
  probed: ProbeResult | undefined,
  answeredFrom: number | undefined,
): HeartbeatInput | undefined {
  // A restarted primary reports itself down with its old lineage: its new data is nobody's.
  const heartbeat =
    info && !ctx.dbRestarted
      ? heartbeatFromInfo(ctx, info, now, probed, answeredFrom)
      : downHeartbeat(ctx, snapshot, now, ctx.dbRestarted ? info : undefined);
  const resumedAt = storeResumedAt(ctx, now);
  if (heartbeat !== undefined && resumedAt !== undefined) heartbeat.store_resumed_at = resumedAt;
  return heartbeat;
}

export interface CycleOptions {
  /** Read the topology and write the heartbeat whatever changed (a command applied, a wake-up). */
  readonly force?: boolean;
}

export function runCycle(ctx: AgentContext, options: CycleOptions = {}): Promise<HeartbeatCycleResult> {
  return cycle(ctx, options, false);
}

/** One cycle; `again`: it re-runs one that found the process paused (a second pause writes nothing). */
async function cycle(
  ctx: AgentContext,
  options: CycleOptions,
  again: boolean,
): Promise<HeartbeatCycleResult> {
  // Captured before INFO: a role change after this point makes this cycle's heartbeat stale.
  let generation = ctx.roleGeneration;
  const planned = options.force === true || storeDue(ctx);
  ctx.storeRequested = false;
  // When the topology read this cycle relies on began (monotonic): see the pause gate below.
  let readFrom = ctx.pauses.mark();
  const [read, early] = await Promise.all([
    readInfo(ctx).then((read) => guardNewProcess(ctx, read)),
    planned ? readSnapshot(ctx) : Promise.resolve(undefined),
  ]);
  let snapshot = early;
  const firstInfo = read?.info;
  let info = firstInfo;
  const probe = firstInfo ? probePrimary(ctx, firstInfo) : Promise.resolve(undefined);
  if (!planned) {
    // A quiet cycle: the database checked, the primary probed, the guard kept; the store is left
    // alone unless what this agent would report changed.
    const probed = await probe;
    trackDoubt(ctx, firstInfo, probed);
    const report = buildHeartbeat(
      ctx,
      firstInfo,
      undefined,
      ctx.deps.clock.now(),
      probed,
      read?.answeredFrom,
    );
    // A primary learns a new replica's node id from the store (its heartbeat): until it does, the
    // replica cannot join the write guard's set, and no failover may promote it.
    const unknownReplica =
      firstInfo?.role === "primary" &&
      syncedReplicaAddresses(firstInfo, GUARD_MAX_LAG_S).some((address) => !ctx.knownNodes.has(address));
    // A cycle held up past its keepalive (the agent stalled) reads the topology before the guard
    // acts on what it last read.
    if (
      !unknownReplica &&
      !storeDue(ctx) &&
      (report === undefined || reportSignature(report) === ctx.writtenSignature)
    ) {
      if (firstInfo && (ctx.topologyRead || ctx.dbRestarted)) {
        await ctx.roleLock.run(() => tryEnforceWriteGuard(ctx, firstInfo));
      }
      return { dbUp: firstInfo !== undefined, storeUp: ctx.storeUp, heartbeatWritten: false, quiet: true };
    }
    readFrom = ctx.pauses.mark();
    snapshot = await readSnapshot(ctx);
  }
  ctx.topologyFresh = snapshot !== undefined;
  if (snapshot === undefined) ctx.storeRequested = true;
  if (info && snapshot) {
    ctx.topologyDoubt = topologyToWatch(ctx, snapshot, info);
    const verdict = verdictFor(ctx, snapshot, info);
    if (verdict.kind === "keep" && verdict.conflict !== undefined) {
      reportIdentityConflict(ctx, verdict.conflict);
      return { dbUp: true, storeUp: true, heartbeatWritten: false };
    }
    ctx.confirmed = verdict.kind === "keep" && verdict.primaryConfirmed;
    reportNamedReplica(ctx, snapshot, info);
    ctx.unconfirmedReason = verdict.reason;
    ctx.guardMembers = snapshot.replicaSets[ctx.nodeId] ?? [];
    if (verdict.kind !== "keep") {
      try {
        ({ info, generation } = await reconcile(ctx, snapshot));
      } catch (error) {
        ctx.logger.error("could not align the database with the topology", {
          ...ctx.epochContext,
          error: errorMessage(error),
        });
        info = undefined;
      }
    }
  }
  const guarded = info !== undefined && (ctx.topologyRead || ctx.dbRestarted);
  // The topology no longer confirms this primary (offline, a failover away, another named): its
  // fence goes up before the heartbeat goes out, so whoever reads it finds the writes refused
  // already. Any other guard follows the write (it depends on whether the write went through).
  const guardFirst = guarded && info?.role === "primary" && ctx.confirmed === false;
  if (guardFirst && info) {
    const current = info;
    await ctx.roleLock.run(() => tryEnforceWriteGuard(ctx, current));
  }
  const probed = await probe;
  trackDoubt(ctx, info, probed);
  const now = ctx.deps.clock.now();
  const heartbeat = buildHeartbeat(ctx, info, snapshot, now, probed, read?.answeredFrom);
  // The pause gate. The process stopped (SIGSTOP, a frozen VM, CPU starvation) after this cycle's
  // topology read began, and before `now` was taken: the read answered from before the pause, or
  // its timeout fired on resume (the cycle would go on with the last confirmation), while the
  // heartbeat says "now" and the controller may have acted on the silence meanwhile (marked the
  // shard offline: a primary must fence before claiming itself alive then). The cycle runs again
  // with a fresh read; a pause after `now` leaves the heartbeat stamped before it, true as it is.
  const pausedMs = ctx.pauses.pausedSince(readFrom);
  if (pausedMs !== undefined) {
    ctx.storeRequested = true;
    ctx.logger.warn("the agent paused after its topology read: no heartbeat goes out on that read", {
      ...ctx.epochContext,
      pausedMs: Math.round(pausedMs),
      // At once, or (paused again) at the next cycle.
      rereadNow: !again,
    });
    if (!again) return cycle(ctx, { force: true }, true);
    return { dbUp: info !== undefined, storeUp: ctx.storeUp, heartbeatWritten: false };
  }
  const resumedAt = storeResumedAt(ctx, now);
  let written = false;
  if (heartbeat === undefined) {
    ctx.logger.debug("no heartbeat written: the database never answered and none is stored");
  } else if (!ctx.topologyRead && heartbeat.role === "primary") {
    // Fenced start: claiming primary before reading the topology could revive a replaced primary.
    ctx.logger.warn("no heartbeat written: this primary has not read the topology yet");
  } else if (generation !== ctx.roleGeneration) {
    ctx.logger.debug("heartbeat skipped: the role changed while it was built");
  } else {
    try {
      await withStoreTimeout(ctx.deps.heartbeats.put(heartbeat), ctx.storeTimeoutMs, "heartbeat write");
      storeAnswered(ctx);
      ctx.lastHeartbeat = heartbeat;
      ctx.writtenSignature = reportSignature(heartbeat);
      ctx.heartbeatsWritten++;
      written = true;
      ctx.storeFailingSince = undefined;
      ctx.storeResumedAt = resumedAt;
      ctx.lastHeartbeatWrittenAt = ctx.monotonicNow();
      endFailsafe(ctx);
      wakeController(ctx, heartbeat);
    } catch (error) {
      ctx.storeRequested = true;
      storeFailed(ctx, "heartbeat write", error);
      if (info?.role === "primary") await observeStoreWitnesses(ctx);
    }
  }
  // Not written (failed, skipped, nothing to write yet): the next cycle tries again.
  if (!written) ctx.storeRequested = true;
  if (guarded && !guardFirst && info) {
    const current = info;
    await ctx.roleLock.run(() => tryEnforceWriteGuard(ctx, current));
  }
  if (written && !ctx.registered) {
    try {
      await withStoreTimeout(ctx.deps.shards.register(ctx.shard), ctx.storeTimeoutMs, "shard registration");
      ctx.registered = true;
    } catch (error) {
      storeFailed(ctx, "shard registration", error);
    }
  }
  return { dbUp: info !== undefined, storeUp: snapshot !== undefined && written, heartbeatWritten: written };
}

/**
 * After writing a heartbeat the controller should act on soon (a confirmed crash report, a
 * replica's link down or its probe failing), tells the controller to look now: once per crash and
 * per episode of doubt. The heartbeat is written first, so the controller's read finds it. In
 * Lambda these wake-ups start the runs that watch a shard in doubt (functions/controller/handler.ts).
 */
function wakeController(ctx: AgentContext, heartbeat: HeartbeatInput): void {
  const wake = ctx.deps.wake;
  if (wake === undefined) return;
  const crash = heartbeat.db_status === "down" ? heartbeat.db_crash : undefined;
  let reason: Wake["reason"];
  let key: string;
  if (crash !== undefined && crash.last_seen - crash.first_seen >= CRASH_CONFIRM_MS * 1000) {
    reason = "crash";
    key = `crash:${crash.first_seen}`;
  } else if (
    heartbeat.role === "replica" &&
    heartbeat.primary_link === "down" &&
    ctx.doubtSince !== undefined
  ) {
    reason = "link_down";
    key = `link_down:${ctx.doubtSince}`;
  } else if (
    heartbeat.role === "replica" &&
    heartbeat.primary_probe !== undefined &&
    heartbeat.primary_probe !== "ok" &&
    ctx.doubtSince !== undefined
  ) {
    // A hung or fenced primary keeps the replication link up: only the probe tells.
    reason = "probe";
    key = `probe:${ctx.doubtSince}`;
  } else {
    if (ctx.crash === undefined && ctx.doubtSince === undefined) ctx.wokeFor = undefined;
    return;
  }
  if (ctx.wokeFor === key) return;
  ctx.wokeFor = key;
  void wake.send({ shard: ctx.shard, node: ctx.nodeId, reason, sent_at: Math.round(ctx.deps.clock.now()) });
}

/** Heartbeat cadence while the database or the link to the primary is in doubt. */
export const DOUBT_HEARTBEAT_MS = 150;

/**
 * In doubt: this primary's database died (a crash report stands), or this replica's link to its
 * primary is down, parked, or its probe got no good answer. Heartbeats then go out every
 * DOUBT_HEARTBEAT_MS for at most two failure timeouts, so the controller sees a crash confirmed by
 * both sides within a few hundred ms, and a long outage costs no more writes than usual.
 */
function trackDoubt(
  ctx: AgentContext,
  info: ReplicationInfo | undefined,
  probed: ProbeResult | undefined,
): void {
  const replicaInDoubt =
    info?.role === "replica" &&
    (isParked(info) || info.primary?.link !== "up" || (probed !== undefined && probed !== "ok"));
  if (ctx.crash !== undefined || replicaInDoubt) ctx.doubtSince ??= ctx.monotonicNow();
  else ctx.doubtSince = undefined;
}

function inDoubt(ctx: AgentContext): boolean {
  return (
    ctx.doubtSince !== undefined && ctx.monotonicNow() - ctx.doubtSince < 2 * ctx.options.failureTimeoutMs
  );
}

/**
 * Runs a cycle every heartbeatIntervalMs, every DOUBT_HEARTBEAT_MS while in doubt, and at
 * once when woken (`ctx.wakeHeartbeat`: a crash seen, a replica parked). After a failure it retries
 * after a jittered back-off capped at the interval: failing agents spread out, and the cadence the
 * failure detector depends on is never stretched.
 */
export async function runHeartbeatLoop(ctx: AgentContext, signal: AbortSignal): Promise<void> {
  const interval = ctx.options.heartbeatIntervalMs;
  const backoff = new Backoff({
    baseMs: Math.max(1, Math.floor(interval / 4)),
    capMs: interval,
    floorMs: 20,
  });
  let wake = new AbortController();
  ctx.pauses.start();
  ctx.wakeHeartbeat = () => {
    // What woke it (a crash seen, a replica parked) is reported now, not at the keepalive.
    ctx.storeRequested = true;
    wake.abort();
  };
  try {
    while (!signal.aborted) {
      let delay: number;
      try {
        const started = ctx.monotonicNow();
        const result = await runCycle(ctx);
        const healthy =
          result.quiet === true || (result.heartbeatWritten && (result.dbUp || ctx.crash !== undefined));
        if (healthy) backoff.reset();
        const cadence = inDoubt(ctx) ? Math.min(interval, DOUBT_HEARTBEAT_MS) : interval;
        delay = healthy
          ? Math.max(0, cadence - (ctx.monotonicNow() - started))
          : Math.min(backoff.next(), cadence);
      } catch (error) {
        ctx.logger.error("heartbeat cycle failed; retrying", { error: errorMessage(error) });
        delay = backoff.next();
      }
      // A wake that came during the cycle is served by the next one, at once.
      if (!wake.signal.aborted) await sleep(delay, AbortSignal.any([signal, wake.signal]));
      if (wake.signal.aborted) wake = new AbortController();
    }
  } finally {
    ctx.pauses.stop();
    ctx.wakeHeartbeat = () => {};
  }
}
