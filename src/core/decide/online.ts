import type { Candidate, Topology } from "../model.ts";
import type { Decision } from "./decision.ts";
import { refOf } from "./decision.ts";
import {
  awaitingReason,
  candidateHoldsRefusingPrimary,
  cooldownReason,
  firstGate,
  type Gate,
  linkedFollowers,
  linkedMembers,
  quietIds,
  unheardMembers,
  unheardOutsiders,
} from "./gate.ts";
import { isPrimaryStale, type OnlineView, onlineView, quorumMet } from "./online-view.ts";
import { describeCandidates } from "./pick-candidate.ts";
import {
  followerUnheardRule,
  memberLinkedAwaiting,
  memberLinkedRule,
  memberUnheardRule,
  outsiderUnheardRule,
  outsideSetAheadRule,
  passedOverDown,
  priorityZeroAheadRule,
  replicaAheadRule,
  replicaDownAheadRule,
  targetTest,
} from "./replacing.ts";
import { heartbeatAgeMs, type ShardView } from "./view.ts";

function notPromoting(v: OnlineView, best: Candidate): string {
  return `${v.staleness}, ${v.quorumText}; not promoting ${best.node_id} (last_txn_id ${best.last_txn_id}) while `;
}

/** The wait and refusal rules of an online shard, in order (docs/safety.md). */
export const ONLINE_GATES: readonly Gate<OnlineView>[] = [
  {
    name: "cooldown_online",
    code: "cooldown",
    // No automatic change right after the last one, unless the primary's own agent confirms its
    // database died (refused, reset, or a new process without its data): nothing flaps there, and
    // waiting out the cool-down leaves the shard with no writable primary for all of it (simulator
    // seed 117581: a failover completed onto a node whose database had restarted empty 0.1 s
    // before; 31 s without a writable primary, 5 minutes at the default cool-down). Guarantee 3.
    invariant: [2, 3],
    primaryStale: isPrimaryStale,
    test: (v) => (v.deadPrimary !== undefined ? undefined : cooldownReason(v, isPrimaryStale(v))),
  },
  {
    name: "primary_healthy",
    code: "healthy",
    invariant: [2],
    primaryStale: false,
    test: (v) =>
      v.primaryState === "healthy" && v.primary !== undefined
        ? `primary ${v.primary.node_id} is fresh (database answered ${Math.max(0, Math.round(heartbeatAgeMs(v.primary, v.now)))} ms ago)`
        : undefined,
  },
  {
    name: "primary_demoted_grace",
    code: "primary_demoted",
    // A named primary answering as a replica takes no writes; sooner than the failure timeout a
    // PROMOTE in flight or a repair may still make it primary.
    invariant: [3],
    primaryStale: false,
    test: (v) =>
      v.demotedMs !== undefined && v.demotedMs <= v.config.failureTimeoutMs
        ? `${v.staleness}; waiting up to ${v.config.failureTimeoutMs} ms for it to be primary again before replacing it`
        : undefined,
  },
  {
    name: "quiet_replicas",
    code: "awaiting_reports",
    // A quiet replica's offset and its view of the primary are as old as its last write.
    invariant: [1],
    primaryStale: true,
    test: (v) => (v.quiet.length > 0 ? awaitingReason(v.quiet, v.staleness, v.now) : undefined),
    awaiting: (v) => quietIds(v.quiet),
  },
  {
    name: "crash_unconfirmed",
    code: "quorum_not_met",
    // A replica's offset is final only in an INFO read after its link dropped; candidates are ranked by it.
    invariant: [1],
    primaryStale: false,
    test: (v) =>
      v.crash !== undefined && v.downVoters.length < v.needed
        ? `${v.staleness}, but only ${v.downVoters.length} of ${v.voters.length} fresh replicas see the replication link down` +
          ` (the crash fast path needs ${v.needed}); waiting for them or for the failure timeout`
        : undefined,
  },
  {
    name: "no_agent_heard",
    code: "no_agent_heard",
    // A dead shard cannot be told from agents cut off from the table while every database serves.
    invariant: [1, 2],
    primaryStale: true,
    test: (v) =>
      v.config.quorum !== "none" && !v.anyAgentHeard
        ? `${v.staleness}, and no agent of the shard was heard for more than ${v.config.failureTimeoutMs} ms: ` +
          "a dead shard cannot be told from agents cut off from the table; not failing over or marking it offline"
        : undefined,
  },
  {
    name: "store_returning_online",
    code: "store_recovering",
    invariant: [1, 2],
    primaryStale: true,
    test: (v) => (v.storeReturning === undefined ? undefined : `${v.staleness}; ${v.storeReturning}`),
  },
  {
    name: "quorum",
    code: "quorum_not_met",
    // With no voter at all nobody can confirm the failure: offline at most, never a promotion.
    invariant: [2],
    primaryStale: true,
    test: (v) =>
      quorumMet(v)
        ? undefined
        : `${v.staleness}, but only ${v.downVoters.length} of ${v.voters.length} fresh replicas report the primary down (quorum ${v.config.quorum} needs ${Math.max(v.needed, 1)}); not failing over`,
  },
  {
    name: "crash_no_candidate",
    code: "crash_no_candidate",
    // The fast path only promotes; marking a shard offline waits for the failure timeout.
    invariant: [3],
    primaryStale: false,
    test: (v) =>
      v.target === undefined && v.crash !== undefined
        ? `${v.staleness}, ${v.quorumText}, but no node is eligible (${describeCandidates(v.candidates)}); waiting for the failure timeout`
        : undefined,
  },
  {
    name: "member_unheard",
    code: "member_unheard",
    // A member whose agent is unheard may hold writes only it acknowledged; its offset is unknown.
    // The stored set counts even when the primary's agent confirms its crash: the data is the question.
    invariant: [1],
    primaryStale: true,
    test: targetTest(memberUnheardRule, notPromoting),
  },
  {
    name: "outsider_unheard",
    code: "outsider_unheard",
    // A replica without an agent acknowledged writes as a member does; what it holds is unknown.
    invariant: [1],
    primaryStale: true,
    test: targetTest(outsiderUnheardRule, notPromoting),
  },
  {
    name: "follower_unheard",
    code: "follower_unheard",
    // A replica that followed the primary after its agent's last report may have acknowledged
    // writes nobody demanded or recorded; what it holds is unknown.
    invariant: [1],
    primaryStale: true,
    test: targetTest(followerUnheardRule, notPromoting),
  },
  {
    name: "member_linked",
    code: "awaiting_reports",
    // A member still linked to a primary that takes writes acknowledges past its last report: its
    // offset is no final one (nemesis 7342). It is asked to report: its probe ends the wait.
    invariant: [1],
    primaryStale: true,
    test: targetTest(memberLinkedRule, notPromoting),
    awaiting: memberLinkedAwaiting,
  },
  {
    name: "replica_ahead",
    code: "waiting_for_replica",
    invariant: [1],
    primaryStale: true,
    test: targetTest(replicaAheadRule, notPromoting),
  },
  {
    name: "outside_set_ahead",
    code: "waiting_for_replica",
    // The replica ahead cannot be promoted (nothing would fence the old primary); the member lacks its writes.
    invariant: [1, 2],
    primaryStale: true,
    test: targetTest(outsideSetAheadRule, notPromoting),
  },
  {
    name: "priority_zero_ahead",
    code: "waiting_for_replica",
    // Priority 0 is the operator's "never promote"; passing it over would drop what it acknowledged.
    invariant: [1],
    primaryStale: true,
    test: targetTest(priorityZeroAheadRule, notPromoting),
  },
  {
    name: "replica_down_ahead",
    code: "waiting_for_replica",
    // A replica whose database went down holding more than the candidate: the old primary may be
    // the only copy of what it acknowledged past the candidate (nemesis 5301).
    invariant: [1],
    primaryStale: true,
    test: targetTest(replicaDownAheadRule, notPromoting),
  },
  {
    name: "lock_held_online",
    code: "locked",
    invariant: [4],
    primaryStale: true,
    test: (v) => (v.locked ? `${v.staleness}; another controller holds the lock` : undefined),
  },
];

