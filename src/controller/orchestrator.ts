/**
 * The orchestrator: carries out a decision under the shard's lock as an ordered series of
 * phases, each recorded in the topology, each with a bound, each idempotent.
 *
 *   lock -> re-read & decide again -> epoch + 1 (epoch_bumped) -> [catch_up] -> promote
 *        -> confirm (observe the heartbeat) -> repoint -> cleanup -> history, online, release
 *
 * Its parts, one job each:
 * - cycle.ts: one cycle over a shard (decide, lock, act, continue_failover via core/continuation.ts);
 * - lock.ts: the lock: acquire, renew, release and every write fenced by it;
 * - phases.ts: the phases in their one order, with their bounds and the time budget;
 * - transitions.ts: the state transitions (start a plan, record a phase, complete, offline, abandon);
 * - requests.ts: operator requests (switchover, pause, resume, recover) and their handler.
 */

export { LockLost } from "../core/ports.ts";
export { type CycleOptions, runShardCycle } from "./cycle.ts";
export {
  type ControllerDeps,
  type CycleOutcome,
  type CycleResult,
  defaultPhaseTimeouts,
  OutOfTime,
  PhaseTimeout,
  type PhaseTimeouts,
  PlanStale,
} from "./deps.ts";
export { ShardLock } from "./lock.ts";
export {
  pauseShard,
  type RequestOptions,
  recoverShard,
  requestSwitchover,
  resumeShard,
  type SwitchoverRequest,
} from "./requests.ts";
