import { randomUUID } from "node:crypto";
import { setTimeout as delay } from "node:timers/promises";
import type { FailoverConfig } from "../core/config.ts";
import {
  type Decision,
  decide,
  isFresh,
  isPastPointOfNoReturn,
  planSwitchover,
  rankCandidates,
  sameDecision,
} from "../core/decide.ts";
import { errorMessage, ShardguardError } from "../core/errors.ts";
import type {
  Candidate,
  Command,
  CommandType,
  FailoverPhase,
  FailoverState,
  Lineage,
  Topology,
} from "../core/model.ts";
import type { Clock, CommandBus, CoordinationStore, EventPublisher, ShardSnapshot } from "../core/ports.ts";
import type { ControllerLog, ControllerMetrics, EventDetailType } from "./observability.ts";

/**
 * The orchestrator: carries out a decision under the shard's lock as an ordered series of
 * phases, each recorded in the topology with its start time, each with a timeout, each
 * idempotent. A controller that dies mid-way leaves a `failing_over` topology and a lock that
 * expires; the next lock holder resumes from the stored phase.
 *
 *   lock -> re-read & decide again -> epoch CAS (epoch_bumped) -> [catch_up] -> promote
 *        -> confirm (observe the heartbeat) -> repoint -> cleanup -> history, online, release
 *
 * Abort is possible only before PROMOTE is sent; after it the failover is finished, retried
 * or moved to another target under a further epoch, never rolled back.
 */

export interface PhaseTimeouts {
  /** Waiting for a switchover target to reach the old primary's offset. */
  readonly catch_up: number;
  /** Sending PROMOTE. */
  readonly promote: number;
  /** Waiting for the promoted node's heartbeat to show primary at the new epoch. */
  readonly confirm: number;
  /** Sending REPLICAOF to the other nodes. */
  readonly repoint: number;
  /** Deleting the old primary's records, writing history and the final topology. */
  readonly cleanup: number;
}

/** Defaults derived from the heartbeat timing: a live agent confirms within two of its heartbeats. */
export function defaultPhaseTimeouts(config: FailoverConfig): PhaseTimeouts {
  const apiCalls = Math.max(5000, config.failureTimeoutMs);
  return {
    catch_up: 2 * config.failureTimeoutMs + config.heartbeatIntervalMs,
    promote: apiCalls,
    confirm: 2 * config.failureTimeoutMs + config.heartbeatIntervalMs,
    repoint: apiCalls,
    cleanup: apiCalls,
  };
}

export interface ControllerDeps {
  readonly store: CoordinationStore;
  readonly bus: CommandBus;
  readonly events: EventPublisher;
  readonly clock: Clock;
  readonly config: FailoverConfig;
  readonly log: ControllerLog;
  readonly metrics: ControllerMetrics;
  /** @default defaultPhaseTimeouts(config) */
  readonly timeouts?: Partial<PhaseTimeouts>;
  /** @default node:timers/promises setTimeout */
  readonly sleep?: (ms: number) => Promise<void>;
  /** Lock owner tokens. @default "controller-" + random UUID */
  readonly newOwner?: () => string;
  /** Called after each phase's work is done; tests use it to stop a controller at a precise point. */
  readonly onPhase?: (shard: string, phase: FailoverPhase, epoch: number) => void | Promise<void>;
}

export type CycleOutcome =
  | "no_action"
  | "deferred"
  | "initialized"
  | "lost_race"
  | "aborted"
  | "completed"
  | "offline"
  | "stuck"
  | "refused"
  | "paused"
  | "resumed";

export interface CycleResult {
  readonly shard: string;
  readonly outcome: CycleOutcome;
  /** The first decision of the cycle (absent for operator requests). */
  readonly decision?: Decision;
  readonly epoch?: number;
  readonly primary?: string;
  /** One sentence: what the cycle did and why. */
  readonly reason: string;
}

/** The lock was lost or the topology moved under us: someone else now owns the shard. */
export class LockLost extends ShardguardError {
  override name = "LockLost";
}

/** A phase ran past its timeout. */
export class PhaseTimeout extends ShardguardError {
  override name = "PhaseTimeout";
  readonly phase: FailoverPhase;
  constructor(phase: FailoverPhase, message: string) {
    super(message);
    this.phase = phase;
  }
}

