import { heldThroughLinks, type LineageLink, promotionAncestry } from "../identity.ts";
import type { Candidate, FailoverState, Heartbeat, Lineage } from "../model.ts";
import { awaitingReason, type Gate, quietIds } from "./gate.ts";
import { describeCandidates, pickCandidates } from "./pick-candidate.ts";
import {
  followerUnheardRule,
  memberLinkedAwaiting,
  memberLinkedRule,
  memberUnheardRule,
  outsiderUnheardRule,
  outsideSetAheadRule,
  priorityZeroAheadRule,
  type Replacing,
  replicaAheadRule,
  targetTest,
} from "./replacing.ts";
import { awaitingReports, guardMembers, type ShardView } from "./view.ts";

/**
 * A failover past PROMOTE whose target died or never confirmed: another node is promoted in its
 * place under a further epoch (src/core/continuation.ts). Choosing that node is a failover's choice
 * again, so it passes the same rules as an online failover's choice of target (the same selections,
 * decide/replacing.ts): RETARGET_GATES. Quorum and the primary's state are settled: the plan is past its
 * point of no return.
 */
export interface RetargetView extends Replacing {
  /** What happened to the plan's target ("target r1 is no longer alive after PROMOTE"). */
  readonly why: string;
  readonly lineage: Lineage | undefined;
  /** Every node but the old primary and the failed target, in promotion order. */
  readonly candidates: readonly Candidate[];
  /** The failed target judged as the candidates are (undefined: it has no heartbeat). */
  readonly failedTarget: Candidate | undefined;
  readonly target: { readonly best: Candidate; readonly lineage: Lineage } | undefined;
  /** Nodes other than the old primary quiet within their keepalive. */
  readonly quiet: readonly Heartbeat[];
  /**
   * The lineage history with the failed target's promotion (\`promotedAncestry\`), recorded when
   * the shard goes offline on its new lineage; undefined when there is nothing to add.
   */
  readonly promotedAncestry: readonly LineageLink[] | undefined;
}

/**
 * The failed target's promotion: the lineage it started by applying this failover's PROMOTE (a new
 * replication id: writes acknowledged since went to that lineage only, and the replicas already
 * repointed at it share it) and, when known, the point of the plan's lineage it continues
 * (\`prior\`: Redis's \`master_replid2\` and \`second_repl_offset\` - 1 of the promoted process).
 */
interface Promotion {
  readonly lineage: Lineage;
  readonly prior: { readonly repl_id: string; readonly last_txn_id: number } | undefined;
}

/**
 * The target's promotion, read from its own report once it reported itself primary at this
 * failover's epoch on a new replication id (its \`prior_lineage\`; once its database died, that of
 * its last answer, \`answered_prior_lineage\`). When it applied its PROMOTE (its report is at the
 * epoch) and answers as something else now (its database restarted from an RDB as a replica of the
 * old primary), the nodes that followed it at this epoch still carry its promotion: every replica
 * (following the target, or parked) on one lineage other than the plan's whose
 * \`prior_lineage\` continues the plan's; a primary on such a lineage is a process restarted from
 * its RDB (Redis 7 gives it a new id continuing its old one), no witness (simulator seed
 * 100696: the target restarted from an RDB of the plan's lineage and parked; both other nodes held
 * its promoted lineage and were judged "foreign", the shard \`failing_over\` for good). Nodes that
 * disagree prove nothing: undefined, as while the target has not promoted. A target whose agent
 * stopped between applying its PROMOTE and reporting it (its report older than the epoch) is
 * vouched for only by replicas at the epoch linked to it now, link up: it answers them as a primary
 * on that lineage (simulator seed 7003 on the cool-down change's schedule: n3, repointed at the
 * silent n2 and holding what it acknowledged, was "foreign"; the shard came back on the old primary
 * and n3 full-synced from it, 64 replica-acknowledged writes lost). Only while its last report is
 * still the replica the plan chose, with no crash since, and their lineage branches off the plan's
 * at its point or later: a target restarted from its RDB as a primary also answers on a new id
 * continuing the plan's, from the RDB's point, behind it (simulator seed 171777: that restarted
 * process was taken for the promotion, n3 holding the plan's lineage judged "foreign", the shard
 * brought back on a replica of the restarted process, 1,655 writes lost). A target that crashed
 * since counts only when its followers' earlier lineage reaches the offset the plan ranked it on:
 * its RDB then held every write it was chosen for, and its followers hold what it took since,
 * PROMOTE applied or not (simulator seed 500367: n1, the target, restarted from an RDB at its
 * ranked offset, applied the PROMOTE 14 ms before the retarget's read; n3, linked to it, "foreign",
 * the shard went offline and came back on the old primary, and the 5 writes n3 acknowledged from n1
 * were lost). Guarantee 1.
 */
