import { z } from "zod";
import { timeNeeded } from "../core/budget.ts";
import { describeIssues } from "../core/config.ts";
import { planRecover, planSwitchover } from "../core/decide.ts";
import { drainedOf, planDrain, planUndrain } from "../core/drain.ts";
import { idSchema, type Topology } from "../core/model.ts";
import { guarded } from "./cycle.ts";
import {
  type ControllerDeps,
  type CycleOutcome,
  type CycleResult,
  type Outcome,
  OutOfTime,
  PhaseTimeout,
  PlanStale,
  type RemainingMs,
  timeoutsOf,
  UNLIMITED,
} from "./deps.ts";
import { type NotLocked, ShardLock } from "./lock.ts";
import { execute, requireTime } from "./phases.ts";
import { REPORT_WAIT_TIMEOUTS, withReports } from "./reports.ts";
import { abandon, type Run, startPlan } from "./transitions.ts";

/**
 * Operator requests: a planned switchover, pause and resume; each under the shard's lock like a
 * failover, and within the invocation's time budget like a failover (core/budget.ts): the lease
 * is cut to the remaining time, and a switchover phase starts only when the remaining time covers
 * its bound plus the margin.
 */

export interface RequestOptions {
  /** Time the invocation has left (Lambda: `context.getRemainingTimeInMillis`). @default unlimited */
  readonly remainingMs?: RemainingMs;
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
 *
 * Within the invocation's time: it starts (bumps the epoch) only when the remaining time covers
 * catch_up and promote, since a switchover stopped before PROMOTE is abandoned, never continued;
 * with less, it is refused and nothing changes. Cut short before PROMOTE all the same, it is
 * abandoned at once (epoch + 1, the old primary stays). Cut short after PROMOTE, it ends
 * `deferred` with its phase recorded and the lock released, and the next controller cycle
 * finishes it at the same epoch.
 */
export async function requestSwitchover(
  deps: ControllerDeps,
  shard: string,
  request: SwitchoverRequest = {},
  options: RequestOptions = {},
): Promise<CycleResult> {
  for (let attempt = 1; ; attempt++) {
    const result = await attemptSwitchover(deps, shard, request, options);
    if (!(result instanceof NotStarted)) return result;
    // Nothing was written (the shard changed between the decision and the lock, or the epoch
    // bump's transaction failed as a whole): decide again, a few times, before telling the
    // operator. An agent updating the old primary's replica set between the read under the lock
    // and the bump is the usual cause, and is over by the next read.
    deps.log.warn("switchover not started: the shard changed since the decision; deciding again", {
      shard,
      attempt,
      reason: result.reason,
    });
    if (attempt >= SWITCHOVER_ATTEMPTS) {
      return { shard, outcome: "lost_race", epoch: result.epoch, reason: `${result.reason}; try again` };
    }
  }
}

/** Failure timeouts a switchover waits for its quiet replicas' reports, time permitting (at least REPORT_WAIT_TIMEOUTS). */
export const SWITCHOVER_REPORT_WAIT_TIMEOUTS = 5;

/** Attempts of a switchover whose epoch bump found the shard changed since the decision. */
export const SWITCHOVER_ATTEMPTS = 3;

/** A switchover that wrote nothing: its epoch bump found the decision stale (PlanStale). */
class NotStarted {
  readonly reason: string;
  readonly epoch: number | undefined;
  constructor(reason: string, epoch: number | undefined) {
    this.reason = reason;
    this.epoch = epoch;
  }
}

async function attemptSwitchover(
  deps: ControllerDeps,
  shard: string,
  request: SwitchoverRequest,
  options: RequestOptions,
): Promise<CycleResult | NotStarted> {
  const remainingMs = options.remainingMs ?? UNLIMITED;
  // Quiet replicas report first: the target is ranked, and caught up, on offsets read now. A quiet
  // replica is alive by its own promise until its keepalive: it is waited for rather than refused
  // as stale (on a loaded host a REPORT took over REPORT_WAIT_TIMEOUTS), while the invocation
  // keeps the time that catch_up and promote need.
  const timeouts = timeoutsOf(deps);
  const first = await deps.store.heartbeats.snapshot(shard);
  const snapshot = await withReports(deps, shard, first, {
    exclude: first.topology?.primary_node_id,
    everyone: true,
    timeoutMs: deps.config.lockLeaseMs,
    waitMs: Math.max(
      REPORT_WAIT_TIMEOUTS * deps.config.failureTimeoutMs,
      Math.min(
        SWITCHOVER_REPORT_WAIT_TIMEOUTS * deps.config.failureTimeoutMs,
        remainingMs() - timeNeeded([timeouts.catch_up, timeouts.promote]),
      ),
    ),
  });
  const plan = planSwitchover(snapshot, deps.config, deps.clock.now(), { to: request.to });
  if (plan.kind === "refused")
    return { shard, outcome: "refused", epoch: snapshot.topology?.epoch, reason: plan.reason };
  const lock = await ShardLock.acquire(deps, shard, { forPrimary: plan.oldPrimary.node_id, remainingMs });
  if (!(lock instanceof ShardLock)) return notLocked(shard, lock);
  const lockedAt = deps.clock.now();
  let notStarted: NotStarted | undefined;
  const outcome = await guarded(lock, async (): Promise<Outcome> => {
    const again = await deps.store.heartbeats.snapshot(shard);
    // Pin the target chosen before locking: under write load the "best" replica by offset changes
    // from one read to the next, and that alone must not abort the switchover.
    const replan = planSwitchover(again, deps.config, deps.clock.now(), {
      to: plan.target.node_id,
      lockOwner: lock.owner,
    });
    if (
      replan.kind === "refused" ||
      replan.target.node_id !== plan.target.node_id ||
      replan.epoch !== plan.epoch
    ) {
      // Nothing written yet: decided again from a new read, like a stale epoch bump (a heartbeat
      // late for a moment on a loaded host made the primary "not alive" for this one read). A
      // shard that really changed is refused by that decision, with its reason.
      notStarted = new NotStarted(`the shard changed while locking: ${replan.reason}`, again.topology?.epoch);
      return { outcome: "lost_race", reason: notStarted.reason };
    }
    const run: Run = {
      deps,
      shard,
      lock,
      timeouts: timeoutsOf(deps),
      remainingMs,
      topology: again.topology as Topology,
    };
    try {
      requireTime(run, "epoch_bumped", ["catch_up", "promote"]);
    } catch (error) {
      if (!(error instanceof OutOfTime)) throw error;
      return {
        outcome: "refused",
        epoch: run.topology.epoch,
        reason: `${error.message}; nothing changed, try again`,
      };
    }
    const started = await startPlan(
      run,
      {
        kind: "switchover",
        old_primary_node_id: replan.oldPrimary.node_id,
        new_primary_node_id: replan.target.node_id,
        new_primary_address: replan.target.node_address,
        reason: request.reason ? `${plan.reason}: ${request.reason}` : plan.reason,
        started_at: lockedAt,
        candidates: [...replan.candidates],
        phase_started: { locked: lockedAt },
        lineage: replan.lineage,
      },
      again,
    ).then(
      () => true,
      (error: unknown) => {
        if (error instanceof PlanStale) {
          notStarted = new NotStarted(error.message, again.topology?.epoch);
          return false;
        }
        throw error;
      },
    );
    if (!started) return { outcome: "lost_race", reason: notStarted?.reason ?? "plan stale" };
    try {
      await execute(run, "catch_up", "catch_up");
      requireTime(run, "promote");
    } catch (error) {
      if (!(error instanceof PhaseTimeout || error instanceof OutOfTime)) throw error;
      // Before PROMOTE: abandon under a new epoch; the old primary's writes resume when its pause times out.
      return abandon(run, `${error.message}; switchover aborted, ${replan.oldPrimary.node_id} stays primary`);
    }
    return (await execute(run, "promote")) as Outcome;
  });
  if (notStarted !== undefined && outcome.outcome === "lost_race") return notStarted;
  return { shard, ...outcome };
}

/** Maintenance mode: no automatic action until resumed. Taken under the lock, so it cannot race a failover. */
export async function pauseShard(
  deps: ControllerDeps,
  shard: string,
  reason = "paused by an operator",
  options: RequestOptions = {},
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
    options,
  );
}

