import { ShardguardError } from "../errors.ts";
import type { Heartbeat, Topology } from "../model.ts";
import type { Decision } from "./decision.ts";
import { refOf } from "./decision.ts";
import {
  awaitingReason,
  candidateHoldsRefusingPrimary,
  cooldownReason,
  firstGate,
  followerUnheardReason,
  type Gate,
  linkedFollowers,
  linkedMembers,
  memberLinkedReason,
  memberUnheardReason,
  outsiderUnheardReason,
  quietIds,
  unheardFollowers,
  unheardMembers,
  unheardOutsiders,
} from "./gate.ts";
import {
  deposer,
  heldByOldPrimaryReport,
  hungHolders,
  lastResortInS,
  lastResortWaiting,
  type OfflineView,
  offlineView,
  ownRun,
  priorHoldersAhead,
  unfencedOldPrimary,
} from "./offline-view.ts";
import { describeCandidates } from "./pick-candidate.ts";
import {
  describePriorityZero,
  priorityZeroRemedy,
  type Replacing,
  restartedBehindRule,
} from "./replacing.ts";
import { describeHeartbeatAge, isAlive, type ShardView } from "./view.ts";

/** The wait and refusal rules of an offline shard, in order (docs/safety.md). */
export const OFFLINE_GATES: readonly Gate<OfflineView>[] = [
  {
    name: "cooldown_offline",
    code: "cooldown",
    invariant: [2],
    primaryStale: false,
    test: (v) => cooldownReason(v, false),
  },
  {
    name: "store_returning_offline",
    code: "store_recovering",
    invariant: [1, 2],
    primaryStale: false,
    test: (v) => (v.storeReturning === undefined ? undefined : `shard offline; ${v.storeReturning}`),
  },
  {
    name: "quiet_nodes_offline",
    code: "awaiting_reports",
    invariant: [1],
    primaryStale: false,
    test: (v) => (v.quiet.length > 0 ? awaitingReason(v.quiet, "shard offline", v.now) : undefined),
    awaiting: (v) => quietIds(v.quiet),
  },
  {
    name: "no_eligible_node",
    code: "offline_no_candidate",
    // Only a node holding the stored lineage comes back; one holding it as its earlier one only as the last resort.
    invariant: [1, 5],
    primaryStale: false,
    test: (v) =>
      v.target === undefined
        ? `shard offline; no eligible node to bring it back (${describeCandidates(v.candidates)})${lastResortWaiting(v)}`
        : undefined,
  },
  {
    name: "prior_holder_ahead",
    code: "offline_no_candidate",
    // The lineage continued under another replication id (an RDB restart) by a node holding more:
    // bringing the shard back on a node behind it drops what it acknowledged (sim seed 7007).
    invariant: [1],
    primaryStale: false,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const { best, lineage } = v.target;
      const ahead = priorHoldersAhead(v, best, lineage);
      if (ahead.length === 0) return undefined;
      const grace = lastResortInS(v);
      return (
        `shard offline; not bringing it back on ${best.node_id} (last_txn_id ${best.last_txn_id}) while ${ahead
          .map(
            (node) =>
              `${node.node_id} (up to ${node.prior_lineage?.last_txn_id} of the lineage, now on ${node.repl_id})`,
          )
          .sort()
          .join(
            ", ",
          )} continues the lineage under another replication id (a restart from an RDB) and holds more: ` +
        `it is ranked by what it holds as the last resort, within ${grace} s`
      );
    },
  },
  {
    name: "unfenced_old_primary",
    code: "offline_no_candidate",
    // Promoting a node fences an old primary that may still serve only through its write guard;
    // unless the target reaches the old primary and fences it itself first (a deposing promotion).
    invariant: [2],
    primaryStale: false,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const { best } = v.target;
      const old = unfencedOldPrimary(v, best, v.target.lineage);
      if (old === undefined || deposer(v, best, old) !== undefined) return undefined;
      return (
        `shard offline; ${best.node_id} is eligible but not in ${old.node_id}'s replica set, and ${old.node_id}'s agent ` +
        `is not heard (${describeHeartbeatAge(old, v.now, "ago")}) nor reported a crash: its database may still take ` +
        `writes unfenced, and ${best.node_id} does not reach it to fence it itself; waiting for its agent, a confirmed crash, ` +
        "a member of its set, that reach, or shardguard recover"
      );
    },
  },
  {
    name: "member_unheard_offline",
    code: "member_unheard",
    // As member_unheard: bringing the shard back on another node drops what an unheard member acknowledged.
    invariant: [1],
    primaryStale: false,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const { best, lineage } = v.target;
      // The old primary back on its own run holds everything any member of its set acknowledged.
      if (best.node_id === lineage.node_id && ownRun(v, best.node_id, lineage)) return undefined;
      const unheard = unheardMembers(v, lineage.node_id, best.node_id);
      if (unheard.length === 0 || lineage.node_id === undefined) return undefined;
      return (
        `shard offline; not bringing it back on ${best.node_id} (last_txn_id ${best.last_txn_id}) while ` +
        memberUnheardReason(unheard, lineage.node_id, v.now)
      );
    },
  },
  {
    name: "outsider_unheard_offline",
    code: "outsider_unheard",
    // As outsider_unheard, against the last report of the old primary the stored lineage names.
    invariant: [1],
    primaryStale: false,
    test: (v) =>
      heldByOldPrimaryReport(v, ({ old, oldId }) => {
        const outsiders = unheardOutsiders(v, old);
        return outsiders.length === 0 ? undefined : outsiderUnheardReason(outsiders, oldId);
      }),
  },
  {
    name: "follower_unheard_offline",
    code: "follower_unheard",
    // As follower_unheard, against the last report of the old primary the stored lineage names. A
    // deposing promotion (the target outside the old primary's set) fences the old primary and
    // catches up with its final offset before it detaches, so what a heard follower acknowledged is
    // in that offset: only unheard followers hold it. Any other target (a member) detaches while a
    // heard follower with its link up may keep the old primary's guard met: it holds, as online.
    invariant: [1],
    primaryStale: false,
    test: (v) =>
      heldByOldPrimaryReport(v, ({ old, oldId, best, lineage }) => {
        const followers =
          unfencedOldPrimary(v, best, lineage) !== undefined
            ? unheardFollowers(v, oldId, old, best.node_id)
            : linkedFollowers(v, oldId, old, best.node_id);
        return followers.length === 0 ? undefined : followerUnheardReason(followers, oldId, v.now);
      }),
  },
  {
    name: "member_linked_offline",
    code: "awaiting_reports",
    // As member_linked, against the old primary the stored lineage names: a member still linked to
    // it, which takes writes, acknowledges past its last report. A deposing promotion catches up with
    // the fenced old primary's final offset, which holds them: not held.
    invariant: [1],
    primaryStale: false,
    test: (v) =>
      heldByOldPrimaryReport(v, ({ oldId }) => {
        const linked = offlineLinkedMembers(v);
        return linked.length === 0 ? undefined : memberLinkedReason(linked, oldId);
      }),
    awaiting: (v) => offlineLinkedMembers(v).map((node) => node.node_id),
  },
  {
    name: "priority_zero_ahead_offline",
    code: "offline_no_candidate",
    // As priority_zero_ahead: bringing the shard back on a node behind it would drop what it acknowledged.
    invariant: [1],
    primaryStale: false,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const { best, lineage } = v.target;
      const ahead = v.snapshot.nodes.filter(
        (node) =>
          node.priority === 0 &&
          isAlive(node, v.config, v.now) &&
          node.repl_id === lineage.repl_id &&
          node.last_txn_id > best.last_txn_id,
      );
      if (ahead.length === 0) return undefined;
      return (
        `shard offline; not bringing it back on ${best.node_id} (last_txn_id ${best.last_txn_id}) while ${describePriorityZero(ahead, v.topology)} holds more and may have acknowledged writes it lacks; priority 0 is never promoted: ` +
        `waiting for a node with as much, or for an operator to ${priorityZeroRemedy(ahead, v.topology)}`
      );
    },
  },
  {
    name: "replica_down_ahead_offline",
    code: "waiting_for_replica",
    // As replica_down_ahead, against the old primary the stored lineage names, for a replica whose
    // database came back behind its last answer (restarted_behind) holding less than it answered,
    // the target itself included: what it acknowledged past the target may be on that old primary
    // alone (nemesis seed 6803).
    invariant: [1],
    primaryStale: false,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const { best, lineage } = v.target;
      const oldId = lineage.node_id;
      const replacing: Replacing = {
        ...v,
        primaryId: oldId,
        primary: v.snapshot.nodes.find((node) => node.node_id === oldId),
        members: undefined,
        returning: oldId === undefined ? "the old primary" : `the old primary ${oldId}`,
      };
      const tail = restartedBehindRule(replacing, best, lineage);
      return tail === undefined
        ? undefined
        : `shard offline; not bringing it back on ${best.node_id} (last_txn_id ${best.last_txn_id}) while ${tail}`;
    },
  },
  {
    name: "hung_holder",
    code: "offline_no_candidate",
    // The last resort is a snapshot that may be seconds old; a hung node of the lineage may hold more.
    invariant: [1],
    primaryStale: false,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const { best } = v.target;
      const hung = hungHolders(v, best, v.target.lineage);
      if (hung.length === 0) return undefined;
      return (
        `shard offline; the last resort ${best.node_id} (its RDB, up to ${best.last_txn_id}) waits while ${hung
          .map((node) => `${node.node_id} (up to ${node.last_txn_id})`)
          .sort()
          .join(
            ", ",
          )} does not answer but did not die (hung, its agent last reported): it may return with more; ` +
        "or an operator runs shardguard recover"
      );
    },
  },
  {
    name: "lock_held_offline",
    code: "locked",
    invariant: [4],
    primaryStale: false,
    test: (v) =>
      v.locked && v.target !== undefined
        ? `shard offline and ${v.target.best.node_id} is eligible, but another controller holds the lock`
        : undefined,
  },
];

