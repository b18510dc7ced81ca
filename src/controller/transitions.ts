import { failoverStateOf, topologyBefore } from "../core/continuation.ts";
import { deposedAfter, deposedWhenOffline } from "../core/depose.ts";
import { errorMessage } from "../core/errors.ts";
import { bridgingLink, type LineageLink, promotionAncestry, reportedLink } from "../core/identity.ts";
import type { Candidate, FailoverPhase, FailoverState, Heartbeat, Lineage, Topology } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import { aborted, type ControllerDeps, type Outcome, type PhaseTimeouts, publish } from "./deps.ts";
import type { ShardLock } from "./lock.ts";

/**
 * The shard's state transitions, each one fenced topology write: a plan starts (epoch + 1,
 * failing_over), a phase is recorded, the change completes (online), the shard goes offline
 * (epoch + 1), a plan is abandoned before PROMOTE (epoch + 1). Every change of plan moves the
 * epoch; only recording a phase of the same plan and completing it keep it.
 */

/** One orchestration in progress: the lock and the state last written to the topology. */
export interface Run {
  readonly deps: ControllerDeps;
  readonly shard: string;
  readonly lock: ShardLock;
  readonly timeouts: PhaseTimeouts;
  /** Time the invocation has left (Lambda); unlimited for a local process. */
  readonly remainingMs: () => number;
  topology: Topology;
}

/** What the log line and the event of a failover's start and end say about it. */
function failoverDetail(run: Run, state: FailoverState, epoch: number): Record<string, unknown> {
  return {
    shard: run.shard,
    epoch,
    kind: state.kind,
    old_primary: state.old_primary_node_id,
    new_primary: state.new_primary_node_id,
    reason: state.reason,
  };
}

export function stateOf(run: Run): FailoverState {
  return failoverStateOf(run.topology);
}

/** A fenced topology write; with `guard`, also conditioned on the old primary's replica-set version read there. */
async function write(run: Run, expectedEpoch: number, planned: Topology, guard?: ShardSnapshot) {
  // Drained nodes stay drained through every change of primary: only undrain lifts it. The
  // lineage history is kept too (links are facts: they never go stale, only out of the window).
  const drained = planned.drained ?? run.topology.drained;
  const ancestry = planned.ancestry ?? run.topology.ancestry;
  const next = {
    ...planned,
    ...(drained === undefined ? {} : { drained }),
    ...(ancestry === undefined ? {} : { ancestry }),
  };
  const primary = next.failover?.old_primary_node_id;
  const replicaSet =
    guard !== undefined && primary !== undefined
      ? { primary, version: guard.replicaSetVersions[primary] }
      : undefined;
  await run.lock.writeTopology(expectedEpoch, next, replicaSet);
  run.topology = next;
}

/**
 * Starts a plan under epoch + 1 (status failing_over, the plan stored so another controller can
 * continue it: `continue_failover`). `decidedOn` is the snapshot the plan was chosen from: the write is conditioned on
 * the old primary's replica set still being at the version read there, so a set that shrank
 * after the decision aborts the plan (PlanStale) instead of promoting a node outside it.
 */
export async function startPlan(run: Run, state: FailoverState, decidedOn: ShardSnapshot): Promise<void> {
  const now = run.deps.clock.now();
  const epoch = run.topology.epoch + 1;
  // A replan names another target: the link is its report's, not the earlier target's.
  const { target_link: _earlier, ...plan } = state;
  const targetLink = reportedLink(decidedOn.nodes.find((node) => node.node_id === state.new_primary_node_id));
  // The old primaries still unfenced, which the target fences before it opens: a replan's earlier
  // target past its PROMOTE joins them, the target itself and those whose agents stood down leave.
  const deposed = deposedAfter({
    topology: run.topology,
    epoch,
    primary: { node_id: state.new_primary_node_id, address: state.new_primary_address },
    replacesNamed: false,
    reports: decidedOn.nodes,
  });
  const { deposed: _before, ...current } = run.topology;
  const next: Topology = {
    ...current,
    ...(deposed === undefined ? {} : { deposed }),
    epoch,
    status: "failing_over",
    phase: "epoch_bumped",
    updated_at: now,
    failover: {
      ...plan,
      ...(targetLink === undefined ? {} : { target_link: targetLink }),
      phase_started: { ...state.phase_started, epoch_bumped: now },
    },
  };
  await write(run, epoch - 1, next, decidedOn);
  const detail = failoverDetail(run, state, epoch);
  run.deps.metrics.count("failoverStarted");
  run.deps.log.info("failover started", detail);
  await publish(run.deps, "FailoverStarted", detail);
  await run.deps.onPhase?.(run.shard, "epoch_bumped", epoch);
}