function targetPromotion(view: ShardView, state: FailoverState): Promotion | undefined {
  const epoch = view.topology?.epoch;
  const plan = state.lineage;
  const target = view.snapshot.nodes.find((node) => node.node_id === state.new_primary_node_id);
  if (target === undefined || epoch === undefined || plan === undefined) return undefined;
  const reported = target.epoch >= epoch;
  if (reported && target.role === "primary" && target.repl_id !== plan.repl_id) {
    // A down report's \`prior_lineage\` is what a restarted process holds now, never the dead one's link.
    const prior = target.db_status === "down" ? target.answered_prior_lineage : target.prior_lineage;
    return {
      lineage: { node_id: target.node_id, repl_id: target.repl_id, last_txn_id: target.last_txn_id },
      prior: prior === undefined || prior.repl_id === target.repl_id ? undefined : prior,
    };
  }
  if (reported && target.role === "primary" && target.db_status === "up") return undefined;
  if (!reported && target.role !== "replica") return undefined;
  // A target whose database restarted since its last report vouches for nothing it took: its
  // followers' lineage is its restarted process's, witness only when that process held every write
  // the plan ranked the target on (their \`prior_lineage\` on the plan's lineage at or past the
  // target's candidate row), as a PROMOTE would be refused below it (\`rankedShortfall\`).
  const least =
    !reported && target.db_crash !== undefined
      ? Math.max(
          plan.last_txn_id,
          state.candidates.find((candidate) => candidate.node_id === target.node_id)?.last_txn_id ??
            Number.POSITIVE_INFINITY,
        )
      : plan.last_txn_id;
  const followers = view.snapshot.nodes.filter(
    (node) =>
      node.node_id !== target.node_id &&
      node.role === "replica" &&
      (reported
        ? node.primary_node_id === undefined || node.primary_node_id === target.node_id
        : node.primary_node_id === target.node_id && node.primary_link === "up") &&
      node.db_status === "up" &&
      node.epoch >= epoch &&
      node.repl_id !== "" &&
      node.repl_id !== plan.repl_id &&
      node.prior_lineage !== undefined &&
      (reported
        ? continuesPlan(view, state, node.prior_lineage)
        : node.prior_lineage.repl_id === plan.repl_id && node.prior_lineage.last_txn_id >= least),
  );
  const first = followers[0];
  if (first === undefined || followers.some((node) => node.repl_id !== first.repl_id)) return undefined;
  const prior = first.prior_lineage;
  if (followers.some((node) => node.prior_lineage?.last_txn_id !== prior?.last_txn_id)) return undefined;
  return {
    lineage: {
      node_id: target.node_id,
      repl_id: first.repl_id,
      last_txn_id: Math.max(...followers.map((node) => node.last_txn_id)),
    },
    prior,
  };
}

/** \`prior\` is on the plan's lineage, directly or through the history and the plan's \`target_link\`. */
function continuesPlan(
  view: ShardView,
  state: FailoverState,
  prior: { readonly repl_id: string; readonly last_txn_id: number },
): boolean {
  const plan = state.lineage;
  if (plan === undefined) return false;
  const history = view.topology?.ancestry ?? [];
  return (
    prior.repl_id === plan.repl_id ||
    heldThroughLinks(
      { replId: prior.repl_id, offset: prior.last_txn_id },
      { replId: plan.repl_id, offset: plan.last_txn_id },
      [...history, ...(state.target_link === undefined ? [] : [state.target_link])],
    ) !== undefined
  );
}

/**
 * The shard's lineage history with the failed target's promotion (\`targetPromotion\`, the lineage
 * a retarget judges and an offline mark stores), when the link its new lineage continues is known
 * and is on the lineage the plan was decided on (directly, or through the history and the plan's
 * \`target_link\`). Undefined otherwise, or when the history holds it already. The change never
 * completed, so the completion (src/controller/transitions.ts \`ancestryAfter\`) never recorded it:
 * without it the stored lineage names the target's new id and no node on the plan's lineage is
 * ever found to hold any of it, so the last resort cannot take the parked replica holding every
 * write at the promotion point, the one rule 7 takes by the history (simulator seed 72080: offline
 * for good, 1,426 writes held by a parked replica). Recorded with the offline mark.
 */
function promotedAncestry(
  view: ShardView,
  state: FailoverState,
  promotion: Promotion,
): LineageLink[] | undefined {
  const prior = promotion.prior;
  if (prior === undefined || !continuesPlan(view, state, prior)) return undefined;
  return promotionAncestry(view.topology?.ancestry ?? [], state.target_link, {
    repl_id: prior.repl_id,
    until: prior.last_txn_id,
    by: promotion.lineage.repl_id,
  });
}