/** One orchestration in progress: the lock token and the state last written to the topology. */
interface Run {
  readonly deps: ControllerDeps;
  readonly shard: string;
  readonly owner: string;
  readonly timeouts: PhaseTimeouts;
  topology: Topology;
  lastRenewal: number;
}

const sleepOf = (deps: ControllerDeps) => deps.sleep ?? ((ms: number) => delay(ms));
const timeoutsOf = (deps: ControllerDeps): PhaseTimeouts => ({
  ...defaultPhaseTimeouts(deps.config),
  ...deps.timeouts,
});
const newOwnerOf = (deps: ControllerDeps) => (deps.newOwner ?? (() => `controller-${randomUUID()}`))();

function stateOf(run: Run): FailoverState {
  const state = run.topology.failover;
  if (!state) throw new LockLost(`shard ${run.shard}: topology holds no failover state`);
  return state;
}

/**
 * One controller cycle for one shard: snapshot, decide, and carry out the decision. Safe to
 * run concurrently from any number of controllers.
 */
export async function runShardCycle(
  deps: ControllerDeps,
  shard: string,
  options: { readonly act?: boolean } = {},
): Promise<CycleResult> {
  const snapshot = await deps.store.heartbeats.snapshot(shard);
  const decision = decide(snapshot, deps.config, deps.clock.now());
  const base = { shard, decision };
  if (decision.kind !== "none" && options.act === false) {
    return {
      ...base,
      outcome: "deferred",
      epoch: snapshot.topology?.epoch,
      reason: `${decision.reason} (deferred: too little time left in this invocation; the next one acts)`,
    };
  }
  switch (decision.kind) {
    case "none":
      return { ...base, outcome: "no_action", epoch: snapshot.topology?.epoch, reason: decision.reason };
    case "initialize":
      return { ...base, ...(await initialize(deps, shard, decision)) };
    case "failover":
    case "bring_online":
    case "mark_offline":
    case "resume":
      return { ...base, ...(await underLock(deps, shard, decision)) };
  }
}

async function initialize(
  deps: ControllerDeps,
  shard: string,
  decision: Extract<Decision, { kind: "initialize" }>,
): Promise<Omit<CycleResult, "shard" | "decision">> {
  const now = deps.clock.now();
  const topology: Topology = {
    shard,
    epoch: decision.epoch,
    primary_node_id: decision.primary.node_id,
    primary_address: decision.primary.node_address,
    status: "online",
    updated_at: now,
  };
  // Conditional on absence: of several controllers adopting at once, one writes.
  if (!(await deps.store.topology.compareAndSet(shard, undefined, topology))) {
    return { outcome: "lost_race", reason: "another controller created the topology first" };
  }
  await publish(deps, "ShardOnline", { shard, epoch: decision.epoch, primary: decision.primary.node_id });
  return {
    outcome: "initialized",
    epoch: decision.epoch,
    primary: decision.primary.node_id,
    reason: decision.reason,
  };
}

type ActionDecision = Extract<Decision, { kind: "failover" | "bring_online" | "mark_offline" | "resume" }>;