/** Leaves maintenance mode: online with its primary, or offline when it has none. */
export async function resumeShard(
  deps: ControllerDeps,
  shard: string,
  options: RequestOptions = {},
): Promise<CycleResult> {
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
    options,
  );
}

/**
 * An operator's way out of `offline_no_candidate`: the shard is offline and no node continues the
 * lineage it recorded (e.g. every survivor restarted with another replication id after a double
 * fault), so the controller will not pick one by itself. The operator names the node whose data
 * to keep; its current lineage becomes the shard's (under a new epoch) and the controller's next
 * cycle brings the shard online on it (or on a node of that lineage further ahead), as for any
 * offline shard. Nodes of other lineages then resync from it: their data is given up, by the
 * operator's decision, which the reason records. Refused when the old primary may still take
 * writes unfenced and the node is not in its replica set (\`planRecover\`, gate
 * \`recover_unfenced_old_primary\`): the operator's choice gives up data, never the one-writer rule.
 */
export async function recoverShard(
  deps: ControllerDeps,
  shard: string,
  request: { readonly to: string; readonly reason: string },
  options: RequestOptions = {},
): Promise<CycleResult> {
  const snapshot = await deps.store.heartbeats.snapshot(shard);
  const plan = planRecover(snapshot, deps.config, deps.clock.now(), { to: request.to });
  if (plan.kind === "refused")
    return { shard, outcome: "refused", epoch: snapshot.topology?.epoch, reason: plan.reason };
  return underTopologyLock(
    deps,
    shard,
    (topology) => {
      // The plan holds for the topology it read; a change since (another recover, a bring-online) is re-read by the operator.
      if (topology.status !== "offline" || topology.epoch !== plan.epoch) {
        return {
          refused: `the shard changed since it was read (${topology.status} at epoch ${topology.epoch})`,
        };
      }
      return {
        next: { ...topology, epoch: topology.epoch + 1, lineage: plan.lineage },
        result: `${plan.reason}: ${request.reason}; the controller brings the shard online on ${request.to}`,
      };
    },
    "recovered",
    options,
  );
}

