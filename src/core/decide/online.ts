import { confirmedCrash } from "../crash.ts";
import type { Candidate, CrashReport, Heartbeat, Lineage, Topology } from "../model.ts";
import type { Decision } from "./decision.ts";
import { refOf } from "./decision.ts";
import {
  awaitingReason,
  cooldownReason,
  firstGate,
  type Gate,
  JUST_HEARD_GRACE,
  memberUnheardReason,
  OUTSIDE_SET_GRACE,
  quietIds,
  REPLICA_AHEAD_GRACE,
  unheardMembers,
} from "./gate.ts";
import { describeCandidates, pickCandidates } from "./pick-candidate.ts";
import { inferLineage, quorumNeeded, restartedPrimary } from "./primary.ts";
import {
  awaitingReports,
  describeHeartbeatAge,
  freshVoters,
  guardMembers,
  heartbeatAgeMs,
  isAgentHeard,
  isAlive,
  isFresh,
  lineageOf,
  MAX_CLOCK_SKEW_MS,
  type ShardView,
} from "./view.ts";

/** The primary's state as one value. */
export type PrimaryState = "healthy" | "stale" | "crashed" | "restarted" | "demoted" | "missing";

/** An online shard as its gates see it: the shard's view plus the primary's evidence. */
export interface OnlineView extends ShardView {
  readonly topology: Topology;
  readonly primaryId: string | undefined;
  readonly primary: Heartbeat | undefined;
  readonly primaryState: PrimaryState;
  /** The primary's own agent's confirmed report that its process died, fresh primary or not. */
  readonly deadPrimary: CrashReport | undefined;
  /** `deadPrimary` of a fresh primary: the crash fast path. */
  readonly crash: CrashReport | undefined;
  /** Why the primary counts as failed (meaningless while it is healthy). */
  readonly staleness: string;
  /**
   * ms the fresh primary's database has answered as a replica (\`demoted\`): it takes no writes. Until
   * it has for the failure timeout, a PROMOTE in flight or a repair may still make it primary.
   */
  readonly demotedMs: number | undefined;
  /** Nodes other than the primary that are quiet within their keepalive. */
  readonly quiet: readonly Heartbeat[];
  readonly lineage: Lineage | undefined;
  /** The old primary's guarded replica set, unless its agent confirms its process dead. */
  readonly members: readonly string[] | undefined;
  readonly candidates: readonly Candidate[];
  /** The candidate to promote, with the lineage it is judged against; undefined when none is eligible. */
  readonly target: { readonly best: Candidate; readonly lineage: Lineage } | undefined;
  readonly voters: readonly Heartbeat[];
  readonly downVoters: readonly Heartbeat[];
  /** `down` reports the quorum needs (on the crash fast path: every fresh replica, at least one). */
  readonly needed: number;
  readonly quorumText: string;
}

