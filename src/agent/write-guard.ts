import { errorMessage } from "../core/errors.ts";
import {
  classifyReplicas,
  FENCED_MIN_REPLICAS,
  GUARD_MAX_LAG_S,
  type ListedReplica,
  planWriteGuard,
  storeWitnessesOf,
  type WriteGuardPlan,
} from "../core/write-guard.ts";
import { clockStepFence, clockStepFreeze } from "./clock-watch.ts";
import type { AgentContext } from "./context.ts";
import { FENCING_CONFIG_KEYS } from "./fencing.ts";
import { probeCounts } from "./primary-probe.ts";
import { type ReplicationInfo, syncedReplicaAddresses } from "./redis-info.ts";
import { withStoreTimeout } from "./scheduling.ts";

/**
 * Applies the write guard (src/core/write-guard.ts) to the database: one place that sets
 * `min-replicas-to-write`/`min-replicas-max-lag`, and keeps the stored replica set (the guard's
 * membership) in step. Callers hold `ctx.roleLock`.
 */

/**
 * Node ids of the replicas attached with a completed sync and acknowledging within the guard's
 * lag, and how many more such replicas no known node id stands for (`classifyReplicas`): Redis
 * counts those too, so the guard demands them as well.
 */
export function attachedReplicas(
  ctx: AgentContext,
  info: ReplicationInfo,
): { attached: string[]; outsiders: number } {
  return classifyReplicas(listedReplicas(ctx, info), ctx.nodeId);
}

/**
 * The replicas the database lists, each with the node id its address maps to and whether it
 * acknowledges. For a while after a forward step of the database's clock (\`clockStepFreeze\`)
 * every online replica counts as acknowledging: its lag reads the step too high while \`WAIT\` still
 * counts it (nemesis seed 7381, guarantee 1).
 */
function listedReplicas(ctx: AgentContext, info: ReplicationInfo): ListedReplica[] {
  const lagTrusted = clockStepFreeze(ctx) === undefined;
  const acknowledging = new Set(syncedReplicaAddresses(info, lagTrusted ? GUARD_MAX_LAG_S : undefined));
  return syncedReplicaAddresses(info).map((address) => ({
    address,
    // A replica without a heartbeat has no agent yet: it joins once its agent reports.
    nodeId: ctx.knownNodes.get(address),
    acknowledging: acknowledging.has(address),
  }));
}

/**
 * The acknowledging replicas this primary's database lists that no node id names, sorted: the
 * heartbeat's \`outsiders\` (a failover waits for them: gate \`outsider_unheard\`).
 */
export function unnamedReplicas(ctx: AgentContext, info: ReplicationInfo): string[] {
  return listedReplicas(ctx, info)
    .filter((replica) => replica.acknowledging && replica.nodeId === undefined)
    .map((replica) => replica.address)
    .sort();
}

/**
 * A primary whose heartbeat write failed looks at its replicas' probes: the first failure sets
 * the baseline of their published heartbeat counts; later ones name the members whose counts
 * moved on (they reach the store while this agent does not). A count that went down (an agent
 * restarted) becomes its new baseline.
 */
export async function observeStoreWitnesses(ctx: AgentContext): Promise<void> {
  let counts: Map<string, number>;
  try {
    counts = probeCounts(await ctx.db.clientNames());
  } catch (error) {
    ctx.logger.debug("could not list the replicas' probes", { error: errorMessage(error) });
    return;
  }
  const baseline = ctx.witnessBaseline;
  if (baseline === undefined) {
    ctx.witnessBaseline = counts;
    ctx.failsafeSince = ctx.deps.clock.now();
    ctx.logger.info("heartbeat write failed: watching whether the replicas still reach the store", {
      ...ctx.epochContext,
      members: ctx.guardMembers,
      probes: Object.fromEntries(counts),
    });
    return;
  }
  const next = new Map(baseline);
  for (const [id, count] of counts) if ((baseline.get(id) ?? count) >= count) next.set(id, count);
  ctx.witnessBaseline = next;
  const witnesses = storeWitnessesOf(ctx.guardMembers, next, counts);
  if (witnesses.join() !== ctx.storeWitnesses.join()) {
    ctx.logger.warn("replicas reach the coordination store while this agent cannot", {
      ...ctx.epochContext,
      witnesses,
      members: ctx.guardMembers,
    });
  }
  ctx.storeWitnesses = witnesses;
}