/** An online shard: the first gate that fires, else a failover to the best candidate, else offline. */
export function decideOnline(view: ShardView, topology: Topology): Decision {
  const v = onlineView(view, topology);
  const stopped = firstGate(ONLINE_GATES, v);
  if (stopped !== undefined) return stopped;
  if (v.target === undefined) {
    return {
      kind: "mark_offline",
      epoch: topology.epoch,
      oldPrimary: v.primaryId,
      candidates: v.candidates,
      lineage: v.lineage,
      reason: `${v.staleness}, ${v.quorumText}, and no node is eligible (${describeCandidates(v.candidates)}); marking the shard offline`,
    };
  }
  const { best, lineage } = v.target;
  // Members, outsiders or followers unheard were set aside by the refusing-primary proof (gates
  // member_unheard, outsider_unheard, follower_unheard, member_linked): say so.
  const proof =
    v.primaryId !== undefined &&
    (unheardMembers(v, v.primaryId, best.node_id).length > 0 ||
      unheardOutsiders(v, v.primary).length > 0 ||
      linkedFollowers(v, v.primaryId, v.primary, best.node_id).length > 0 ||
      linkedMembers(v, v.primaryId, best.node_id).length > 0)
      ? candidateHoldsRefusingPrimary(v, v.primaryId, best)
      : undefined;
  return {
    kind: "failover",
    epoch: topology.epoch,
    oldPrimary: v.primaryId ?? "",
    target: refOf(best),
    candidates: v.candidates,
    lineage,
    ...(v.crash !== undefined ? { crash: v.crash } : {}),
    reason: `${v.staleness}, ${v.quorumText}; promoting ${best.node_id} (priority ${best.priority}, last_txn_id ${best.last_txn_id})${
      proof === undefined ? "" : `; ${proof}`
    }${passedOverDown(v, best, lineage)}`,
  };
}