export function retargetView(view: ShardView, state: FailoverState, problem: string): RetargetView {
  const { snapshot, config, now } = view;
  const primaryId = state.old_primary_node_id;
  const promotion = targetPromotion(view, state);
  const lineage = promotion?.lineage ?? state.lineage;
  const members = guardMembers(snapshot, primaryId);
  // The plan was decided on its target's link (a database continuing the lineage through its
  // prior, `target_link`), recorded in the ancestry only once the change completes. The replicas
  // that followed the target hold what it held, so they are judged through that link too (simulator
  // seed 340561: without it they were "foreign" and the shard went offline for good).
  const links = [
    ...(view.topology?.ancestry ?? []),
    ...(state.target_link === undefined ? [] : [state.target_link]),
  ];
  const ranked = pickCandidates(snapshot.nodes, lineage, config, now, {
    exclude: primaryId,
    members,
    links,
  });
  const candidates = ranked.filter((candidate) => candidate.node_id !== state.new_primary_node_id);
  const best = candidates[0];
  return {
    ...view,
    primaryId,
    primary: snapshot.nodes.find((node) => node.node_id === primaryId),
    members,
    returning: `target ${state.new_primary_node_id}`,
    why: `target ${state.new_primary_node_id} ${problem} after PROMOTE`,
    lineage,
    candidates,
    failedTarget: ranked.find((candidate) => candidate.node_id === state.new_primary_node_id),
    target: best?.eligible === true && lineage !== undefined ? { best, lineage } : undefined,
    quiet: awaitingReports(snapshot, config, now, primaryId),
    promotedAncestry: promotion === undefined ? undefined : promotedAncestry(view, state, promotion),
  };
}

/**
 * Rule \`live_target_ahead\` (guarantee 1): the failed target, alive and judged as the candidates
 * are (fresh, its database up, a member holding the lineage), holds more of the lineage than the
 * best of them, or none of them is eligible. It was chosen for holding the most, and what it holds
 * past the others it may have acknowledged (\`WAIT 1\`): promoting another node instead drops
 * those writes for good (the failed target, once repointed, full-syncs from a node behind it).
 * \`replica_ahead_retarget\` waits for a stale replica further ahead; the failed target, excluded
 * from the ranking, was counted by no rule while its heartbeat was fresh. The plan keeps it: the
 * continuation sends its PROMOTE again (simulator seed 420290: a controller frozen between
 * recording \`promote\` and sending PROMOTE; the next invocation judged the live target overdue
 * from the epoch bump 60 s earlier and promoted a member 6,000 bytes behind it, 125 writes lost).
 * The reason why, or undefined when another node holds as much.
 */
export function liveTargetAhead(v: RetargetView): string | undefined {
  const failed = v.failedTarget;
  if (failed?.eligible !== true) return undefined;
  const best = v.candidates[0];
  if (best?.eligible === true && best.last_txn_id >= failed.last_txn_id) return undefined;
  const others =
    best?.eligible === true
      ? `the best other node, ${best.node_id}, holds ${best.last_txn_id}`
      : `no other node is eligible (${describeCandidates(v.candidates)})`;
  return (
    `${v.why}, but it is alive and holds the lineage to ${failed.last_txn_id}, and ${others}: ` +
    `promoting another node would drop writes only it may have acknowledged; sending its PROMOTE again`
  );
}

function notPromoting(v: RetargetView, best: Candidate): string {
  return `${v.why}; not promoting ${best.node_id} (last_txn_id ${best.last_txn_id}) instead while `;
}

/** The rules a retarget passes, in the order of their ONLINE_GATES twins (docs/safety.md). */
export const RETARGET_GATES: readonly Gate<RetargetView>[] = [
  {
    name: "quiet_replicas_retarget",
    code: "awaiting_reports",
    // As quiet_replicas: a quiet replica's offset is as old as its last write.
    invariant: [1],
    primaryStale: true,
    test: (v) => (v.quiet.length > 0 ? awaitingReason(v.quiet, v.why, v.now) : undefined),
    awaiting: (v) => quietIds(v.quiet),
  },
  {
    name: "member_unheard_retarget",
    code: "member_unheard",
    // As member_unheard; the failed target, a member, counts too: it was chosen for holding the most.
    invariant: [1],
    primaryStale: true,
    test: targetTest(memberUnheardRule, notPromoting),
  },
  {
    name: "outsider_unheard_retarget",
    code: "outsider_unheard",
    // As outsider_unheard, against the old primary's last report.
    invariant: [1],
    primaryStale: true,
    test: targetTest(outsiderUnheardRule, notPromoting),
  },
  {
    name: "follower_unheard_retarget",
    code: "follower_unheard",
    // As follower_unheard, against the old primary's last report.
    invariant: [1],
    primaryStale: true,
    test: targetTest(followerUnheardRule, notPromoting),
  },
  {
    name: "member_linked_retarget",
    code: "awaiting_reports",
    // As member_linked: a member still linked to the old primary, which takes writes, acknowledges
    // past its last report; promoting another node in the failed target's place drops them.
    invariant: [1],
    primaryStale: true,
    test: targetTest(memberLinkedRule, notPromoting),
    awaiting: memberLinkedAwaiting,
  },
  {
    name: "replica_ahead_retarget",
    code: "waiting_for_replica",
    invariant: [1],
    primaryStale: true,
    test: targetTest(replicaAheadRule, notPromoting),
  },
  {
    name: "outside_set_ahead_retarget",
    code: "waiting_for_replica",
    invariant: [1, 2],
    primaryStale: true,
    test: targetTest(outsideSetAheadRule, notPromoting),
  },
  {
    name: "priority_zero_ahead_retarget",
    code: "waiting_for_replica",
    invariant: [1],
    primaryStale: true,
    test: targetTest(priorityZeroAheadRule, notPromoting),
  },
];
