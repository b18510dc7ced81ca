import { drainedOf } from "../drain.ts";
import type { Candidate, Heartbeat, Lineage, Topology } from "../model.ts";
import {
  candidateHoldsRefusingPrimary,
  followerUnheardReason,
  LAST_COPY_GRACE,
  linkedFollowers,
  linkedMembers,
  memberLinkedReason,
  memberUnheardReason,
  outsiderUnheardReason,
  REPLICA_AHEAD_GRACE,
  unheardMembers,
  unheardOutsiders,
} from "./gate.ts";
import {
  describeHeartbeatAge,
  heartbeatAgeMs,
  isAlive,
  isFresh,
  MAX_CLOCK_SKEW_MS,
  type ShardView,
} from "./view.ts";

/**
 * The rules for the node that replaces a primary: whether another node may hold acknowledged writes
 * the chosen one lacks. An online failover's choice passes them (ONLINE_GATES) and so does a
 * retarget's, the choice of another node when a failover's target died after PROMOTE
 * (RETARGET_GATES): one definition, two gate lists (docs/safety.md).
 */

/** What the rules need of a change of primary. */
export interface Replacing extends ShardView {
  /** The primary being replaced. */
  readonly primaryId: string | undefined;
  readonly primary: Heartbeat | undefined;
  /** Its guarded replica set (undefined: none under the guard, or its agent confirmed its crash). */
  readonly members: readonly string[] | undefined;
  /** Whose return ends a wait for a node the operator never promotes ("the primary", "target r1"). */
  readonly returning: string;
}

/**
 * A rule: the tail of the reason why \`best\`, of \`lineage\`, is not promoted yet, or undefined when
 * the rule lets it through.
 */
export type TargetRule = (v: Replacing, best: Candidate, lineage: Lineage) => string | undefined;

/** Stale replicas of the lineage further ahead than the best candidate, stale only just now. */
export function replicasAhead(v: Replacing, best: Candidate, lineage: Lineage): Heartbeat[] {
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== v.primaryId &&
      node.node_id !== best.node_id &&
      node.db_status === "up" &&
      node.repl_id === lineage.repl_id &&
      node.last_txn_id > best.last_txn_id &&
      !isFresh(node, v.config, v.now) &&
      heartbeatAgeMs(node, v.now) <= REPLICA_AHEAD_GRACE * v.config.failureTimeoutMs &&
      // A heartbeat dated beyond the clock bound is no evidence of a live replica.
      heartbeatAgeMs(node, v.now) >= -MAX_CLOCK_SKEW_MS,
  );
}

/** Live replicas of the lineage outside the old primary's set, further ahead than the best candidate. */
export function outsideAhead(v: Replacing, best: Candidate, lineage: Lineage): Heartbeat[] {
  const { members } = v;
  if (members === undefined) return [];
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== v.primaryId &&
      node.node_id !== best.node_id &&
      !members.includes(node.node_id) &&
      isAlive(node, v.config, v.now) &&
      node.repl_id === lineage.repl_id &&
      node.last_txn_id > best.last_txn_id,
  );
}

/**
 * Live priority-0 replicas of the lineage further ahead than the best candidate: never promoted by
 * the operator's choice, they may hold writes they acknowledged that the candidate lacks.
 */
export function priorityZeroAhead(v: Replacing, best: Candidate, lineage: Lineage): Heartbeat[] {
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== v.primaryId &&
      node.priority === 0 &&
      isAlive(node, v.config, v.now) &&
      node.repl_id === lineage.repl_id &&
      node.last_txn_id > best.last_txn_id,
  );
}

/**
 * A member whose agent is unheard may hold writes only it acknowledged; its offset is unknown. The
 * stored set counts even when the primary's agent confirms its crash: the data is the question.
 */
export const memberUnheardRule: TargetRule = (v, best) => {
  if (v.primaryId === undefined) return undefined;
  const unheard = unheardMembers(v, v.primaryId, best.node_id);
  if (unheard.length === 0) return undefined;
  // A primary refusing every write holds no write past its offset: a candidate holding it is safe.
  if (candidateHoldsRefusingPrimary(v, v.primaryId, best) !== undefined) return undefined;
  return memberUnheardReason(unheard, v.primaryId, v.now);
};

/**
 * A replica the old primary's agent could not name (no agent) acknowledged its writes as any member
 * does; what it holds is unknown. As for an unheard member, the crash fast path included, and the
 * same proof lets the candidate through: a primary found refusing every write sent none past the
 * offset the candidate holds.
 */