/** Lock, re-read and decide again, then act; releases the lock on every path it still holds it. */
async function underLock(
  deps: ControllerDeps,
  shard: string,
  decision: ActionDecision,
): Promise<Omit<CycleResult, "shard" | "decision">> {
  const owner = newOwnerOf(deps);
  const forPrimary = decision.kind === "failover" ? decision.oldPrimary : undefined;
  if (!(await deps.store.locks.acquire(shard, owner, deps.config.lockLeaseMs, forPrimary))) {
    return { outcome: "lost_race", reason: "another controller holds the shard's lock" };
  }
  const lockedAt = deps.clock.now();
  let release = true;
  try {
    // The seed's "re-check after the slow step": the world may have changed while we locked.
    const snapshot = await deps.store.heartbeats.snapshot(shard);
    const again = decide(snapshot, deps.config, deps.clock.now(), { lockOwner: owner });
    if (!sameDecision(decision, again)) {
      // Another controller acted in between (the epoch moved): we simply lost the race.
      if (snapshot.topology?.epoch !== decision.epoch || decision.kind === "resume") {
        return {
          outcome: "lost_race",
          epoch: snapshot.topology?.epoch,
          reason: `another controller acted first; now ${again.reason}`,
        };
      }
      const reason = `decision changed after taking the lock: now ${again.kind} (${again.reason})`;
      await aborted(deps, shard, decision.epoch, reason);
      return { outcome: "aborted", epoch: decision.epoch, reason };
    }
    const topology = snapshot.topology as Topology;
    const run: Run = {
      deps,
      shard,
      owner,
      timeouts: timeoutsOf(deps),
      topology,
      lastRenewal: lockedAt,
    };
    switch (again.kind) {
      case "mark_offline":
        return await markOffline(run, again.reason, again.oldPrimary, again.candidates, again.lineage);
      case "failover":
      case "bring_online":
        await bumpEpoch(run, {
          kind: again.kind,
          old_primary_node_id:
            again.kind === "failover" ? again.oldPrimary || undefined : again.lineage.node_id,
          new_primary_node_id: again.target.node_id,
          new_primary_address: again.target.node_address,
          reason: again.reason,
          started_at: lockedAt,
          candidates: [...again.candidates],
          phase_started: { locked: lockedAt },
          lineage: again.lineage,
        });
        return await execute(run, "promote");
      case "resume":
        return await resume(run, snapshot);
      default:
        return { outcome: "no_action", reason: again.reason };
    }
  } catch (error) {
    if (error instanceof LockLost) {
      release = false;
      deps.log.warn("lost the lock during an orchestration; leaving the shard to its new owner", {
        shard,
        error: errorMessage(error),
      });
      return { outcome: "lost_race", reason: errorMessage(error) };
    }
    if (error instanceof PhaseTimeout) {
      deps.log.warn("phase timed out; the shard stays failing_over and the next cycle resumes it", {
        shard,
        phase: error.phase,
        error: errorMessage(error),
      });
      return { outcome: "stuck", reason: errorMessage(error) };
    }
    throw error;
  } finally {
    if (release) await releaseLock(deps, shard, owner);
  }
}

async function releaseLock(deps: ControllerDeps, shard: string, owner: string): Promise<void> {
  try {
    await deps.store.locks.release(shard, owner);
  } catch (error) {
    // The lease expires on its own; the next controller waits at most one lease.
    deps.log.warn("could not release the lock; it expires with its lease", {
      shard,
      error: errorMessage(error),
    });
  }
}

async function publish(deps: ControllerDeps, type: EventDetailType, detail: Record<string, unknown>) {
  try {
    await deps.events.publish(type, detail);
  } catch (error) {
    // Events inform; they must never stop a failover.
    deps.log.error("could not publish event", {
      event: type,
      shard: detail.shard,
      error: errorMessage(error),
    });
  }
}

async function aborted(deps: ControllerDeps, shard: string, epoch: number, reason: string) {
  deps.metrics.count("failoverAborted");
  deps.log.warn("failover aborted", { shard, epoch, reason });
  await publish(deps, "FailoverAborted", { shard, epoch, reason });
}

/** Extends the lease if a third of it has passed; throws LockLost when it is no longer ours. */
async function holdLock(run: Run, force = false): Promise<void> {
  const now = run.deps.clock.now();
  if (!force && now - run.lastRenewal < run.deps.config.lockLeaseMs / 3) return;
  if (!(await run.deps.store.locks.renew(run.shard, run.owner, run.deps.config.lockLeaseMs))) {
    throw new LockLost(`shard ${run.shard}: the lock is no longer held by ${run.owner}`);
  }
  run.lastRenewal = now;
}

/** Writes `next` at the run's epoch (or bumps it); the topology moving under us means we lost. */
async function writeTopology(run: Run, expectedEpoch: number, next: Topology): Promise<void> {
  await holdLock(run, true);
  if (!(await run.deps.store.topology.compareAndSet(run.shard, expectedEpoch, next))) {
    throw new LockLost(`shard ${run.shard}: the topology changed from epoch ${expectedEpoch} under us`);
  }
  run.topology = next;
}

async function recordPhase(run: Run, phase: FailoverPhase): Promise<void> {
  const now = run.deps.clock.now();
  const state = stateOf(run);
  const next: Topology = {
    ...run.topology,
    phase,
    updated_at: now,
    failover: { ...state, phase_started: { ...state.phase_started, [phase]: now } },
  };
  await writeTopology(run, run.topology.epoch, next);
}

