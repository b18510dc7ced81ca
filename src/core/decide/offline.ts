import { canDepose } from "../depose.ts";
import { ShardguardError } from "../errors.ts";
import type { Candidate, Heartbeat, Lineage, Topology } from "../model.ts";
import type { Decision } from "./decision.ts";
import { refOf } from "./decision.ts";
import {
  awaitingReason,
  cooldownReason,
  firstGate,
  followerUnheardReason,
  type Gate,
  HUNG_HOLDER_GRACE,
  LAST_COPY_GRACE,
  memberUnheardReason,
  outsiderUnheardReason,
  quietIds,
  unheardFollowers,
  unheardMembers,
  unheardOutsiders,
} from "./gate.ts";
import { describeCandidates, pickCandidates } from "./pick-candidate.ts";
import {
  agentAgeMs,
  awaitingReports,
  describeHeartbeatAge,
  guardMembers,
  isAgentHeard,
  isAlive,
  type ShardView,
} from "./view.ts";

/**
 * Every node of the snapshot, the old primary the lineage names among them, is alive and its agent
 * heard: none is hung or cut off with writes the snapshot lacks, which is what the last resort's
 * grace waits for. Its writes past a restart from its RDB died with the old process, and a replica
 * that held more either still does (it ranks on the lineage itself) or resynced from the restarted
 * process already. Simulator seeds 45033 and 44216: a primary restarted from its RDB while its
 * agent had yet to report the restart took the shard offline, and every node heard with its
 * database up waited the whole grace (111 s and 124 s without a writable primary).
 */
function everyNodeAnswers(view: ShardView, lineage: Lineage | undefined): boolean {
  const { snapshot, config, now } = view;
  return (
    lineage?.node_id !== undefined &&
    snapshot.nodes.some((node) => node.node_id === lineage.node_id) &&
    snapshot.nodes.every((node) => isAlive(node, config, now) && isAgentHeard(node, config, now))
  );
}

/** An offline shard as its gates see it. */
export interface OfflineView extends ShardView {
  readonly topology: Topology;
  /**
   * The lineage stored when the shard went offline: a node that returns with another one (an
   * empty restart, a foreign dataset) must never be promoted.
   */
  readonly lineage: Lineage | undefined;
  readonly quiet: readonly Heartbeat[];
  readonly offlineMs: number;
  /**
   * Offline for LAST_COPY_GRACE failure timeouts, or every node answers (\`everyNodeAnswers\`): a node
   * holding the lineage only as its earlier one counts.
   */
  readonly lastResort: boolean;
  readonly candidates: readonly Candidate[];
  /** The candidate to bring online, with the lineage; undefined when none is eligible. */
  readonly target: { readonly best: Candidate; readonly lineage: Lineage } | undefined;
}

export function offlineView(view: ShardView, topology: Topology): OfflineView {
  const { snapshot, config, now } = view;
  const lineage = topology.lineage;
  const offlineMs = now - topology.updated_at;
  const lastResort =
    offlineMs >= LAST_COPY_GRACE * config.failureTimeoutMs || everyNodeAnswers(view, lineage);
  const candidates = pickCandidates(snapshot.nodes, lineage, config, now, { acceptPrior: lastResort });
  const best = candidates[0];
  return {
    ...view,
    topology,
    lineage,
    quiet: awaitingReports(snapshot, config, now),
    offlineMs,
    lastResort,
    candidates,
    target: best?.eligible === true && lineage !== undefined ? { best, lineage } : undefined,
  };
}

/** Seconds until the last-resort grace (LAST_COPY_GRACE failure timeouts offline) is over. */
function lastResortInS(v: OfflineView): number {
  return Math.ceil((LAST_COPY_GRACE * v.config.failureTimeoutMs - v.offlineMs) / 1000);
}

/** Before the grace: the node that holds the lineage as its earlier one, promoted if nobody with more returns. */
function lastResortWaiting(v: OfflineView): string {
  const waiting =
    !v.lastResort && v.lineage !== undefined
      ? pickCandidates(v.snapshot.nodes, v.lineage, v.config, v.now, { acceptPrior: true }).find(
          (candidate) => candidate.eligible,
        )
      : undefined;
  if (waiting === undefined) return "";
  const grace = lastResortInS(v);
  return `; ${waiting.node_id} holds the lineage up to ${waiting.last_txn_id} as its earlier one (restarted from its RDB): the last resort, promoted if no node with more returns within ${grace} s`;
}

/**
 * The old primary \`oldId\`, when its agent is not heard, it reported no crash, and \`nodeId\` is
 * outside its guarded set: its database may still take writes unfenced (nobody read it the offline
 * topology), and making \`nodeId\` primary would not detach a replica its write guard counts.
 * Shared by the gate \`unfenced_old_primary\` and \`shardguard recover\` (gate \`recover_unfenced_old_primary\`).
 */