/** Records that `phase` of the current plan starts now (same epoch, same plan). */
export async function recordPhase(run: Run, phase: FailoverPhase): Promise<void> {
  const now = run.deps.clock.now();
  const state = stateOf(run);
  await write(run, run.topology.epoch, {
    ...run.topology,
    phase,
    updated_at: now,
    failover: { ...state, phase_started: { ...state.phase_started, [phase]: now } },
  });
}

export function phaseTimings(state: FailoverState, end: number): Record<string, number> {
  const entries = Object.entries(state.phase_started).sort((a, b) => a[1] - b[1]);
  const timings: Record<string, number> = {};
  entries.forEach(([phase, start], index) => {
    timings[phase] = (entries[index + 1]?.[1] ?? end) - start;
  });
  return timings;
}

/** History, topology online (or back to paused), events. The caller releases the lock. */
export async function complete(run: Run): Promise<Outcome> {
  const state = stateOf(run);
  const now = run.deps.clock.now();
  const epoch = run.topology.epoch;
  await run.lock.appendHistory({
    shard: run.shard,
    epoch,
    kind: state.kind,
    at: now,
    old_primary_node_id: state.old_primary_node_id,
    new_primary_node_id: state.new_primary_node_id,
    reason: state.reason,
    candidates: state.candidates,
    phase_timings: phaseTimings(state, now),
  });
  const paused = run.topology.paused_reason !== undefined;
  const reports = await nodeReports(run);
  const ancestry = ancestryAfter(run, state, reports);
  // The replaced primary joins the old primaries still unfenced (nemesis seed 6811); the new
  // primary and those whose agents stood down leave (src/core/depose.ts \`deposedAfter\`).
  const deposed = deposedAfter({
    topology: run.topology,
    epoch,
    primary: { node_id: state.new_primary_node_id, address: state.new_primary_address },
    replacesNamed: true,
    reports,
  });
  await write(run, epoch, {
    ...(ancestry === undefined ? {} : { ancestry }),
    ...(deposed === undefined ? {} : { deposed }),
    shard: run.shard,
    epoch,
    primary_node_id: state.new_primary_node_id,
    primary_address: state.new_primary_address,
    status: paused ? "paused" : "online",
    paused_reason: run.topology.paused_reason,
    updated_at: now,
    // An operator's switchover does not hold off the next automatic failover.
    cooldown_until:
      state.kind === "switchover" ? run.topology.cooldown_until : now + run.deps.config.cooldownMs,
  });
  const detail = { ...failoverDetail(run, state, epoch), duration_ms: now - state.started_at };
  run.deps.metrics.count("failoverCompleted");
  run.deps.log.info("failover completed", detail);
  await publish(run.deps, "FailoverCompleted", detail);
  if (state.kind === "bring_online") await publish(run.deps, "ShardOnline", detail);
  return {
    outcome: "completed",
    epoch,
    primary: state.new_primary_node_id,
    reason: `${state.kind} to ${state.new_primary_node_id} completed at epoch ${epoch} in ${now - state.started_at} ms: ${state.reason}`,
  };
}

/**
 * The lineage history with the link the new primary's report shows (its lineage continues its
 * \`prior_lineage\` up to that offset: \`LineageLink\`), the oldest dropped past
 * \`MAX_LINEAGE_LINKS\`; undefined when there is nothing new to record. A failed read only loses the
 * link (the history serves liveness: a parked replica's unpark).
 * Before it, the link the target's report showed when the plan was decided (\`target_link\`), when
 * the promoted database continues that lineage: Redis shows one earlier lineage only, and a target
 * that held the shard's lineage as its \`prior_lineage\` (restarted from its RDB while deposed,
 * brought back as the last resort) takes a new id at its PROMOTE that pushes the shard's lineage
 * out of its report. Without the link a replica on that lineage, parked, finds the new primary
 * neither continuing its data nor superseding it, and stays parked for good (simulator seed
 * 282286: n1 restarted from its RDB under 998b, holding afff to 17,952, brought online and
 * promoted to cb55; n2, parked on afff at 17,952, never followed it). When the target's link is
 * not that one, a peer's report of the link from the plan's lineage to the one the promoted
 * database continues (\`bridgingLink\`): a retarget's target pointed at the earlier target
 * continued onto the id the earlier target's late PROMOTE gave it (simulator seed 325407).
 */