/**
 * \`shardguard drain\`: the node is excluded from promotion (recorded in the topology's
 * \`drained\`) until undrained, and keeps replicating. A primary is switched away from first (the
 * zero-loss switchover to the best eligible replica), then drained. Refused, with the reason, for
 * an unknown node, a shard not online or paused, or when no other node could be promoted after it
 * (\`planDrain\`).
 */
export async function drainNode(
  deps: ControllerDeps,
  shard: string,
  node: string,
  options: RequestOptions = {},
): Promise<CycleResult> {
  const snapshot = await deps.store.heartbeats.snapshot(shard);
  const plan = planDrain(snapshot, deps.config, deps.clock.now(), node);
  const epoch = snapshot.topology?.epoch;
  switch (plan.kind) {
    case "refused":
      return { shard, outcome: "refused", epoch, reason: plan.reason };
    case "unchanged":
      return { shard, outcome: "drained", epoch, reason: plan.reason };
    case "switchover_first": {
      const moved = await requestSwitchover(deps, shard, { reason: `drain ${node}` }, options);
      if (moved.outcome !== "completed") {
        return {
          ...moved,
          outcome: "refused",
          reason: `${plan.reason}: ${moved.reason}; ${node} not drained`,
        };
      }
      // Not planned again: the switchover's cleanup deleted the old primary's heartbeat, which its
      // agent writes again only as a replica; planDrain already kept a node to fail over to after it.
      const topology = await deps.store.topology.read(shard);
      const drained = await changeDrained(
        deps,
        shard,
        topology?.epoch,
        [...drainedOf(topology), node].sort(),
        `${node} drained: never promoted until shardguard undrain (it keeps replicating)`,
        "drained",
        options,
      );
      return {
        ...drained,
        primary: moved.primary,
        reason: `switched over to ${moved.primary}; ${drained.reason}`,
      };
    }
    case "drain":
      return changeDrained(deps, shard, epoch, plan.drained, plan.reason, "drained", options);
  }
}