/** A heartbeat was written: the store answers this agent again. */
export function endFailsafe(ctx: AgentContext): void {
  if (ctx.witnessBaseline === undefined) return;
  ctx.logger.warn("coordination store answers this primary again", {
    ...ctx.epochContext,
    failsafeSince: ctx.failsafeSince,
    durationMs: ctx.failsafeSince === undefined ? undefined : ctx.deps.clock.now() - ctx.failsafeSince,
  });
  ctx.witnessBaseline = undefined;
  ctx.storeWitnesses = [];
  ctx.failsafeSince = undefined;
}

/** The acknowledging replicas no node id names, as last logged per agent (a change is logged once). */
const loggedOutsiders = new WeakMap<AgentContext, string>();

/**
 * Says once per change which acknowledging replicas this primary cannot name (no heartbeat, or one
 * older than the report window of a node that is not a member): Redis counts them, the guard
 * demands them, but no failover can rank or promote them: the heartbeat lists them and a failover
 * waits while they are unaccounted for (gate \`outsider_unheard\`; docs/safety.md, guarantee 1's
 * assumption).
 */
function reportOutsiders(ctx: AgentContext, info: ReplicationInfo): void {
  const unnamed = unnamedReplicas(ctx, info);
  const key = unnamed.join(",");
  if ((loggedOutsiders.get(ctx) ?? "") === key) return;
  loggedOutsiders.set(ctx, key);
  if (unnamed.length === 0) {
    ctx.logger.info("every acknowledging replica has a node id again", ctx.epochContext);
    return;
  }
  ctx.logger.warn(
    "replicas no node id names acknowledge writes: a failover waits for them until an agent runs on each",
    {
      ...ctx.epochContext,
      replicas: unnamed,
      why: "no heartbeat names them (a database without an agent, or an agent silent longer than its report window)",
    },
  );
}

/** The plan for this node now, from what the context holds. */
export function currentPlan(ctx: AgentContext, info: ReplicationInfo): WriteGuardPlan {
  // Judged first: this INFO may show a forward step, and then its lags are not to be trusted.
  const clockStepped = clockStepFence(ctx, info);
  const { attached, outsiders } = attachedReplicas(ctx, info);
  return planWriteGuard({
    policy: ctx.options.fencePolicy,
    role: info.role,
    confirmed: ctx.confirmed,
    unconfirmedReason: ctx.unconfirmedReason,
    members: ctx.guardMembers,
    attached,
    outsiders,
    msSinceHeartbeatWritten: ctx.monotonicNow() - ctx.lastHeartbeatWrittenAt,
    fenced: ctx.state.state.fence !== undefined,
    topologyFresh: ctx.topologyFresh,
    fenceTimeoutMs: ctx.options.fenceTimeoutMs,
    restarted: ctx.dbRestarted,
    promotionWindowOpen: ctx.monotonicNow() < ctx.promotionFenceUntil,
    clockStepped,
    lagUntrusted: clockStepFreeze(ctx),
    storeWitnesses: ctx.storeWitnesses,
  });
}

/** What the database was last set to, so an unchanged plan costs no command. */
function appliedKey(plan: WriteGuardPlan, minReplicas?: number): string {
  switch (plan.kind) {
    case "fence":
      return "fence";
    case "open":
      return "open";
    case "guard":
      return `guard:${minReplicas ?? plan.minReplicas}`;
    case "replica":
      return "replica";
  }
}

async function setGuard(ctx: AgentContext, minReplicas: number): Promise<void> {
  await ctx.db.configSet({
    "min-replicas-max-lag": String(GUARD_MAX_LAG_S),
    "min-replicas-to-write": String(minReplicas),
  });
}

