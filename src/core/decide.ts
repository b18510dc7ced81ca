import type { FailoverConfig } from "./config.ts";
import type { Decision } from "./decide/decision.ts";
import { decideFailingOver } from "./decide/failing-over.ts";
import { ENTRY_GATES, firstGate } from "./decide/gate.ts";
import { decideOffline } from "./decide/offline.ts";
import { decideOnline } from "./decide/online.ts";
import { decideUninitialized } from "./decide/uninitialized.ts";
import { type DecideOptions, shardView } from "./decide/view.ts";
import { withDrainedNeverPromoted } from "./drain.ts";
import type { ShardSnapshot } from "./ports.ts";

/**
 * The failover decision core: pure functions of (snapshot, config, now). No SDK, no clock, no
 * environment, so that every rule is a table row in a unit test.
 *
 * A decision reads as a list: one view of the snapshot (decide/view.ts), the entry gates, then
 * the ordered gates of the shard's status (decide/gates.ts), then the candidate ranking
 * (decide/pick-candidate.ts). docs/safety.md says which guarantee each gate protects.
 */

export {
  type Decision,
  type DecisionKind,
  isPastPointOfNoReturn,
  type NoActionCode,
  type NodeRef,
  phaseIndex,
  sameDecision,
  targetOf,
} from "./decide/decision.ts";
export {
  AHEAD_GRACE,
  HUNG_HOLDER_GRACE,
  LAST_COPY_GRACE,
  REPLICA_AHEAD_GRACE,
} from "./decide/gate.ts";
export { pickCandidates, type RankOptions } from "./decide/pick-candidate.ts";
export { quorumNeeded } from "./decide/primary.ts";
export { planRecover, type RecoverPlan } from "./decide/recover.ts";
export { planSwitchover, type SwitchoverPlan } from "./decide/switchover.ts";
export {
  awaitingReports,
  type DecideOptions,
  dataLineageOf,
  describeHeartbeatAge,
  guardMembers,
  heartbeatAgeMs,
  isAgentHeard,
  isAlive,
  isFresh,
  isRecent,
  isReportCurrent,
  MAX_CLOCK_SKEW_MS,
  reportsPending,
  switchoverReporters,
} from "./decide/view.ts";

/**
 * Decides what the controller should do with one shard, from one snapshot. Always returns a
 * reason sentence that the loop logs.
 */
export function decide(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  options: DecideOptions = {},
): Decision {
  // A drained node is ranked at priority 0 by every gate (core/drain.ts).
  const view = shardView(withDrainedNeverPromoted(snapshot), config, now, options);
  const stopped = firstGate(ENTRY_GATES, view);
  if (stopped !== undefined) return stopped;
  const topology = view.topology;
  if (topology === undefined) return decideUninitialized(view);
  switch (topology.status) {
    case "failing_over":
      return decideFailingOver(view, topology);
    case "offline":
      return decideOffline(view, topology);
    default:
      // Online (a paused shard stopped at its entry gate).
      return decideOnline(view, topology);
  }
}
