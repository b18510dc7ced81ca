import { randomUUID } from "node:crypto";
import { setTimeout as delay } from "node:timers/promises";
import type { FailoverConfig } from "../core/config.ts";
import type { Decision } from "../core/decide.ts";
import { errorMessage, ShardguardError } from "../core/errors.ts";
import type { FailoverPhase } from "../core/model.ts";
import type { EventPublisher, EventType, Logger, Metrics } from "../core/observability.ts";
import type { Clock, CommandBus, CoordinationStore } from "../core/ports.ts";
import type { PrimaryRecordPublisher } from "../core/primary-record.ts";

/** What the orchestrator's parts share: ports, config, timeouts, outcomes. */

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

/**
 * Failure timeouts (plus a heartbeat interval) the phases that wait on an agent's report give it
 * (catch_up, confirm): a live agent reports within a failure timeout; the second covers a slow one.
 */
export const PHASE_WAIT_TIMEOUTS = 2;

/** Defaults derived from the heartbeat timing: a live agent confirms within two of its heartbeats. */
export function defaultPhaseTimeouts(config: FailoverConfig): PhaseTimeouts {
  const apiCalls = Math.max(5000, config.failureTimeoutMs);
  return {
    catch_up: PHASE_WAIT_TIMEOUTS * config.failureTimeoutMs + config.heartbeatIntervalMs,
    promote: apiCalls,
    confirm: PHASE_WAIT_TIMEOUTS * config.failureTimeoutMs + config.heartbeatIntervalMs,
    repoint: apiCalls,
    cleanup: apiCalls,
  };
}

/** Time the invocation has left, in ms (Lambda: `context.getRemainingTimeInMillis`). */
export type RemainingMs = () => number;

/** A local process: no invocation timeout. */
export const UNLIMITED: RemainingMs = () => Number.POSITIVE_INFINITY;

export interface ControllerDeps {
  readonly store: CoordinationStore;
  readonly bus: CommandBus;
  readonly events: EventPublisher;
  readonly clock: Clock;
  readonly config: FailoverConfig;
  readonly log: Logger;
  readonly metrics: Metrics;
  /** @default defaultPhaseTimeouts(config) */
  readonly timeouts?: Partial<PhaseTimeouts>;
  /** @default node:timers/promises setTimeout */
  readonly sleep?: (ms: number) => Promise<void>;
  /** Lock owner tokens. @default "controller-" + random UUID */
  readonly newOwner?: () => string;
  /** The shards' DNS records that follow the primary (docs/clients.md#dns). @default none */
  readonly primaryRecords?: PrimaryRecordPublisher;
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
  | "resumed"
  | "recovered"
  | "drained"
  | "undrained";

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

/** A cycle's result before the shard and first decision are added. */
export type Outcome = Omit<CycleResult, "shard" | "decision">;

/** An error about one failover phase; `phase` names it. */
abstract class PhaseError extends ShardguardError {
  readonly phase: FailoverPhase;
  constructor(phase: FailoverPhase, message: string) {
    super(message);
    this.phase = phase;
  }
}

/** A phase ran past its timeout. */
export class PhaseTimeout extends PhaseError {
  override name = "PhaseTimeout";
}

/**
 * The invocation has too little time left to run a phase within its bound, or to take or extend
 * the lock: the phase is not started, the lock released, and the next invocation continues from
 * the recorded phase.
 */
export class OutOfTime extends PhaseError {
  override name = "OutOfTime";
}

/**
 * The topology or the old primary's replica set changed since the decision, while the lock was
 * ours (an operator, or an agent shrinking its replica set): the plan is dropped and decided anew.
 */
export class PlanStale extends ShardguardError {
  override name = "PlanStale";
}

export const sleepOf = (deps: ControllerDeps) => deps.sleep ?? ((ms: number) => delay(ms));

export const timeoutsOf = (deps: ControllerDeps): PhaseTimeouts => ({
  ...defaultPhaseTimeouts(deps.config),
  ...deps.timeouts,
});

/** A fresh lock owner token: one per controller run (the lock's \`owner\`). */
export const newOwnerToken = (): string => `controller-${randomUUID()}`;

export const newOwnerOf = (deps: ControllerDeps) => (deps.newOwner ?? newOwnerToken)();

export async function publish(
  deps: ControllerDeps,
  type: EventType,
  detail: Record<string, unknown>,
): Promise<void> {
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

export async function aborted(deps: ControllerDeps, shard: string, epoch: number, reason: string) {
  deps.metrics.count("failoverAborted");
  deps.log.warn("failover aborted", { shard, epoch, reason });
  await publish(deps, "FailoverAborted", { shard, epoch, reason });
}