/** Refuses every write; the operator's values are saved first so `open` can restore them. */
export async function fence(ctx: AgentContext, reason: string): Promise<void> {
  const wasFenced = ctx.state.state.fence !== undefined;
  if (!wasFenced) {
    const saved = await ctx.db.configGet(FENCING_CONFIG_KEYS);
    // A database started fenced by its config file (docs/deploy.md) has no operator value to keep.
    if (Number(saved["min-replicas-to-write"]) >= FENCED_MIN_REPLICAS) saved["min-replicas-to-write"] = "0";
    ctx.state.update({ fence: { saved, since: ctx.deps.clock.now() } });
  }
  const savedLag = Number(ctx.state.state.fence?.saved["min-replicas-max-lag"]);
  await ctx.db.configSet({
    // The check is off when the lag is 0.
    "min-replicas-max-lag": String(Number.isInteger(savedLag) && savedLag > 0 ? savedLag : GUARD_MAX_LAG_S),
    "min-replicas-to-write": String(FENCED_MIN_REPLICAS),
  });
  ctx.appliedGuard = "fence";
  if (!wasFenced) {
    ctx.logger.error("writes fenced: this primary refuses writes", {
      ...ctx.epochContext,
      reason,
      policy: ctx.options.fencePolicy,
      // When the database confirmed the fence, on the clock of the heartbeat's agent_updated (the
      // line's timestamp is the host's wall clock, which the AWS-aligned clock may clamp).
      fencedAt: ctx.deps.clock.now(),
    });
  }
}

/** Restores the operator's values saved by `fence`; a no-op when not fenced. */
export function restoreOperatorSettings(ctx: AgentContext, reason: string): Promise<void> {
  return unfence(ctx, { kind: "open", join: [], leave: [], reason }, 0);
}

/** Ends a fence: the guard's value under `failsafe`, the operator's saved values otherwise. */
async function unfence(ctx: AgentContext, plan: WriteGuardPlan, minReplicas: number): Promise<void> {
  const fenced = ctx.state.state.fence;
  if (plan.kind === "guard") {
    await setGuard(ctx, minReplicas);
  } else if (fenced) {
    // Restore the lag first: with min-replicas-to-write still high, writes stay refused until the end.
    const saved = fenced.saved;
    const ordered = Object.fromEntries(
      [...FENCING_CONFIG_KEYS]
        .reverse()
        .flatMap((key) => (saved[key] === undefined ? [] : [[key, saved[key]]])),
    );
    await ctx.db.configSet(ordered);
  } else {
    // A database started fenced by its config file (docs/deploy.md) is opened by its agent.
    const current = await ctx.db.configGet(["min-replicas-to-write"]);
    if (Number(current["min-replicas-to-write"]) >= FENCED_MIN_REPLICAS) {
      await ctx.db.configSet({ "min-replicas-to-write": "0" });
      ctx.logger.warn("write fence of the database's config lifted", {
        ...ctx.epochContext,
        reason: "reason" in plan ? plan.reason : plan.kind,
      });
    }
  }
  if (fenced) {
    ctx.state.update({ fence: undefined });
    ctx.logger.warn("write fence lifted", {
      ...ctx.epochContext,
      reason: "reason" in plan ? plan.reason : plan.kind,
      fencedSince: fenced.since,
    });
  }
}

/**
 * A database started fenced by its config (docs/deploy.md) waits for its agent's judgment: until a
 * topology read has confirmed this primary, the agent keeps that fence (as its own, lifted like any
 * other once the topology confirms) instead of opening it with the guard's value. Nemesis seed 5803
 * (guarantee 1): an agent restarted without its state read the topology (offline) while the
 * primary's new process, started fenced from its RDB, was hung; when the process answered, the
 * guard for a new process opened it before any read confirmed it, an anonymous replica
 * acknowledged 76 writes in the second before the fence, and the shard was brought back on another
 * node. Costs one CONFIG GET per guard pass until a topology read confirms this primary.
 */
async function heldByConfigFence(ctx: AgentContext): Promise<WriteGuardPlan | undefined> {
  if (ctx.confirmed === true || ctx.state.state.fence !== undefined) return undefined;
  const current = await ctx.db.configGet(["min-replicas-to-write"]);
  if (Number(current["min-replicas-to-write"]) < FENCED_MIN_REPLICAS) return undefined;
  const reason =
    "the database started fenced by its config: kept so until a topology read confirms this primary";
  await fence(ctx, reason);
  return { kind: "fence", reason };
}

/**
 * Brings the database in line with the plan and, under the guard, the stored replica set: a
 * joiner is demanded by the database before the store lists it, except that a fence is lifted only
 * after the store lists the joiners (nothing is writable until then); a leaver is removed from the store
 * (only while the topology still names this primary) before the database stops demanding it.
 */
