import { tryParseAddress } from "../core/address.ts";
import { decideContinuation, FailoverStateMissing } from "../core/continuation.ts";
import { type Decision, decide, sameDecision } from "../core/decide.ts";
import { errorMessage } from "../core/errors.ts";
import type { Topology } from "../core/model.ts";
import { LockLost, type ShardSnapshot } from "../core/ports.ts";
import {
  aborted,
  type ControllerDeps,
  type CycleResult,
  type Outcome,
  OutOfTime,
  PhaseTimeout,
  PlanStale,
  publish,
  type RemainingMs,
  timeoutsOf,
  UNLIMITED,
} from "./deps.ts";
import { ShardLock } from "./lock.ts";
import { execute, requireTime } from "./phases.ts";
import { reportWindowMs, requestReports } from "./reports.ts";
import { abandon, goOffline, type Run, startPlan } from "./transitions.ts";

/**
 * One controller cycle over one shard: snapshot, decide, and carry the decision out under the
 * shard's lock. Safe to run concurrently from any number of controllers, and safe against a
 * controller paused for any length of time: every write is fenced by the lock (lock.ts), every
 * change of plan moves the epoch (transitions.ts), agents check a command against the topology.
 */

export interface CycleOptions {
  /** False: decide and log only (too little time left to act). @default true */
  readonly act?: boolean;
  /** Time the invocation has left; phases start, and the lease runs, only within it. @default unlimited */
  readonly remainingMs?: RemainingMs;
}

export async function runShardCycle(
  deps: ControllerDeps,
  shard: string,
  options: CycleOptions = {},
): Promise<CycleResult> {
  const snapshot = await deps.store.heartbeats.snapshot(shard);
  // A lock this controller may hold without knowing it (an acquire whose answer was lost, a release
  // that failed) does not stop it: its next acquire takes it again (lock.ts).
  const own = ShardLock.unsettledOwner(deps, shard);
  const decision = decide(
    snapshot,
    deps.config,
    deps.clock.now(),
    own === undefined ? {} : { lockOwner: own },
  );
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
      if (decision.awaiting !== undefined && decision.awaiting.length > 0 && options.act !== false) {
        await requestReports(
          deps,
          shard,
          snapshot.topology?.epoch ?? 0,
          decision.awaiting,
          reportWindowMs(deps),
        );
      }
      await syncPrimaryRecord(deps, snapshot, options);
      return { ...base, outcome: "no_action", epoch: snapshot.topology?.epoch, reason: decision.reason };
    case "initialize":
      return { ...base, ...(await initialize(deps, shard, decision)) };
    case "failover":
    case "bring_online":
    case "mark_offline":
    case "continue_failover":
      return { ...base, ...(await underLock(deps, shard, decision, options)) };
  }
}

/**
 * The primary's DNS record, after the confirm phase: a shard whose topology names a primary online
 * has its record brought to that epoch (once per epoch per process; fenced by epoch in Route 53).
 */
async function syncPrimaryRecord(deps: ControllerDeps, snapshot: ShardSnapshot, options: CycleOptions) {
  const topology = snapshot.topology;
  if (!deps.primaryRecords?.has(snapshot.shard) || options.act === false) return;
  if (topology?.status !== "online" || topology.primary_address === undefined) return;
  const address = tryParseAddress(topology.primary_address);
  if (address) await deps.primaryRecords.sync(snapshot.shard, topology.epoch, address.host);
}