/** \`shardguard undrain\`: the node may be promoted again. */
export async function undrainNode(
  deps: ControllerDeps,
  shard: string,
  node: string,
  options: RequestOptions = {},
): Promise<CycleResult> {
  const topology = await deps.store.topology.read(shard);
  const plan = planUndrain(topology, node);
  if (plan.kind === "refused" || plan.kind === "switchover_first") {
    return { shard, outcome: "refused", epoch: topology?.epoch, reason: plan.reason };
  }
  if (plan.kind === "unchanged")
    return { shard, outcome: "undrained", epoch: topology?.epoch, reason: plan.reason };
  return changeDrained(deps, shard, topology?.epoch, plan.drained, plan.reason, "undrained", options);
}

/** Writes the drained list under the lock, on the topology the plan was made from (its epoch and status). */
function changeDrained(
  deps: ControllerDeps,
  shard: string,
  epoch: number | undefined,
  drained: readonly string[],
  reason: string,
  outcome: "drained" | "undrained",
  options: RequestOptions,
): Promise<CycleResult> {
  return underTopologyLock(
    deps,
    shard,
    (topology) => {
      if (topology.epoch !== epoch) {
        return {
          refused: `the shard changed since it was read (${topology.status} at epoch ${topology.epoch}); try again`,
        };
      }
      if (topology.status === "failing_over") {
        return { refused: `a failover is under way (epoch ${topology.epoch}); try again once it ends` };
      }
      // An undrain goes through on an offline shard: gate priority_zero_ahead_offline holds the shard
      // offline for a drained node that holds more than every eligible one, until an operator
      // undrains it (its reason says so). Refusing it left the shard offline for good (nemesis 7351,
      // guarantee 3). A drain waits: it would take a node from an offline shard's candidates.
      if (topology.status === "offline" && outcome === "drained") {
        return {
          refused: `the shard is offline (epoch ${topology.epoch}): drain a node once it is back online`,
        };
      }
      const { drained: _, ...rest } = topology;
      return { next: drained.length === 0 ? rest : { ...rest, drained: [...drained] }, result: reason };
    },
    outcome,
    options,
  );
}

/** An operator's request that could not take the lock is refused; the operator tries again. */
function notLocked(shard: string, why: NotLocked): CycleResult {
  return { shard, outcome: "refused", reason: `${why.reason}; try again` };
}

async function underTopologyLock(
  deps: ControllerDeps,
  shard: string,
  change: (topology: Topology) => { next?: Topology; result?: string; refused?: string },
  outcome: CycleOutcome,
  options: RequestOptions,
): Promise<CycleResult> {
  const lock = await ShardLock.acquire(deps, shard, { remainingMs: options.remainingMs });
  if (!(lock instanceof ShardLock)) return notLocked(shard, lock);
  const result = await guarded(lock, async (): Promise<Outcome> => {
    const topology = await deps.store.topology.read(shard);
    if (topology === undefined) return { outcome: "refused", reason: "the shard has no topology yet" };
    const { next, result, refused } = change(topology);
    if (refused) return { outcome: "refused", epoch: topology.epoch, reason: refused };
    if (next) {
      await lock.writeTopology(topology.epoch, { ...next, updated_at: deps.clock.now() });
      deps.log.info(`shard ${outcome}`, { shard, epoch: topology.epoch, reason: result });
    }
    return { outcome, epoch: topology.epoch, reason: result ?? outcome };
  });
  // A lost race here means the topology or the lock moved meanwhile: the operator tries again.
  if (result.outcome === "lost_race") {
    return { shard, outcome: "refused", epoch: result.epoch, reason: `${result.reason}; try again` };
  }
  return { shard, ...result };
}