export async function enforceWriteGuard(ctx: AgentContext, info: ReplicationInfo): Promise<WriteGuardPlan> {
  const plan = currentPlan(ctx, info);
  if (info.role === "primary") reportOutsiders(ctx, info);
  if (plan.kind === "replica") {
    ctx.appliedGuard = "replica";
    return plan;
  }
  if (plan.kind === "fence") {
    if (ctx.appliedGuard !== "fence" || ctx.state.state.fence === undefined) await fence(ctx, plan.reason);
    return plan;
  }
  const held = await heldByConfigFence(ctx);
  if (held !== undefined) return held;
  let minReplicas = plan.kind === "guard" ? plan.minReplicas : 0;
  const epoch = ctx.lastTopology?.epoch;
  // A fence is lifted only once the store lists every member the guard will demand. The
  // controller waits for an unheard member it knows of (gate member_unheard); one the database
  // demands but the store does not list may acknowledge writes nobody waits for (nemesis seed
  // 5103: a new primary lifted its promotion fence with {node-1, node-2} demanded while its
  // "replica set add" timed out, an AZ split put node-1 on its side, and node-2 was promoted past
  // 100 writes node-1 acknowledged). While fenced nothing is writable, so listing first cannot make
  // the controller count on a demand the database lacks; an open primary keeps the order below.
  // (\`state.fence\` is set with every fence, by this file and the crash watch, and survives restarts.)
  const lifting = ctx.state.state.fence !== undefined;
  if (lifting) await storeJoiners(ctx, plan);
  if (
    ctx.appliedGuard !== appliedKey(plan, minReplicas) ||
    ctx.appliedGuardEpoch !== epoch ||
    ctx.state.state.fence !== undefined
  ) {
    await unfence(ctx, plan, minReplicas);
    if (plan.kind === "guard") {
      ctx.logger.info("write guard set", { ...ctx.epochContext, minReplicas, reason: plan.reason });
    }
    ctx.appliedGuard = appliedKey(plan, minReplicas);
    ctx.appliedGuardEpoch = epoch;
  }
  const topology = ctx.lastTopology;
  if (!lifting) await storeJoiners(ctx, plan);
  if (plan.leave.length > 0 && ctx.confirmed === true) {
    const removed = await withStoreTimeout(
      ctx.deps.replicaSets.removeWhilePrimary(ctx.shard, ctx.nodeId, plan.leave, topology?.epoch),
      ctx.storeTimeoutMs,
      "replica set remove",
    );
    if (!removed) {
      ctx.logger.warn("replica set unchanged: the topology no longer names this primary", {
        ...ctx.epochContext,
        replicas: plan.leave,
      });
      return plan;
    }
    ctx.guardMembers = ctx.guardMembers.filter((id) => !plan.leave.includes(id));
    if (plan.kind === "guard") {
      minReplicas -= plan.leave.length;
      await setGuard(ctx, minReplicas);
      ctx.appliedGuard = `guard:${minReplicas}`;
    }
    ctx.logger.warn("replicas left the replica set; the write guard demands fewer", {
      ...ctx.epochContext,
      replicas: plan.leave,
      minReplicas,
    });
  }
  return plan;
}

/** Lists the plan's joiners in the stored replica set (a store call under the store timeout). */
async function storeJoiners(ctx: AgentContext, plan: { readonly join: readonly string[] }): Promise<void> {
  if (plan.join.length === 0) return;
  await withStoreTimeout(
    ctx.deps.replicaSets.add(ctx.shard, ctx.nodeId, plan.join),
    ctx.storeTimeoutMs,
    "replica set add",
  );
  ctx.guardMembers = [...new Set([...ctx.guardMembers, ...plan.join])].sort();
  ctx.logger.info("replicas joined the replica set", { replicas: plan.join, ...ctx.epochContext });
}

/** Like `enforceWriteGuard`, logging instead of throwing (loops and timers). */
export async function tryEnforceWriteGuard(ctx: AgentContext, info: ReplicationInfo): Promise<void> {
  try {
    await enforceWriteGuard(ctx, info);
  } catch (error) {
    ctx.logger.warn("could not apply the write guard", { ...ctx.epochContext, error: errorMessage(error) });
  }
}