export const outsiderUnheardRule: TargetRule = (v, best) => {
  if (v.primaryId === undefined) return undefined;
  const outsiders = unheardOutsiders(v, v.primary);
  if (outsiders.length === 0) return undefined;
  if (candidateHoldsRefusingPrimary(v, v.primaryId, best) !== undefined) return undefined;
  return outsiderUnheardReason(outsiders, v.primaryId);
};

/**
 * A replica outside the set that followed the old primary after its agent's last report, its own
 * agent unheard since: it may have acknowledged writes nobody could demand or record. As for an
 * unheard member, the crash fast path included; the same proof lets the candidate through.
 */
export const followerUnheardRule: TargetRule = (v, best) => {
  if (v.primaryId === undefined) return undefined;
  const followers = linkedFollowers(v, v.primaryId, v.primary, best.node_id);
  if (followers.length === 0) return undefined;
  if (candidateHoldsRefusingPrimary(v, v.primaryId, best) !== undefined) return undefined;
  return followerUnheardReason(followers, v.primaryId, v.now);
};

/**
 * A member of the old primary's set, other than the target, whose fresh report follows it with the
 * link up and whose probe found it taking writes (\`linkedMembers\`): its offset is no final one, it
 * may acknowledge writes the target lacks. The crash fast path never gets here with one (gate
 * \`crash_unconfirmed\` needs every fresh replica to see the link down); the refusing-primary proof
 * lets the candidate through, as for an unheard member.
 */
export const memberLinkedRule: TargetRule = (v, best) => {
  if (v.primaryId === undefined) return undefined;
  const linked = linkedMembers(v, v.primaryId, best.node_id);
  if (linked.length === 0) return undefined;
  if (candidateHoldsRefusingPrimary(v, v.primaryId, best) !== undefined) return undefined;
  return memberLinkedReason(linked, v.primaryId);
};

/** The members gates \`member_linked\` and \`member_linked_retarget\` ask to report (\`linkedMembers\`). */
export function memberLinkedAwaiting(
  v: Replacing & { readonly target: { readonly best: Candidate } | undefined },
): string[] {
  return v.target === undefined
    ? []
    : linkedMembers(v, v.primaryId, v.target.best.node_id).map((node) => node.node_id);
}

export const replicaAheadRule: TargetRule = (v, best, lineage) => {
  const ahead = replicasAhead(v, best, lineage);
  if (ahead.length === 0) return undefined;
  return `${[...ahead]
    .sort((a, b) => a.node_id.localeCompare(b.node_id))
    .map(
      (node) =>
        `${node.node_id} (last_txn_id ${node.last_txn_id}, heartbeat ${describeHeartbeatAge(node, v.now, "old")})`,
    )
    .join(", ")}, further ahead, may still answer`;
};

/**
 * Failure timeouts a replica whose database is down, but whose last answer held more than the best
 * candidate, is waited for (gate \`replica_down_ahead\`): a database restarts from its RDB or AOF
 * within seconds, and the old primary, stale, may return. Past it the failover goes ahead, and its
 * reason names the node passed over.
 */
export const DOWN_AHEAD_GRACE = LAST_COPY_GRACE;

/**
 * Replicas of the lineage (not the old primary, not \`best\`) whose database is down (dead,
 * restarting, or a new process its agent keeps fenced) and whose last answer held more than \`best\`:
 * its agent reports the dead process's last offset (src/agent/heartbeat-report.ts). What it held past
 * \`best\` it may have acknowledged (\`WAIT 1\`), and with its database gone the old primary may be
 * the only copy left (nemesis 5301). \`within\`: the ones whose database answered within
 * \`DOWN_AHEAD_GRACE\` failure timeouts (waited for); otherwise the ones past it (passed over).
 */
export function downAhead(v: Replacing, best: Candidate, lineage: Lineage, within: boolean): Heartbeat[] {
  const graceMs = DOWN_AHEAD_GRACE * v.config.failureTimeoutMs;
  return v.snapshot.nodes
    .filter(
      (node) =>
        // The old primary counts only as the target (an offline shard's bring-online): back behind
        // what it last answered, what it acknowledged past that is on replicas alone (nemesis 7214).
        (node.node_id !== v.primaryId || node.node_id === best.node_id) &&
        // The candidate itself counts when it is back behind its own last answer (nemesis 6803).
        ((node.node_id !== best.node_id &&
          (node.db_status === "down"
            ? node.repl_id === lineage.repl_id && node.last_txn_id > best.last_txn_id
            : restartedAhead(node, best, lineage))) ||
          restartedBehindAhead(node, best, lineage)) &&
        // A report dated beyond the clock bound is no evidence.
        heartbeatAgeMs(node, v.now) >= -MAX_CLOCK_SKEW_MS &&
        downAgeMs(node, v.now) <= graceMs === within,
    )
    .sort((a, b) => a.node_id.localeCompare(b.node_id));
}