/**
 * Operator requests, as the Lambda receives them (`aws lambda invoke`, the CLI) and as the
 * local controller runs them: `{ action: "switchover" | "pause" | "resume" | "recover" | "drain" |
 * "undrain", shard, to?, node?, reason? }` (`recover` needs both `to` and `reason`; `drain` and
 * `undrain` need `node`).
 */
export const operatorRequestSchema = z.object({
  action: z.enum(["switchover", "pause", "resume", "recover", "drain", "undrain"]),
  shard: idSchema,
  to: idSchema.optional(),
  /** drain and undrain: the node. */
  node: idSchema.optional(),
  reason: z.string().max(500).optional(),
});
export type OperatorRequest = z.output<typeof operatorRequestSchema>;

export interface OperatorResponse {
  readonly ok: boolean;
  readonly action?: OperatorRequest["action"];
  readonly shard?: string;
  readonly outcome?: CycleOutcome;
  readonly epoch?: number;
  readonly primary?: string;
  /** One sentence: what happened and why, or what was wrong with the request. */
  readonly reason: string;
}

const SUCCESS: ReadonlySet<CycleOutcome> = new Set([
  "completed",
  "paused",
  "resumed",
  "recovered",
  "drained",
  "undrained",
]);

/** An event meant as an operator request (it names an action); anything else is a scheduled tick. */
export function isOperatorRequest(event: unknown): boolean {
  return typeof event === "object" && event !== null && "action" in event;
}

/**
 * Runs one operator request. `options.remainingMs` is the invocation's time (Lambda): the
 * request's lease and phases stay within it, as a failover's do.
 */
export async function handleOperatorRequest(
  deps: ControllerDeps,
  event: unknown,
  options: RequestOptions = {},
): Promise<OperatorResponse> {
  const parsed = operatorRequestSchema.safeParse(event);
  if (!parsed.success) return { ok: false, reason: `invalid request: ${describeIssues(parsed.error)}` };
  const request = parsed.data;
  if (request.to !== undefined && request.action !== "switchover" && request.action !== "recover") {
    return {
      ok: false,
      action: request.action,
      shard: request.shard,
      reason: "invalid request: to: only for switchover and recover",
    };
  }
  if (request.action === "recover" && (request.to === undefined || !request.reason)) {
    return {
      ok: false,
      action: request.action,
      shard: request.shard,
      reason: "invalid request: recover needs to (the node whose data to keep) and reason",
    };
  }
  const forNode = request.action === "drain" || request.action === "undrain";
  if (forNode !== (request.node !== undefined)) {
    return {
      ok: false,
      action: request.action,
      shard: request.shard,
      reason: forNode
        ? `invalid request: ${request.action} needs node`
        : "invalid request: node: only for drain and undrain",
    };
  }
  deps.log.info("operator request", { ...request });
  const result =
    request.action === "drain"
      ? await drainNode(deps, request.shard, request.node as string, options)
      : request.action === "undrain"
        ? await undrainNode(deps, request.shard, request.node as string, options)
        : request.action === "switchover"
          ? await requestSwitchover(deps, request.shard, { to: request.to, reason: request.reason }, options)
          : request.action === "pause"
            ? await pauseShard(deps, request.shard, request.reason, options)
            : request.action === "recover"
              ? await recoverShard(
                  deps,
                  request.shard,
                  { to: request.to as string, reason: request.reason as string },
                  options,
                )
              : await resumeShard(deps, request.shard, options);
  const response: OperatorResponse = {
    ok: SUCCESS.has(result.outcome),
    action: request.action,
    shard: result.shard,
    outcome: result.outcome,
    epoch: result.epoch,
    primary: result.primary,
    reason: result.reason,
  };
  deps.log.info("operator request done", { ...response });
  return response;
}
