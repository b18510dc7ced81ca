import {
  type CycleObservation,
  cadenceMs,
  type DatabaseObservation,
  planCycle,
} from "../core/agent-cycle.ts";
import { errorMessage } from "../core/errors.ts";
import type { HeartbeatInput } from "../core/model.ts";
import { GUARD_MAX_LAG_S } from "../core/write-guard.ts";
import { Backoff, sleep } from "./backoff.ts";
import type { AgentContext } from "./context.ts";
import { guardNewProcess, readInfo, reportIdentityConflict } from "./db-identity.ts";
import { retryDeposed } from "./depose.ts";
import { buildHeartbeat } from "./heartbeat-report.ts";
import { isParked, type ProbeResult } from "./primary-probe.ts";
import { type ReplicationInfo, syncedReplicaAddresses } from "./redis-info.ts";
import { withStoreTimeout } from "./scheduling.ts";
import {
  judgeRestartedPark,
  readSnapshot,
  reconcile,
  replicaToWatch,
  reportNamedReplica,
  verdictFor,
} from "./topology-read.ts";
import { endFailsafe, observeStoreWitnesses, tryEnforceWriteGuard } from "./write-guard.ts";

/**
 * The heartbeat loop: the effects of one cycle (INFO, the primary probe, one shard snapshot, the
 * topology's verdict, the write guard, the heartbeat write, the shard's registration, waking the
 * controller) in the order the cycle's pure plan gives them (`planCycle`, src/core/agent-cycle.ts).
 * The database's identity is src/agent/db-identity.ts's, the topology read
 * src/agent/topology-read.ts's, the heartbeat's content src/agent/heartbeat-report.ts's.
 */

/** What one cycle achieved; the loop paces itself on it. */
export interface HeartbeatCycleResult {
  readonly dbUp: boolean;
  readonly storeUp: boolean;
  readonly heartbeatWritten: boolean;
  /** Nothing to report: the cycle left the store alone (its keepalive not due). */
  readonly quiet?: boolean;
}

/** A replica probes its primary (or the one it was parked from); a primary closes its probe. */
async function probePrimary(ctx: AgentContext, info: ReplicationInfo): Promise<ProbeResult | undefined> {
  if (info.role !== "replica" || !info.primary) {
    ctx.probe.close();
    return undefined;
  }
  if (!isParked(info)) ctx.probe.track(`${info.primary.host}:${info.primary.port}`);
  else ctx.probe.resumeParkedWatch();
  if (ctx.probe.address === undefined) return undefined;
  try {
    return await ctx.probe.probe(info);
  } catch (error) {
    ctx.logger.warn("primary probe failed", { ...ctx.epochContext, error: errorMessage(error) });
    return undefined;
  }
}

/** This cycle's INFO and probe, as the plan reads them. */
function observed(info: ReplicationInfo | undefined, probed: ProbeResult | undefined): DatabaseObservation {
  if (info === undefined) return { answered: false };
  return { answered: true, role: info.role, link: info.primary?.link, parked: isParked(info), probed };
}

/** The plan of the cycle from what it observed so far, on the agent's state now. */
function plan(ctx: AgentContext, observation: CycleObservation) {
  return planCycle(ctx.cycleState(), observation, ctx.options, ctx.monotonicNow());
}

/** Records this cycle's doubt (it sets the cadence and the heartbeat's keepalive). */
function trackDoubt(
  ctx: AgentContext,
  info: ReplicationInfo | undefined,
  probed: ProbeResult | undefined,
): void {
  ctx.schedule.doubtSince = plan(ctx, { database: observed(info, probed) }).doubtSince;
}