async function initialize(
  deps: ControllerDeps,
  shard: string,
  decision: Extract<Decision, { kind: "initialize" }>,
): Promise<Outcome> {
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

type ActionDecision = Extract<
  Decision,
  { kind: "failover" | "bring_online" | "mark_offline" | "continue_failover" }
>;

/** Lock, re-read and decide again, then act; ends every path with the lock released or lost. */
async function underLock(
  deps: ControllerDeps,
  shard: string,
  decision: ActionDecision,
  options: CycleOptions,
): Promise<Outcome> {
  const remainingMs = options.remainingMs ?? UNLIMITED;
  const forPrimary = decision.kind === "failover" ? decision.oldPrimary : undefined;
  const lock = await ShardLock.acquire(deps, shard, { forPrimary, remainingMs });
  if (!(lock instanceof ShardLock)) return lock;
  const lockedAt = deps.clock.now();
  return guarded(lock, async () => {
    // The seed's "re-check after the slow step": the world may have changed while we locked.
    const snapshot = await deps.store.heartbeats.snapshot(shard);
    const again = decide(snapshot, deps.config, deps.clock.now(), { lockOwner: lock.owner });
    if (!sameDecision(decision, again)) {
      // Another controller acted in between (the epoch moved): we simply lost the race.
      if (snapshot.topology?.epoch !== decision.epoch || decision.kind === "continue_failover") {
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
    const run: Run = {
      deps,
      shard,
      lock,
      timeouts: timeoutsOf(deps),
      remainingMs,
      topology: snapshot.topology as Topology,
    };
    switch (again.kind) {
      case "mark_offline":
        return goOffline(run, again);
      case "failover":
      case "bring_online":
        requireTime(run, "epoch_bumped");
        await startPlan(
          run,
          {
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
            ...(again.kind === "bring_online" && again.depose !== undefined
              ? { depose: { node_id: again.depose.node_id, address: again.depose.node_address } }
              : {}),
          },
          snapshot,
        );
        return (await execute(run, "promote")) as Outcome;
      case "continue_failover":
        return continueChange(run, snapshot);
      default:
        return { outcome: "no_action", reason: again.reason };
    }
  });
}

/**
 * Continues a change some controller left in `failing_over` (decision `continue_failover`), as
 * `decideContinuation` says: the same plan from a phase, a new plan (another target, offline,
 * abandoned) under epoch + 1, or, when a gate holds the new target, the plan as it is.
 */
async function continueChange(run: Run, snapshot: ShardSnapshot): Promise<Outcome> {
  const next = decideContinuation(snapshot, run.deps.config, run.deps.clock.now(), {
    confirmTimeoutMs: run.timeouts.confirm,
  });
  run.deps.log.info("continuing failover", {
    shard: run.shard,
    epoch: run.topology.epoch,
    phase: run.topology.phase,
    target: run.topology.failover?.new_primary_node_id,
    continuation: next.kind,
    reason: next.reason,
  });
  switch (next.kind) {
    case "continue":
      return (await execute(run, next.from)) as Outcome;
    case "replan":
      run.deps.log.warn("retargeting failover", {
        shard: run.shard,
        epoch: run.topology.epoch,
        from: run.topology.failover?.new_primary_node_id,
        to: next.failover.new_primary_node_id,
      });
      requireTime(run, "epoch_bumped");
      await startPlan(run, next.failover, snapshot);
      return (await execute(run, "promote")) as Outcome;
    case "offline":
      return goOffline(run, next);
    case "abandon":
      return abandon(run, next.reason);
    case "wait":
      // The plan stays at its epoch; the next cycle judges again once the nodes it waits for report.
      if (next.awaiting !== undefined && next.awaiting.length > 0) {
        await requestReports(
          run.deps,
          run.shard,
          run.topology.epoch,
          next.awaiting,
          reportWindowMs(run.deps),
        );
      }
      return { outcome: "no_action", epoch: run.topology.epoch, reason: next.reason };
  }
}

/**
 * Runs `work` under the lock and turns the orchestration's typed stops into outcomes. The lock
 * is released on every path except LockLost (it is someone else's now).
 */
export async function guarded(lock: ShardLock, work: () => Promise<Outcome>): Promise<Outcome> {
  const { deps, shard } = lock;
  let release = true;
  try {
    return await work();
  } catch (error) {
    if (error instanceof LockLost) {
      release = false;
      deps.log.warn(
        "lost the lock during an orchestration; stopping and leaving the shard to its new owner",
        {
          shard,
          error: errorMessage(error),
        },
      );
      return { outcome: "lost_race", reason: errorMessage(error) };
    }
    if (error instanceof PlanStale) {
      deps.log.warn("plan stale; deciding again next cycle", { shard, error: errorMessage(error) });
      return { outcome: "lost_race", reason: errorMessage(error) };
    }
    if (error instanceof PhaseTimeout) {
      deps.log.warn("phase timed out; the shard stays failing_over and the next cycle continues it", {
        shard,
        phase: error.phase,
        error: errorMessage(error),
      });
      return { outcome: "stuck", reason: errorMessage(error) };
    }
    if (error instanceof OutOfTime) {
      deps.log.warn("out of time for the next phase; the next invocation continues", {
        shard,
        phase: error.phase,
        error: errorMessage(error),
      });
      return { outcome: "deferred", reason: `${errorMessage(error)}; the next invocation continues` };
    }
    if (error instanceof FailoverStateMissing) {
      deps.log.error("failing_over without a failover state; an operator must look", {
        shard,
        error: errorMessage(error),
      });
    }
    throw error;
  } finally {
    if (release) await lock.release();
  }
}