export function onlineView(view: ShardView, topology: Topology): OnlineView {
  const { snapshot, config, now } = view;
  const primaryId = topology.primary_node_id;
  const primary = snapshot.nodes.find((node) => node.node_id === primaryId);
  const fresh = primary !== undefined && isFresh(primary, config, now);
  const deadPrimary =
    primary === undefined ? undefined : confirmedCrash(primary, config, now, MAX_CLOCK_SKEW_MS);
  const crash = fresh ? deadPrimary : undefined;
  // A fresh primary that its replicas find back as another process, not continuing their lineage,
  // restarted without its data; its own agent did not tell (it lost its state dir too).
  const restarted =
    primary !== undefined && fresh && crash === undefined
      ? restartedPrimary(snapshot, primary, config, now)
      : undefined;
  const demotedMs =
    primary !== undefined && fresh && primary.db_status === "up" && primary.role === "replica"
      ? now - (primary.role_since !== undefined ? primary.role_since / 1000 : topology.updated_at)
      : undefined;
  const primaryState: PrimaryState =
    primary === undefined
      ? "missing"
      : restarted !== undefined
        ? "restarted"
        : crash !== undefined
          ? "crashed"
          : demotedMs !== undefined
            ? "demoted"
            : fresh
              ? "healthy"
              : "stale";
  const staleness =
    primary === undefined
      ? `primary ${primaryId ?? "(none)"} has no heartbeat`
      : restarted !== undefined
        ? `primary ${primary.node_id} is back as a new process without its data (${restarted.reason})`
        : crash !== undefined
          ? `primary ${primary.node_id}'s agent saw its database die (${crash.state}, process ${crash.run_id || "unknown"},` +
            ` confirmed over ${Math.round((crash.last_seen - crash.first_seen) / 1000)} ms)`
          : demotedMs !== undefined
            ? `primary ${primary.node_id}'s database is a replica (of ${primary.primary_node_id ?? "an unknown node"}, link ${
                primary.primary_link ?? "unknown"
              }) for ${Math.round(demotedMs)} ms: it takes no writes`
            : `primary ${primary.node_id} is stale (database last answered ${describeHeartbeatAge(primary, now, "ago")}` +
              `${primary.db_status === "down" ? ", its agent reports the database down" : ""})`;
  const lineage =
    restarted !== undefined
      ? restarted.lineage
      : primary === undefined
        ? (topology.lineage ?? inferLineage(snapshot.nodes, primaryId))
        : demotedMs !== undefined
          ? demotedLineage(snapshot.nodes, primary, topology)
          : lineageOf(primary);
  // A primary whose own agent confirms its process dead has nothing left to fence: the replica-set
  // rule would only stand between the shard and the replica holding the most.
  const members = deadPrimary === undefined ? guardMembers(snapshot, primaryId) : undefined;
  const candidates = pickCandidates(snapshot.nodes, lineage, config, now, { exclude: primaryId, members });
  const best = candidates[0];
  const voters = freshVoters(snapshot, primaryId, config, now);
  // A replica votes the primary down when its link is down, or its own probe got no answer, found
  // it restarted without its data, or found it refusing every write. On the crash fast path only
  // the link counts, from every fresh replica: only offsets read after the link dropped are final.
  const downVoters = voters.filter((node) =>
    crash !== undefined
      ? node.primary_link === "down"
      : node.primary_link === "down" || (node.primary_probe !== undefined && node.primary_probe !== "ok"),
  );
  const needed =
    crash !== undefined ? Math.max(1, voters.length) : quorumNeeded(config.quorum, voters.length);
  const quorumText =
    voters.length === 0
      ? "no fresh replica to ask"
      : `${downVoters.length} of ${voters.length} fresh replicas report the primary down (${[...downVoters]
          .sort((a, b) => a.node_id.localeCompare(b.node_id))
          .map(
            (node) => `${node.node_id}: ${node.primary_link === "down" ? "link down" : node.primary_probe}`,
          )
          .join(", ")})`;
  return {
    ...view,
    topology,
    primaryId,
    primary,
    primaryState,
    deadPrimary,
    crash,
    staleness,
    demotedMs,
    quiet: awaitingReports(snapshot, config, now, primaryId),
    lineage,
    members,
    candidates,
    target: best?.eligible === true && lineage !== undefined ? { best, lineage } : undefined,
    voters,
    downVoters,
    needed,
    quorumText,
  };
}

/**
 * The lineage a demoted primary's replacement must hold: the one its followers agree on (its own
 * \`repl_id\` is a new one when it restarted empty), up to the highest offset of it known, its own
 * included when it kept the lineage (an operator's REPLICAOF, a restart from its RDB).
 */
function demotedLineage(nodes: readonly Heartbeat[], primary: Heartbeat, topology: Topology): Lineage {
  const followed = inferLineage(nodes, primary.node_id) ?? topology.lineage;
  if (followed === undefined || followed.repl_id !== primary.repl_id) return followed ?? lineageOf(primary);
  return {
    ...followed,
    node_id: primary.node_id,
    last_txn_id: Math.max(followed.last_txn_id, primary.last_txn_id),
  };
}

/** The primary's heartbeat is stale or missing (a crashed or restarted primary is still fresh). */
function isPrimaryStale(v: OnlineView): boolean {
  return v.primaryState === "stale" || v.primaryState === "missing";
}

/** Replicas whose agent was just heard with their database up, while no fresh replica can be asked. */
function justHeard(v: OnlineView): Heartbeat[] {
  if (v.voters.length !== 0 || v.crash !== undefined || v.config.quorum === "none") return [];
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== v.primaryId &&
      node.role === "replica" &&
      node.db_status === "up" &&
      isAgentHeard(node, v.config, v.now) &&
      heartbeatAgeMs(node, v.now) <= JUST_HEARD_GRACE * v.config.failureTimeoutMs,
  );
}

function quorumMet(v: OnlineView): boolean {
  if (v.voters.length === 0 && v.crash === undefined)
    return v.config.quorum === "none" || v.target === undefined;
  return v.downVoters.length >= v.needed;
}