/** epoch_bumped: the fencing token moves first; status failing_over with the plan to resume from. */
async function bumpEpoch(run: Run, state: FailoverState): Promise<void> {
  const now = run.deps.clock.now();
  const epoch = run.topology.epoch + 1;
  const next: Topology = {
    ...run.topology,
    epoch,
    status: "failing_over",
    phase: "epoch_bumped",
    updated_at: now,
    failover: { ...state, phase_started: { ...state.phase_started, epoch_bumped: now } },
  };
  await writeTopology(run, epoch - 1, next);
  run.deps.metrics.count("failoverStarted");
  run.deps.log.info("failover started", {
    shard: run.shard,
    epoch,
    kind: state.kind,
    old_primary: state.old_primary_node_id,
    new_primary: state.new_primary_node_id,
    reason: state.reason,
  });
  await publish(run.deps, "FailoverStarted", {
    shard: run.shard,
    epoch,
    kind: state.kind,
    old_primary: state.old_primary_node_id,
    new_primary: state.new_primary_node_id,
    reason: state.reason,
  });
  await run.deps.onPhase?.(run.shard, "epoch_bumped", epoch);
}

/** Runs an API-call phase under its timeout. */
async function withTimeout<T>(
  run: Run,
  phase: FailoverPhase,
  ms: number,
  work: () => Promise<T>,
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new PhaseTimeout(phase, `shard ${run.shard}: phase ${phase} took longer than ${ms} ms`)),
      ms,
    );
  });
  try {
    return await Promise.race([work(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function command(run: Run, type: CommandType, extra: Partial<Command> = {}): Command {
  const state = stateOf(run);
  const epoch = run.topology.epoch;
  return {
    type,
    shard: run.shard,
    epoch,
    // Deterministic: a resumed phase re-sends the same id, which the agent runs at most once.
    command_id: `${run.shard}:${epoch}:${type}:${extra.primary?.node_id ?? state.new_primary_node_id}`,
    issued_at: run.deps.clock.now(),
    ...extra,
  };
}

const ORDER = [
  "catch_up",
  "promote",
  "confirm",
  "repoint",
  "cleanup",
] as const satisfies readonly FailoverPhase[];
type ExecutedPhase = (typeof ORDER)[number];

const PHASES: Record<ExecutedPhase, (run: Run) => Promise<void>> = {
  catch_up: phaseCatchUp,
  promote: phasePromote,
  confirm: phaseConfirm,
  repoint: phaseRepoint,
  cleanup: phaseCleanup,
};

/** Runs the phases from `from` to the end and completes the change. */
async function execute(run: Run, from: ExecutedPhase): Promise<Omit<CycleResult, "shard" | "decision">> {
  const start = ORDER.indexOf(from);
  for (const phase of ORDER.slice(start)) {
    if (phase === "catch_up" && stateOf(run).kind !== "switchover") continue;
    await recordPhase(run, phase);
    await PHASES[phase](run);
    await run.deps.onPhase?.(run.shard, phase, run.topology.epoch);
  }
  return complete(run);
}

/** Switchover only: writes paused on the old primary, wait until the target has everything. */
async function phaseCatchUp(run: Run): Promise<void> {
  const state = stateOf(run);
  const old = state.old_primary_node_id as string;
  const pauseMs = run.timeouts.catch_up + run.timeouts.promote + run.timeouts.confirm;
  await run.deps.bus.send(
    run.shard,
    old,
    command(run, "PAUSE_WRITES", {
      timeout_ms: pauseMs,
      command_id: `${run.shard}:${run.topology.epoch}:PAUSE_WRITES:${old}`,
    }),
  );
  await waitFor(run, "catch_up", run.timeouts.catch_up, (snapshot) => {
    const primary = snapshot.nodes.find((node) => node.node_id === old);
    const target = snapshot.nodes.find((node) => node.node_id === state.new_primary_node_id);
    // The old primary's offset is final only once its agent applied the pause (its epoch moved).
    return (
      primary !== undefined &&
      target !== undefined &&
      primary.epoch >= run.topology.epoch &&
      target.last_txn_id >= primary.last_txn_id
    );
  });
}

/** The point of no return: from here on the failover is finished, never rolled back. */
async function phasePromote(run: Run): Promise<void> {
  const state = stateOf(run);
  await withTimeout(run, "promote", run.timeouts.promote, () =>
    run.deps.bus.send(run.shard, state.new_primary_node_id, command(run, "PROMOTE")),
  );
}

/** Observe, don't trust a reply: the target's own heartbeat must say primary at the new epoch. */
async function phaseConfirm(run: Run): Promise<void> {
  await waitFor(run, "confirm", run.timeouts.confirm, (snapshot) => confirmed(run, snapshot));
}

function confirmed(run: Run, snapshot: ShardSnapshot): boolean {
  const target = snapshot.nodes.find((node) => node.node_id === stateOf(run).new_primary_node_id);
  return (
    target !== undefined &&
    target.role === "primary" &&
    target.epoch >= run.topology.epoch &&
    isFresh(target, run.deps.config, run.deps.clock.now())
  );
}

/** REPLICAOF to every other node, the old primary included: a returning old primary finds it in its queue. */
async function phaseRepoint(run: Run): Promise<void> {
  const state = stateOf(run);
  const snapshot = await run.deps.store.heartbeats.snapshot(run.shard);
  const others = new Set(snapshot.nodes.map((node) => node.node_id));
  if (state.old_primary_node_id) others.add(state.old_primary_node_id);
  others.delete(state.new_primary_node_id);
  const primary = { node_id: state.new_primary_node_id, address: state.new_primary_address };
  await withTimeout(run, "repoint", run.timeouts.repoint, () =>
    Promise.all(
      [...others].map((node) =>
        run.deps.bus.send(run.shard, node, {
          ...command(run, "REPLICAOF", { primary }),
          command_id: `${run.shard}:${run.topology.epoch}:REPLICAOF:${node}`,
        }),
      ),
    ),
  );
}

/** The old primary's heartbeat and replica set go; it re-creates them when it returns. */
async function phaseCleanup(run: Run): Promise<void> {
  const state = stateOf(run);
  const old = state.old_primary_node_id;
  if (old === undefined || old === state.new_primary_node_id) return;
  await withTimeout(run, "cleanup", run.timeouts.cleanup, () =>
    run.deps.store.heartbeats.deleteNode(run.shard, old),
  );
}

/** Polls the shard's snapshot until `done`, renewing the lease; throws PhaseTimeout past `ms`. */
async function waitFor(
  run: Run,
  phase: FailoverPhase,
  ms: number,
  done: (snapshot: ShardSnapshot) => boolean,
): Promise<void> {
  const deadline = run.deps.clock.now() + ms;
  const pollMs = Math.max(50, Math.min(250, Math.floor(run.deps.config.heartbeatIntervalMs / 4)));
  for (;;) {
    const snapshot = await run.deps.store.heartbeats.snapshot(run.shard);
    if (done(snapshot)) return;
    if (run.deps.clock.now() >= deadline) {
      throw new PhaseTimeout(phase, `shard ${run.shard}: phase ${phase} not done after ${ms} ms`);
    }
    await holdLock(run);
    await sleepOf(run.deps)(pollMs);
  }
}

function phaseTimings(state: FailoverState, end: number): Record<string, number> {
  const entries = Object.entries(state.phase_started).sort((a, b) => a[1] - b[1]);
  const timings: Record<string, number> = {};
  entries.forEach(([phase, start], index) => {
    timings[phase] = (entries[index + 1]?.[1] ?? end) - start;
  });
  return timings;
}

/** History, topology online (or back to paused), events. The caller releases the lock. */
async function complete(run: Run): Promise<Omit<CycleResult, "shard" | "decision">> {
  const state = stateOf(run);
  const now = run.deps.clock.now();
  const epoch = run.topology.epoch;
  await run.deps.store.history.append({
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
  await writeTopology(run, epoch, {
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
  const detail = {
    shard: run.shard,
    epoch,
    kind: state.kind,
    old_primary: state.old_primary_node_id,
    new_primary: state.new_primary_node_id,
    duration_ms: now - state.started_at,
    reason: state.reason,
  };
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

/** No eligible node: the shard goes offline under a new epoch (which also fences a late promotion). */
async function markOffline(
  run: Run,
  reason: string,
  oldPrimary: string | undefined,
  candidates: readonly Candidate[],
  lineage: Lineage | undefined,
): Promise<Omit<CycleResult, "shard" | "decision">> {
  const now = run.deps.clock.now();
  const epoch = run.topology.epoch + 1;
  await writeTopology(run, epoch - 1, {
    shard: run.shard,
    epoch,
    status: "offline",
    updated_at: now,
    lineage,
    cooldown_until: run.topology.cooldown_until,
  });
  await run.deps.store.history.append({
    shard: run.shard,
    epoch,
    kind: "offline",
    at: now,
    old_primary_node_id: oldPrimary,
    reason,
    candidates: [...candidates],
    phase_timings: {},
  });
  run.deps.log.warn("shard offline", { shard: run.shard, epoch, old_primary: oldPrimary, reason });
  await publish(run.deps, "ShardOffline", { shard: run.shard, epoch, old_primary: oldPrimary, reason });
  return { outcome: "offline", epoch, reason };
}

/**
 * Resumes a failover some controller left in `failing_over`. Before PROMOTE the plan is judged
 * again (it may be abandoned or moved to another target); after it the plan is finished: the
 * target is sent PROMOTE again (same command id) while it lives, and replaced under a further
 * epoch when it has died.
 */
async function resume(run: Run, snapshot: ShardSnapshot): Promise<Omit<CycleResult, "shard" | "decision">> {
  const state = stateOf(run);
  const phase = run.topology.phase;
  run.deps.log.info("resuming failover", {
    shard: run.shard,
    epoch: run.topology.epoch,
    phase,
    target: state.new_primary_node_id,
  });
  if (!isPastPointOfNoReturn(phase)) return reconsider(run, snapshot);
  if (phase === "repoint" || phase === "cleanup") return execute(run, phase);
  if (confirmed(run, snapshot)) return execute(run, "repoint");
  const target = snapshot.nodes.find((node) => node.node_id === state.new_primary_node_id);
  const now = run.deps.clock.now();
  const alive = target !== undefined && isFresh(target, run.deps.config, now) && target.db_status === "up";
  // A live target gets PROMOTE again (same id) for a while; one that still has not confirmed
  // after MAX_CONFIRM_ROUNDS confirm timeouts is treated as failed, like a dead one.
  const attemptStarted = state.phase_started.epoch_bumped ?? state.started_at;
  const overdue = now - attemptStarted > MAX_CONFIRM_ROUNDS * run.timeouts.confirm;
  if (alive && !overdue) return execute(run, "promote");
  return retarget(
    run,
    snapshot,
    alive ? "did not confirm in time" : target ? "is no longer alive" : "has no heartbeat",
  );
}

/** Confirm timeouts a live target gets before another node is promoted instead. */
const MAX_CONFIRM_ROUNDS = 3;

/** Before PROMOTE: judge the plan again as if the shard were still in its previous state. */
async function reconsider(
  run: Run,
  snapshot: ShardSnapshot,
): Promise<Omit<CycleResult, "shard" | "decision">> {
  const state = stateOf(run);
  const epoch = run.topology.epoch;
  const previous: Topology = {
    shard: run.shard,
    epoch,
    status: state.kind === "bring_online" ? "offline" : "online",
    primary_node_id: state.kind === "bring_online" ? undefined : state.old_primary_node_id,
    primary_address: state.kind === "bring_online" ? undefined : run.topology.primary_address,
    updated_at: run.deps.clock.now(),
    lineage: state.kind === "bring_online" ? state.lineage : undefined,
    paused_reason: run.topology.paused_reason,
  };
  const decision =
    state.kind === "switchover"
      ? undefined
      : decide({ ...snapshot, topology: previous, lock: undefined }, run.deps.config, run.deps.clock.now());
  if (decision?.kind === "failover" || decision?.kind === "bring_online") {
    run.topology = {
      ...run.topology,
      failover: {
        ...state,
        new_primary_node_id: decision.target.node_id,
        new_primary_address: decision.target.node_address,
        candidates: [...decision.candidates],
        reason: decision.reason,
      },
    };
    return execute(run, "promote");
  }
  if (decision?.kind === "mark_offline") {
    return markOfflineAt(run, epoch, decision);
  }
  // Nothing to do any more (the primary came back, quorum lost) or an interrupted switchover:
  // PROMOTE was never sent, so the previous primary stays, at the already-bumped epoch.
  const reason = `resumed before PROMOTE and abandoned: ${decision?.reason ?? "an interrupted switchover is not resumed"}`;
  await writeTopology(run, epoch, {
    ...previous,
    status: previous.paused_reason ? "paused" : previous.status,
  });
  await aborted(run.deps, run.shard, epoch, reason);
  return { outcome: "aborted", epoch, reason };
}

/** mark_offline at an epoch that is already bumped (the shard is failing_over at `epoch`). */
async function markOfflineAt(
  run: Run,
  epoch: number,
  decision: Extract<Decision, { kind: "mark_offline" }>,
): Promise<Omit<CycleResult, "shard" | "decision">> {
  const now = run.deps.clock.now();
  await writeTopology(run, epoch, {
    shard: run.shard,
    epoch,
    status: "offline",
    updated_at: now,
    lineage: decision.lineage,
  });
  await run.deps.store.history.append({
    shard: run.shard,
    epoch,
    kind: "offline",
    at: now,
    old_primary_node_id: decision.oldPrimary,
    reason: decision.reason,
    candidates: [...decision.candidates],
    phase_timings: {},
  });
  await publish(run.deps, "ShardOffline", { shard: run.shard, epoch, reason: decision.reason });
  return { outcome: "offline", epoch, reason: decision.reason };
}

/**
 * The promoted node died (or never confirmed). PROMOTE may still be applied by it later, so the
 * replacement happens under a further epoch: the dead target, if it ever applies the old
 * PROMOTE, is behind the topology's epoch and is repointed by the REPLICAOF it finds queued.
 */
async function retarget(
  run: Run,
  snapshot: ShardSnapshot,
  problem: string,
): Promise<Omit<CycleResult, "shard" | "decision">> {
  const state = stateOf(run);
  const now = run.deps.clock.now();
  const candidates = rankCandidates(
    snapshot.nodes,
    state.lineage,
    run.deps.config,
    now,
    state.old_primary_node_id,
  ).filter((candidate) => candidate.node_id !== state.new_primary_node_id);
  const best = candidates[0];
  const why = `target ${state.new_primary_node_id} ${problem} after PROMOTE`;
  if (best === undefined || !best.eligible) {
    const reason = `${why} and no other node is eligible (${candidates.map((c) => `${c.node_id}: ${c.reason}`).join("; ") || "none"})`;
    return markOffline(run, reason, state.old_primary_node_id, candidates, state.lineage);
  }
  run.deps.log.warn("retargeting failover", {
    shard: run.shard,
    epoch: run.topology.epoch,
    from: state.new_primary_node_id,
    to: best.node_id,
  });
  await bumpEpoch(run, {
    ...state,
    new_primary_node_id: best.node_id,
    new_primary_address: best.node_address,
    candidates,
    reason: `${why}; promoting ${best.node_id} instead (${state.reason})`,
  });
  return execute(run, "promote");
}

/** Options of an operator's switchover. */
export interface SwitchoverRequest {
  /** Target node; the best eligible replica when absent. */
  readonly to?: string;
  readonly reason?: string;
}

/**
 * A planned switchover: writes paused on the old primary, the target waited for until it has
 * the old primary's offset, then the failover phases. Refused (with the reason) when not safe.
 */
export async function requestSwitchover(
  deps: ControllerDeps,
  shard: string,
  request: SwitchoverRequest = {},
): Promise<CycleResult> {
  const snapshot = await deps.store.heartbeats.snapshot(shard);
  const plan = planSwitchover(snapshot, deps.config, deps.clock.now(), { to: request.to });
  if (plan.kind === "refused")
    return { shard, outcome: "refused", epoch: snapshot.topology?.epoch, reason: plan.reason };
  const owner = newOwnerOf(deps);
  if (!(await deps.store.locks.acquire(shard, owner, deps.config.lockLeaseMs, plan.oldPrimary.node_id))) {
    return { shard, outcome: "refused", reason: "another controller holds the shard's lock; try again" };
  }
  const lockedAt = deps.clock.now();
  let release = true;
  try {
    const again = await deps.store.heartbeats.snapshot(shard);
    // Pin the target chosen before locking: under write load the "best" replica by offset changes
    // from one read to the next, and that alone must not abort the switchover.
    const replan = planSwitchover(again, deps.config, deps.clock.now(), {
      to: plan.target.node_id,
      lockOwner: owner,
    });
    if (
      replan.kind === "refused" ||
      replan.target.node_id !== plan.target.node_id ||
      replan.epoch !== plan.epoch
    ) {
      return { shard, outcome: "aborted", reason: `the shard changed while locking: ${replan.reason}` };
    }
    const run: Run = {
      deps,
      shard,
      owner,
      timeouts: timeoutsOf(deps),
      topology: again.topology as Topology,
      lastRenewal: lockedAt,
    };
    const reason = request.reason ? `${plan.reason}: ${request.reason}` : plan.reason;
    await bumpEpoch(run, {
      kind: "switchover",
      old_primary_node_id: replan.oldPrimary.node_id,
      new_primary_node_id: replan.target.node_id,
      new_primary_address: replan.target.node_address,
      reason,
      started_at: lockedAt,
      candidates: [...replan.candidates],
      phase_started: { locked: lockedAt },
      lineage: replan.lineage,
    });
    try {
      await recordPhase(run, "catch_up");
      await phaseCatchUp(run);
    } catch (error) {
      if (!(error instanceof PhaseTimeout)) throw error;
      // Before PROMOTE: abort; the old primary's writes resume when its pause times out.
      const abortReason = `${error.message}; switchover aborted, ${replan.oldPrimary.node_id} stays primary`;
      const { failover: _, phase: __, ...rest } = run.topology;
      await writeTopology(run, run.topology.epoch, {
        ...rest,
        status: rest.paused_reason ? "paused" : "online",
        updated_at: deps.clock.now(),
      });
      await aborted(deps, shard, run.topology.epoch, abortReason);
      return { shard, outcome: "aborted", epoch: run.topology.epoch, reason: abortReason };
    }
    return { shard, ...(await execute(run, "promote")) };
  } catch (error) {
    if (error instanceof LockLost) {
      release = false;
      return { shard, outcome: "lost_race", reason: errorMessage(error) };
    }
    if (error instanceof PhaseTimeout) return { shard, outcome: "stuck", reason: errorMessage(error) };
    throw error;
  } finally {
    if (release) await releaseLock(deps, shard, owner);
  }
}

/** Maintenance mode: no automatic action until resumed. Taken under the lock, so it cannot race a failover. */
export async function pauseShard(
  deps: ControllerDeps,
  shard: string,
  reason = "paused by an operator",
): Promise<CycleResult> {
  return underTopologyLock(
    deps,
    shard,
    (topology) => {
      if (topology.status === "paused") return { result: "already paused" };
      if (topology.status === "failing_over")
        return { refused: "a failover is in progress; pause after it completes" };
      return { next: { ...topology, status: "paused", paused_reason: reason }, result: `paused: ${reason}` };
    },
    "paused",
  );
}

/** Leaves maintenance mode: online with its primary, or offline when it has none. */
export async function resumeShard(deps: ControllerDeps, shard: string): Promise<CycleResult> {
  return underTopologyLock(
    deps,
    shard,
    (topology) => {
      if (topology.status !== "paused") return { result: `not paused (${topology.status})` };
      const { paused_reason: _, ...rest } = topology;
      const status = topology.primary_node_id ? "online" : "offline";
      return { next: { ...rest, status }, result: `resumed, shard ${status}` };
    },
    "resumed",
  );
}

async function underTopologyLock(
  deps: ControllerDeps,
  shard: string,
  change: (topology: Topology) => { next?: Topology; result?: string; refused?: string },
  outcome: CycleOutcome,
): Promise<CycleResult> {
  const owner = newOwnerOf(deps);
  if (!(await deps.store.locks.acquire(shard, owner, deps.config.lockLeaseMs))) {
    return { shard, outcome: "refused", reason: "another controller holds the shard's lock; try again" };
  }
  try {
    const topology = await deps.store.topology.read(shard);
    if (topology === undefined) return { shard, outcome: "refused", reason: "the shard has no topology yet" };
    const { next, result, refused } = change(topology);
    if (refused) return { shard, outcome: "refused", epoch: topology.epoch, reason: refused };
    if (next) {
      const written = { ...next, updated_at: deps.clock.now() };
      if (!(await deps.store.topology.compareAndSet(shard, topology.epoch, written))) {
        return {
          shard,
          outcome: "refused",
          epoch: topology.epoch,
          reason: "the topology changed meanwhile; try again",
        };
      }
      deps.log.info(`shard ${outcome}`, { shard, epoch: topology.epoch, reason: result });
    }
    return { shard, outcome, epoch: topology.epoch, reason: result ?? outcome };
  } finally {
    await releaseLock(deps, shard, owner);
  }
}
