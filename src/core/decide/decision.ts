import type { Candidate, CrashReport, FailoverPhase, FailoverState, Lineage } from "../model.ts";
import { FAILOVER_PHASES } from "../model.ts";

/** A node as the orchestrator addresses it. */
export interface NodeRef {
  readonly node_id: string;
  readonly node_address: string;
}

/** Why a cycle did nothing; lets the loop count stale detections and offline shards. */
export type NoActionCode =
  | "no_topology"
  | "ambiguous_primary"
  | "paused"
  | "cooldown"
  | "locked"
  | "healthy"
  | "quorum_not_met"
  | "no_agent_heard"
  | "crash_no_candidate"
  | "waiting_for_replica"
  | "primary_demoted"
  | "awaiting_reports"
  | "member_unheard"
  | "outsider_unheard"
  | "follower_unheard"
  | "store_recovering"
  | "offline_no_candidate"
  | "inconsistent_topology"
  | "legacy_layout";

export type Decision =
  | {
      readonly kind: "none";
      readonly code: NoActionCode;
      /** True when the primary's heartbeat is stale, whatever stopped the action. */
      readonly primaryStale: boolean;
      readonly reason: string;
      /**
       * \`awaiting_reports\`: the nodes whose agents are quiet (their last report stands, within its
       * keepalive) but not heard within the failure timeout, or the members still linked to a primary
       * that takes writes (gates \`member_linked\`*): the controller asks them to report.
       */
      readonly awaiting?: readonly string[];
    }
  | {
      /** No topology yet: adopt the one node that reports itself primary. */
      readonly kind: "initialize";
      readonly primary: NodeRef;
      readonly epoch: number;
      readonly lineage: Lineage;
      readonly reason: string;
    }
  | {
      readonly kind: "failover";
      readonly epoch: number;
      readonly oldPrimary: string;
      readonly target: NodeRef;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage;
      /** Set when the crash fast path decided: the old primary's agent saw its process die. */
      readonly crash?: CrashReport;
      readonly reason: string;
    }
  | {
      readonly kind: "mark_offline";
      readonly epoch: number;
      readonly oldPrimary: string | undefined;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage | undefined;
      readonly reason: string;
    }
  | {
      readonly kind: "bring_online";
      readonly epoch: number;
      readonly target: NodeRef;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage;
      readonly reason: string;
      /** The old primary the target fences first (a deposing promotion, src/core/depose.ts). */
      readonly depose?: NodeRef;
    }
  | {
      /**
       * A change (failover, switchover, bring-online) left in `failing_over` by a controller that
       * stopped: continue it from its stored phase. Not the operator's `resume`, which lifts a pause.
       */
      readonly kind: "continue_failover";
      readonly epoch: number;
      readonly phase: FailoverPhase | undefined;
      readonly failover: FailoverState;
      readonly reason: string;
    };

export type DecisionKind = Decision["kind"];

/** Index of a phase in the ordered union; -1 for none. */
export function phaseIndex(phase: FailoverPhase | undefined): number {
  return phase === undefined ? -1 : FAILOVER_PHASES.indexOf(phase);
}

/** True once PROMOTE may have been sent: from then on a failover can no longer be aborted. */
export function isPastPointOfNoReturn(phase: FailoverPhase | undefined): boolean {
  return phaseIndex(phase) >= phaseIndex("promote");
}

export function refOf(candidate: Candidate): NodeRef {
  return { node_id: candidate.node_id, node_address: candidate.node_address };
}

/**
 * Two decisions are "the same answer" when they would do the same thing: same kind, same
 * epoch, same target. The orchestrator aborts when its re-read answers differently.
 */
export function sameDecision(a: Decision, b: Decision): boolean {
  if (a.kind !== b.kind) return false;
  if ("epoch" in a && "epoch" in b && a.epoch !== b.epoch) return false;
  return targetOf(a) === targetOf(b);
}

export function targetOf(decision: Decision): string | undefined {
  switch (decision.kind) {
    case "failover":
    case "bring_online":
      return decision.target.node_id;
    case "initialize":
      return decision.primary.node_id;
    case "continue_failover":
      return decision.failover.new_primary_node_id;
    default:
      return undefined;
  }
}