/** Stale replicas of the lineage further ahead than the best candidate, stale only just now. */
function replicasAhead(v: OnlineView, best: Candidate, lineage: Lineage): Heartbeat[] {
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
function outsideAhead(v: OnlineView, best: Candidate, lineage: Lineage): Heartbeat[] {
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
function priorityZeroAhead(v: OnlineView, best: Candidate, lineage: Lineage): Heartbeat[] {
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== v.primaryId &&
      node.priority === 0 &&
      isAlive(node, v.config, v.now) &&
      node.repl_id === lineage.repl_id &&
      node.last_txn_id > best.last_txn_id,
  );
}

function notPromoting(v: OnlineView, best: Candidate): string {
  return `${v.staleness}, ${v.quorumText}; not promoting ${best.node_id} (last_txn_id ${best.last_txn_id}) while `;
}

/** The wait and refusal rules of an online shard, in order (docs/safety.md). */
export const ONLINE_GATES: readonly Gate<OnlineView>[] = [
  {
    name: "cooldown_online",
    code: "cooldown",
    invariant: [2],
    primaryStale: isPrimaryStale,
    test: (v) => cooldownReason(v, isPrimaryStale(v)),
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
    name: "replica_just_heard",
    code: "quorum_not_met",
    // A replica stale only by its own cycle's latency is alive: not a reason to mark the shard offline.
    invariant: [1, 3],
    primaryStale: true,
    test: (v) => {
      const answering = justHeard(v);
      if (answering.length === 0) return undefined;
      return `${v.staleness}; no fresh replica to ask, but the agents of ${answering
        .map((node) => node.node_id)
        .sort()
        .join(", ")} were just heard with their databases up (${answering
        .map((node) => describeHeartbeatAge(node, v.now))
        .join(", ")}); waiting for their next heartbeat`;
    },
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
    test: (v) => {
      if (v.target === undefined || v.primaryId === undefined) return undefined;
      const unheard = unheardMembers(v, v.primaryId, v.target.best.node_id);
      if (unheard.length === 0) return undefined;
      return `${notPromoting(v, v.target.best)}${memberUnheardReason(unheard, v.primaryId, v.now)}`;
    },
  },
  {
    name: "replica_ahead",
    code: "waiting_for_replica",
    invariant: [1],
    primaryStale: true,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const ahead = replicasAhead(v, v.target.best, v.target.lineage);
      if (ahead.length === 0) return undefined;
      return `${notPromoting(v, v.target.best)}${[...ahead]
        .sort((a, b) => a.node_id.localeCompare(b.node_id))
        .map(
          (node) =>
            `${node.node_id} (last_txn_id ${node.last_txn_id}, heartbeat ${describeHeartbeatAge(node, v.now, "old")})`,
        )
        .join(", ")}, further ahead, may still answer`;
    },
  },
  {
    name: "outside_set_ahead",
    code: "waiting_for_replica",
    // The replica ahead cannot be promoted (nothing would fence the old primary); the member lacks its writes.
    invariant: [1, 2],
    primaryStale: true,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const outside = outsideAhead(v, v.target.best, v.target.lineage);
      const primaryAgeMs =
        v.primary === undefined ? Number.POSITIVE_INFINITY : heartbeatAgeMs(v.primary, v.now);
      if (outside.length === 0 || primaryAgeMs > (1 + OUTSIDE_SET_GRACE) * v.config.failureTimeoutMs)
        return undefined;
      return `${notPromoting(v, v.target.best)}${outside
        .map((node) => `${node.node_id} (last_txn_id ${node.last_txn_id})`)
        .sort()
        .join(", ")}, outside ${v.primaryId}'s replica set, holds more: waiting up to ${
        OUTSIDE_SET_GRACE * v.config.failureTimeoutMs
      } ms past the failure timeout for ${v.primaryId} to return or its agent to confirm a crash`;
    },
  },
  {
    name: "priority_zero_ahead",
    code: "waiting_for_replica",
    // Priority 0 is the operator's "never promote"; passing it over would drop what it acknowledged.
    invariant: [1],
    primaryStale: true,
    test: (v) => {
      if (v.target === undefined) return undefined;
      const ahead = priorityZeroAhead(v, v.target.best, v.target.lineage);
      if (ahead.length === 0) return undefined;
      return (
        `${notPromoting(v, v.target.best)}${ahead
          .map((node) => `${node.node_id} (priority 0, last_txn_id ${node.last_txn_id})`)
          .sort()
          .join(", ")} holds more and may have acknowledged writes it lacks; priority 0 is never promoted: ` +
        "waiting for the primary to return, or for an operator to give that node a priority (restart its agent with --priority)"
      );
    },
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
  return {
    kind: "failover",
    epoch: topology.epoch,
    oldPrimary: v.primaryId ?? "",
    target: refOf(best),
    candidates: v.candidates,
    lineage,
    ...(v.crash !== undefined ? { crash: v.crash } : {}),
    reason: `${v.staleness}, ${v.quorumText}; promoting ${best.node_id} (priority ${best.priority}, last_txn_id ${best.last_txn_id})`,
  };
}