/**
 * A database back from its RDB under a new replication id (Redis 7), answering: it holds the
 * lineage only as its earlier one (\`prior_lineage\`), up to further than \`best\`. Not a candidate
 * of an online failover (the last resort is the offline shard's), it is waited for as a down one
 * is, until its agent has it follow the primary again (then it is on the lineage and ranks) or the
 * grace ends (a CI run of replica-down-ahead.test.ts promoted node-3 the moment node-2's database
 * answered again: its RDB held what node-2 had acknowledged).
 */
function restartedAhead(node: Heartbeat, best: Candidate, lineage: Lineage): boolean {
  return (
    node.repl_id !== lineage.repl_id &&
    node.prior_lineage?.repl_id === lineage.repl_id &&
    node.prior_lineage.last_txn_id > best.last_txn_id
  );
}

/**
 * A database answering again on the lineage, restarted behind what its dead process last answered
 * (\`restarted_behind\`: a replica back from an older RDB keeps the replication id at the RDB's
 * offset), when that answer held more than \`best\`: what it acknowledged past its current offset may
 * be on the old primary alone. \`best\` may be this very node (nemesis seed 6803: node-2, back from
 * its RDB 1,837 bytes behind its last answer, was brought online 2.9 s after it while primary
 * node-1, hung 27 s, held the 23 writes node-2 had acknowledged).
 */
function restartedBehindAhead(node: Heartbeat, best: Candidate, lineage: Lineage): boolean {
  const behind = node.restarted_behind;
  return (
    behind !== undefined &&
    node.db_status === "up" &&
    behind.repl_id === lineage.repl_id &&
    behind.last_txn_id > best.last_txn_id &&
    !(node.repl_id === behind.repl_id && node.last_txn_id >= behind.last_txn_id)
  );
}

/** How long \`node\`'s copy has been out of reach: since its database's last answer, or since it answers in its current role. */
function downAgeMs(node: Heartbeat, now: number): number {
  if (node.db_status === "up" && node.restarted_behind !== undefined)
    return now - node.restarted_behind.last_updated / 1000;
  if (node.db_status === "down" || node.role_since === undefined) return heartbeatAgeMs(node, now);
  return now - node.role_since / 1000;
}

function describeDownAhead(nodes: readonly Heartbeat[], now: number): string {
  return nodes
    .map((node) =>
      node.db_status === "down"
        ? `${node.node_id} (database down, last answered ${describeHeartbeatAge(node, now, "ago")}, last_txn_id ${node.last_txn_id})`
        : node.restarted_behind !== undefined
          ? `${node.node_id} (database restarted behind its last answer: up to ${node.last_txn_id} now, ${node.restarted_behind.last_txn_id} ${Math.round(now - node.restarted_behind.last_updated / 1000)} ms ago)`
          : `${node.node_id} (database restarted, holding the lineage as its earlier one up to ${node.prior_lineage?.last_txn_id})`,
    )
    .join(", ");
}

/**
 * A replica whose database went down holding more than the candidate: what it acknowledged past the
 * candidate's offset may be on the old primary alone now. Waits up to \`DOWN_AHEAD_GRACE\` for its
 * database to answer again (then the other rules judge it as any replica) or the primary to return.
 */
export const replicaDownAheadRule: TargetRule = (v, best, lineage) => {
  const down = downAhead(v, best, lineage, true);
  if (down.length === 0) return undefined;
  return (
    `${describeDownAhead(down, v.now)} held more when its database last answered and may have acknowledged writes it lacks,` +
    ` which only ${v.primaryId ?? "the old primary"} may still hold: waiting up to ${DOWN_AHEAD_GRACE} failure timeouts for its database` +
    ` to answer again (its RDB or AOF may hold them) or for ${v.returning} to return`
  );
};

/**
 * \`replicaDownAheadRule\` for the nodes back behind their last answer only (\`restarted_behind\`):
 * an offline shard's bring-online (gate \`replica_down_ahead_offline\`; a replica merely down is
 * not waited for there yet, docs/safety.md).
 */