function ancestryAfter(
  run: Run,
  state: FailoverState,
  reports: readonly Heartbeat[] | undefined,
): Topology["ancestry"] {
  const heartbeat = reports?.find((node) => node.node_id === state.new_primary_node_id);
  const prior = heartbeat?.prior_lineage;
  if (heartbeat === undefined || heartbeat.role !== "primary" || prior === undefined) return undefined;
  const before =
    state.target_link?.by === prior.repl_id
      ? state.target_link
      : bridgingLink(reports ?? [], state.lineage?.repl_id, prior.repl_id);
  return promotionAncestry(run.topology.ancestry ?? [], before, {
    repl_id: prior.repl_id,
    until: prior.last_txn_id,
    by: heartbeat.repl_id,
  });
}

/**
 * The nodes' reports as the change completes; undefined when the read fails (the lineage link is
 * then not recorded, and no old primary leaves \`deposed\` for its report).
 */
async function nodeReports(run: Run): Promise<readonly Heartbeat[] | undefined> {
  try {
    return (await run.deps.store.heartbeats.snapshot(run.shard)).nodes;
  } catch (error) {
    run.deps.log.warn("could not read the nodes' reports: the new primary's lineage link is not recorded", {
      shard: run.shard,
      error: errorMessage(error),
    });
    return undefined;
  }
}

export interface OfflineCause {
  readonly reason: string;
  readonly oldPrimary: string | undefined;
  readonly candidates: readonly Candidate[];
  readonly lineage: Lineage | undefined;
  /**
   * The lineage history to record with the offline mark: a continuation's failed target applied
   * its PROMOTE and the stored lineage is its new one, so the history gets that promotion's link
   * (src/core/decide/retarget.ts \`promotedAncestry\`). Absent: the history as it is.
   */
  readonly ancestry?: readonly LineageLink[];
}

/**
 * No eligible node: the shard goes offline under epoch + 1, from an online shard as from one
 * failing over (a late PROMOTE of an earlier plan is fenced by the new epoch).
 */
export async function goOffline(run: Run, cause: OfflineCause): Promise<Outcome> {
  const now = run.deps.clock.now();
  const epoch = run.topology.epoch + 1;
  await write(run, epoch - 1, {
    shard: run.shard,
    epoch,
    status: "offline",
    updated_at: now,
    lineage: cause.lineage,
    cooldown_until: run.topology.cooldown_until,
    deposed: deposedWhenOffline(run.topology, epoch),
    ...(cause.ancestry === undefined ? {} : { ancestry: [...cause.ancestry] }),
  });
  await run.lock.appendHistory({
    shard: run.shard,
    epoch,
    kind: "offline",
    at: now,
    old_primary_node_id: cause.oldPrimary,
    reason: cause.reason,
    candidates: [...cause.candidates],
    phase_timings: {},
  });
  run.deps.log.warn("shard offline", {
    shard: run.shard,
    epoch,
    old_primary: cause.oldPrimary,
    reason: cause.reason,
  });
  await publish(run.deps, "ShardOffline", {
    shard: run.shard,
    epoch,
    old_primary: cause.oldPrimary,
    reason: cause.reason,
  });
  return { outcome: "offline", epoch, reason: cause.reason };
}

/**
 * Before PROMOTE, the change no longer holds: the shard returns to its previous state (the old
 * primary, or offline) under epoch + 1, so nothing sent under the abandoned plan can act.
 */
export async function abandon(run: Run, reason: string): Promise<Outcome> {
  const now = run.deps.clock.now();
  const previous = topologyBefore(run.topology, stateOf(run), now);
  const epoch = run.topology.epoch + 1;
  await write(run, epoch - 1, {
    ...previous,
    epoch,
    status: previous.paused_reason ? "paused" : previous.status,
    // An online shard stores no lineage: the plan's was only the reference its judgement used.
    lineage: previous.status === "offline" ? previous.lineage : undefined,
  });
  await aborted(run.deps, run.shard, epoch, reason);
  return { outcome: "aborted", epoch, reason };
}