/**
 * The members linked to the old primary the stored lineage names that hold a member's bring-online
 * (gate \`member_linked_offline\`): none for a deposing promotion, or when the refusing-primary proof
 * shows the target holds everything.
 */
function offlineLinkedMembers(v: OfflineView): Heartbeat[] {
  if (v.target === undefined) return [];
  const { best, lineage } = v.target;
  const oldId = lineage.node_id;
  if (oldId === undefined || unfencedOldPrimary(v, best, lineage) !== undefined) return [];
  const linked = linkedMembers(v, oldId, best.node_id);
  if (linked.length === 0 || candidateHoldsRefusingPrimary(v, oldId, best) !== undefined) return [];
  return linked;
}

/** An offline shard: the first gate that fires, else bring it online on the best candidate. */
export function decideOffline(view: ShardView, topology: Topology): Decision {
  const v = offlineView(view, topology);
  const stopped = firstGate(OFFLINE_GATES, v);
  if (stopped !== undefined) return stopped;
  // Gate no_eligible_node lets no shard without a target through.
  if (v.target === undefined) throw new ShardguardError("offline shard without a target passed every gate");
  const { best, lineage } = v.target;
  const old = unfencedOldPrimary(v, best, lineage);
  const reason = `shard offline and ${best.node_id} returned eligible (priority ${best.priority}, last_txn_id ${best.last_txn_id}); promoting it`;
  return {
    kind: "bring_online",
    epoch: topology.epoch,
    target: refOf(best),
    candidates: v.candidates,
    lineage,
    // Gate unfenced_old_primary let it through only when the target can fence the old primary first.
    ...(old === undefined
      ? { reason }
      : {
          depose: { node_id: old.node_id, node_address: old.node_address },
          reason:
            `${reason}, deposing ${old.node_id} first: ${best.node_id} is outside its replica set and its agent is not heard ` +
            `(${describeHeartbeatAge(old, v.now, "ago")}), but ${best.node_id} replicates from it and reached it ` +
            `(probe ${deposer(v, best, old)?.primary_probe}): it fences ${old.node_id}, catches up with its final offset, then detaches`,
        }),
  };
}