export const restartedBehindRule: TargetRule = (v, best, lineage) => {
  const down = downAhead(v, best, lineage, true).filter(
    (node) => node.db_status === "up" && node.restarted_behind !== undefined,
  );
  if (down.length === 0) return undefined;
  if (down.some((node) => node.node_id === v.primaryId))
    return (
      `${describeDownAhead(down, v.now)} held more when its database last answered and may have acknowledged writes it lacks,` +
      ` which only the replicas that followed it may still hold: waiting up to ${DOWN_AHEAD_GRACE} failure timeouts after that answer` +
      " for a node with as much to report"
    );
  return (
    `${describeDownAhead(down, v.now)} held more when its database last answered and may have acknowledged writes it lacks,` +
    ` which only ${v.primaryId ?? "the old primary"} may still hold: waiting up to ${DOWN_AHEAD_GRACE} failure timeouts after that answer` +
    ` for ${v.returning} to return`
  );
};

/** The tail of a failover's reason for replicas \`replicaDownAheadRule\` waited for in vain, or "". */
export function passedOverDown(v: Replacing, best: Candidate, lineage: Lineage): string {
  const down = downAhead(v, best, lineage, false);
  if (down.length === 0) return "";
  return (
    `; passing over ${describeDownAhead(down, v.now)}, down longer than ${DOWN_AHEAD_GRACE} failure timeouts:` +
    ` writes only it and ${v.primaryId ?? "the old primary"} held are lost unless ${v.primaryId ?? "the old primary"} returns` +
    " (docs/safety.md, guarantee 1's assumptions)"
  );
}

/** The replica ahead cannot be promoted (nothing would fence the old primary); the member lacks its writes. */
export const outsideSetAheadRule: TargetRule = (v, best, lineage) => {
  const outside = outsideAhead(v, best, lineage);
  if (outside.length === 0) return undefined;
  // No time limit (issue 30, finding 6): the member lacks what the replica ahead acknowledged, and
  // the replica ahead cannot be promoted while nothing fences the old primary.
  return (
    `${outside
      .map((node) => `${node.node_id} (last_txn_id ${node.last_txn_id})`)
      .sort()
      .join(
        ", ",
      )}, outside ${v.primaryId}'s replica set, holds more and may have acknowledged writes the member lacks:` +
    ` waiting for ${v.primaryId} to return, for its agent to confirm a crash (then every replica is a candidate),` +
    " or for that replica to stop answering"
  );
};

/** Priority 0 is the operator's "never promote"; passing it over would drop what it acknowledged. */
export const priorityZeroAheadRule: TargetRule = (v, best, lineage) => {
  const ahead = priorityZeroAhead(v, best, lineage);
  if (ahead.length === 0) return undefined;
  return (
    `${describePriorityZero(ahead, v.topology)} holds more and may have acknowledged writes it lacks; priority 0 is never promoted: ` +
    `waiting for ${v.returning} to return, or for an operator to ${priorityZeroRemedy(ahead, v.topology)}`
  );
};

/**
 * A gate's test from a rule: the rule applied to the view's target, its reason after \`prefix\`
 * (what is being decided and why the target waits).
 */
export function targetTest<
  V extends Replacing & {
    readonly target: { readonly best: Candidate; readonly lineage: Lineage } | undefined;
  },
>(rule: TargetRule, prefix: (v: V, best: Candidate) => string): (v: V) => string | undefined {
  return (v) => {
    if (v.target === undefined) return undefined;
    const tail = rule(v, v.target.best, v.target.lineage);
    return tail === undefined ? undefined : `${prefix(v, v.target.best)}${tail}`;
  };
}

/**
 * Priority-0 nodes as a reason names them: a drained one (ranked at priority 0 by the drain, its
 * agent's own priority may be any) says so (nemesis seeds 5102, 5401: the reason sent the operator
 * to restart an agent with a priority, which changes nothing for a drained node).
 */
export function describePriorityZero(nodes: readonly Heartbeat[], topology: Topology | undefined): string {
  const drained = drainedOf(topology);
  return nodes
    .map((node) =>
      drained.includes(node.node_id)
        ? `${node.node_id} (drained, ranked priority 0, last_txn_id ${node.last_txn_id})`
        : `${node.node_id} (priority 0, last_txn_id ${node.last_txn_id})`,
    )
    .sort()
    .join(", ");
}

/** What lifts a priority-0 hold: undrain a drained node, give any other a priority. */
export function priorityZeroRemedy(nodes: readonly Heartbeat[], topology: Topology | undefined): string {
  const drained = drainedOf(topology);
  const undrain = nodes.filter((node) => drained.includes(node.node_id)).map((node) => node.node_id);
  const restart = nodes.filter((node) => !drained.includes(node.node_id));
  const remedies = [
    ...undrain
      .sort()
      .map((id) => `undrain ${id} (shardguard undrain --shard ${topology?.shard ?? "S"} --node ${id})`),
    ...(restart.length > 0 ? ["give that node a priority (restart its agent with --priority)"] : []),
  ];
  return remedies.join(", or ");
}