async function guard(ctx: AgentContext, info: ReplicationInfo): Promise<void> {
  await ctx.roleLock.run(() => tryEnforceWriteGuard(ctx, info));
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
  const { schedule } = ctx;
  // Captured before INFO: a role change after this point makes this cycle's heartbeat stale.
  let generation = ctx.roleGeneration;
  const planned = plan(ctx, { force: options.force === true }).readTopology;
  schedule.storeRequested = false;
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
  // A promoted node keeps fencing the old primaries it could not reach yet (not awaited).
  if (firstInfo?.role === "primary") void retryDeposed(ctx, firstInfo);
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
      generation,
    );
    // A primary learns a new replica's node id from the store (its heartbeat): until it does, the
    // replica cannot join the write guard's set, and no failover may promote it.
    const unknownReplica =
      firstInfo?.role === "primary" &&
      syncedReplicaAddresses(firstInfo, GUARD_MAX_LAG_S).some((address) => !ctx.knownNodes.has(address));
    // A cycle held up past its keepalive (the agent stalled) reads the topology before the guard
    // acts on what it last read.
    const quiet = plan(ctx, { database: observed(firstInfo, probed), heartbeat: report, unknownReplica });
    if (!quiet.readTopology) {
      if (firstInfo && quiet.guard) await guard(ctx, firstInfo);
      return { dbUp: firstInfo !== undefined, storeUp: ctx.storeUp, heartbeatWritten: false, quiet: true };
    }
    readFrom = ctx.pauses.mark();
    snapshot = await readSnapshot(ctx);
  }
  ctx.topologyFresh = snapshot !== undefined;
  if (snapshot === undefined) schedule.request();
  if (info && snapshot) {
    schedule.topologyDoubt = replicaToWatch(ctx, snapshot, info);
    judgeRestartedPark(ctx, snapshot, info);
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
  // The topology no longer confirms this primary (offline, a failover away, another named): its
  // fence goes up before the heartbeat goes out, so whoever reads it finds the writes refused
  // already. Any other guard follows the write (it depends on whether the write went through).
  const guarding = plan(ctx, { database: observed(info, undefined) });
  if (guarding.guardFirst && info) await guard(ctx, info);
  const probed = await probe;
  trackDoubt(ctx, info, probed);
  const now = ctx.deps.clock.now();
  const heartbeat = buildHeartbeat(ctx, info, snapshot, now, probed, read?.answeredFrom, generation);
  // The pause gate. The process stopped (SIGSTOP, a frozen VM, CPU starvation) after this cycle's
  // topology read began, and before `now` was taken: the read answered from before the pause, or
  // its timeout fired on resume (the cycle would go on with the last confirmation), while the
  // heartbeat says "now" and the controller may have acted on the silence meanwhile (marked the
  // shard offline: a primary must fence before claiming itself alive then). The cycle runs again
  // with a fresh read; a pause after `now` leaves the heartbeat stamped before it, true as it is.
  const pausedMs = ctx.pauses.pausedSince(readFrom);
  if (pausedMs !== undefined) {
    schedule.request();
    ctx.logger.warn("the agent paused after its topology read: no heartbeat goes out on that read", {
      ...ctx.epochContext,
      pausedMs: Math.round(pausedMs),
      // At once, or (paused again) at the next cycle.
      rereadNow: !again,
    });
    if (!again) return cycle(ctx, { force: true }, true);
    return { dbUp: info !== undefined, storeUp: ctx.storeUp, heartbeatWritten: false };
  }
  if (heartbeat === undefined) {
    ctx.logger.debug("no heartbeat written: the database never answered and none is stored");
  }
  const written =
    heartbeat !== undefined &&
    (await writeHeartbeat(ctx, heartbeat, now, info, generation !== ctx.roleGeneration));
  // Not written (failed, skipped, nothing to write yet): the next cycle tries again.
  if (!written) schedule.request();
  if (guarding.guard && !guarding.guardFirst && info) await guard(ctx, info);
  if (written && !schedule.registered) {
    try {
      await withStoreTimeout(ctx.deps.shards.register(ctx.shard), ctx.storeTimeoutMs, "shard registration");
      schedule.registered = true;
    } catch (error) {
      ctx.store.failed("shard registration", error, ctx.deps.clock.now());
    }
  }
  return { dbUp: info !== undefined, storeUp: snapshot !== undefined && written, heartbeatWritten: written };
}

/**
 * Writes this cycle's heartbeat unless the plan says not to (a primary before its first topology
 * read: claiming primary could revive a replaced primary; a role changed while it was built), then
 * wakes the controller if the heartbeat calls for it. Whether it was written.
 */
async function writeHeartbeat(
  ctx: AgentContext,
  heartbeat: HeartbeatInput,
  now: number,
  info: ReplicationInfo | undefined,
  roleChanged: boolean,
): Promise<boolean> {
  const verdict = plan(ctx, { heartbeat, roleChanged }).writeHeartbeat;
  if (verdict === "primary_before_topology") {
    ctx.logger.warn("no heartbeat written: this primary has not read the topology yet");
    return false;
  }
  if (verdict !== "write") {
    ctx.logger.debug("heartbeat skipped: the role changed while it was built");
    return false;
  }
  const resumedAt = ctx.store.resumedAtFor(now);
  try {
    await withStoreTimeout(ctx.deps.heartbeats.put(heartbeat), ctx.storeTimeoutMs, "heartbeat write");
  } catch (error) {
    ctx.schedule.request();
    ctx.store.failed("heartbeat write", error, ctx.deps.clock.now());
    if (info?.role === "primary") await observeStoreWitnesses(ctx);
    return false;
  }
  ctx.store.answered();
  ctx.schedule.written(heartbeat, ctx.monotonicNow());
  ctx.store.heartbeatWritten(resumedAt);
  endFailsafe(ctx);
  // The heartbeat is written first, so the controller's read finds it. In Lambda these wake-ups
  // start the runs that watch a shard in doubt (functions/controller/handler.ts).
  const after = plan(ctx, { heartbeat });
  ctx.schedule.wokeFor = after.wokeFor;
  if (after.wake !== undefined && ctx.deps.wake !== undefined) {
    void ctx.deps.wake.send({
      shard: ctx.shard,
      node: ctx.nodeId,
      reason: after.wake.reason,
      sent_at: Math.round(ctx.deps.clock.now()),
    });
  }
  return true;
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
    ctx.schedule.request();
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
        const cadence = cadenceMs(ctx.schedule.doubtSince, ctx.options, ctx.monotonicNow());
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