export function unfencedOldPrimaryOf(
  view: ShardView,
  oldId: string | undefined,
  nodeId: string,
): Heartbeat | undefined {
  const old = oldId === undefined ? undefined : view.snapshot.nodes.find((node) => node.node_id === oldId);
  const oldMembers = oldId === undefined ? undefined : guardMembers(view.snapshot, oldId);
  return old !== undefined &&
    nodeId !== old.node_id &&
    !isAgentHeard(old, view.config, view.now) &&
    old.db_crash === undefined &&
    oldMembers !== undefined &&
    !oldMembers.includes(nodeId)
    ? old
    : undefined;
}

function unfencedOldPrimary(v: OfflineView, best: Candidate, lineage: Lineage): Heartbeat | undefined {
  return unfencedOldPrimaryOf(v, lineage.node_id, best.node_id);
}

/** Past the grace, with only the last resort eligible: nodes of the lineage with more that hang, not died. */
function hungHolders(v: OfflineView, best: Candidate, lineage: Lineage): Heartbeat[] {
  if (!v.lastResort || pickCandidates(v.snapshot.nodes, lineage, v.config, v.now).some((c) => c.eligible)) {
    return [];
  }
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== best.node_id &&
      node.db_status === "down" &&
      node.db_crash === undefined &&
      agentAgeMs(node, v.now) <= HUNG_HOLDER_GRACE * v.config.failureTimeoutMs &&
      node.repl_id === lineage.repl_id &&
      node.last_txn_id > best.last_txn_id,
  );
}

/**
 * Before the grace, live nodes other than the target that continue the lineage under another
 * replication id (its \`prior_lineage\`: a Redis 7 primary restarted from its RDB takes a new id and
 * keeps the old one as \`replid2\`, and its replicas adopt it) further than the target holds: they
 * are ranked by what they hold only as the last resort, so until then the target would drop
 * what they acknowledged.
 */
function priorHoldersAhead(v: OfflineView, best: Candidate, lineage: Lineage): Heartbeat[] {
  if (v.lastResort) return [];
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== best.node_id &&
      isAlive(node, v.config, v.now) &&
      node.repl_id !== lineage.repl_id &&
      node.prior_lineage?.repl_id === lineage.repl_id &&
      node.prior_lineage.last_txn_id > best.last_txn_id,
  );
}

/**
 * A rule judged against the last report of the old primary the stored lineage names: why the shard
 * is not brought back on the target, or undefined. The old primary itself, back on its own run,
 * holds everything its replicas acknowledged and is never held by such a rule.
 */
function heldByOldPrimaryReport(
  v: OfflineView,
  rule: (at: { best: Candidate; oldId: string; old: Heartbeat | undefined }) => string | undefined,
): string | undefined {
  if (v.target === undefined) return undefined;
  const { best, lineage } = v.target;
  const oldId = lineage.node_id;
  if (oldId === undefined) return undefined;
  if (best.node_id === oldId && ownRun(v, best.node_id, lineage)) return undefined;
  const reason = rule({ best, oldId, old: v.snapshot.nodes.find((node) => node.node_id === oldId) });
  return reason === undefined
    ? undefined
    : `shard offline; not bringing it back on ${best.node_id} (last_txn_id ${best.last_txn_id}) while ${reason}`;
}

/**
 * The node's database is up on the lineage's own replication run, still its primary: not a restart
 * from its RDB. Redis 7 gives a primary restarted from its RDB a new replication id, but one
 * restarted as a replica (a \`redis.conf\` with \`replicaof\`) keeps the RDB's, at the RDB's older
 * offset: its role tells it apart (nemesis seed 4202: node-2, back
 * from its RDB as a replica of node-3, was taken for its own run and brought back while node-3,
 * holding 236 writes node-2 had lost, was unheard).
 */
function ownRun(v: OfflineView, nodeId: string, lineage: Lineage): boolean {
  const node = v.snapshot.nodes.find((n) => n.node_id === nodeId);
  return (
    node !== undefined &&
    node.db_status === "up" &&
    node.role === "primary" &&
    node.repl_id === lineage.repl_id
  );
}

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
    // As follower_unheard, against the last report of the old primary the stored lineage names.
    invariant: [1],
    primaryStale: false,
    test: (v) =>
      heldByOldPrimaryReport(v, ({ old, oldId, best }) => {
        const followers = unheardFollowers(v, oldId, old, best.node_id);
        return followers.length === 0 ? undefined : followerUnheardReason(followers, oldId, v.now);
      }),
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
        `shard offline; not bringing it back on ${best.node_id} (last_txn_id ${best.last_txn_id}) while ${ahead
          .map((node) => `${node.node_id} (priority 0, last_txn_id ${node.last_txn_id})`)
          .sort()
          .join(", ")} holds more and may have acknowledged writes it lacks; priority 0 is never promoted: ` +
        "waiting for a node with as much, or for an operator to give that node a priority (restart its agent with --priority)"
      );
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

/** The target's heartbeat when it can depose \`old\` (src/core/depose.ts \`canDepose\`). */
function deposer(v: OfflineView, best: Candidate, old: Heartbeat): Heartbeat | undefined {
  const node = v.snapshot.nodes.find((candidate) => candidate.node_id === best.node_id);
  return node !== undefined && canDepose(node, old, v.config, v.now) ? node : undefined;
}
