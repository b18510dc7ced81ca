import type { FailoverConfig } from "../config.ts";
import { confirmedCrash } from "../crash.ts";
import type { Candidate, CrashReport, Heartbeat, Lineage, Topology } from "../model.ts";
import { pickCandidates } from "./pick-candidate.ts";
import { inferLineage, quorumNeeded, restartedPrimary } from "./primary.ts";
import type { Replacing } from "./replacing.ts";
import {
  awaitingReports,
  describeHeartbeatAge,
  freshVoters,
  guardMembers,
  isFresh,
  lineageOf,
  type ShardView,
} from "./view.ts";

/**
 * An online shard's view: the shard's view plus the primary's evidence (its state as one value,
 * the voters, the candidates), and the node selections the online gates test (decide/online.ts).
 */

/** The primary's state as one value. */
export type PrimaryState = "healthy" | "stale" | "crashed" | "restarted" | "demoted" | "missing";

/** An online shard as its gates see it: the shard's view plus the primary's evidence. */
export interface OnlineView extends Replacing {
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
  const deadPrimary = primary === undefined ? undefined : confirmedCrash(primary, config, now);
  const crash = fresh ? deadPrimary : undefined;
  // A fresh primary that its replicas find back as another process, not continuing their lineage,
  // restarted without its data; its own agent did not tell (it lost its state dir too).
  const restarted =
    primary !== undefined && fresh && crash === undefined
      ? restartedPrimary(snapshot, primary, config, now, topology.ancestry)
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
        : demotedMs !== undefined || primary.role === "replica"
          ? // Its last report a replica's, fresh or not, its database up or not: its own repl_id is
            // the new process's, maybe empty (nemesis seed 6302: a primary restarted empty as a
            // replica, then cut off from the store; its stale report's lineage became the shard's and
            // every copy was wiped), maybe from an RDB behind the replicas (simulator seed 193077:
            // back from its RDB as a replica, then hung; its new id became the shard's, the replicas
            // holding 128 writes more were foreign and the shard came back on it). Guarantee 1.
            demotedLineage(snapshot.nodes, primary, topology)
          : lineageOf(primary);
  // A primary whose own agent confirms its process dead has nothing left to fence: the replica-set
  // rule would only stand between the shard and the replica holding the most.
  const members = deadPrimary === undefined ? guardMembers(snapshot, primaryId) : undefined;
  const candidates = pickCandidates(snapshot.nodes, lineage, config, now, {
    exclude: primaryId,
    members,
    links: topology.ancestry,
  });
  const best = candidates[0];
  const voters = freshVoters(snapshot, primaryId, config, now);
  // A replica votes the primary down when its link is down, or its own probe got no answer, found
  // it restarted without its data, or found it refusing every write. On the crash fast path only
  // the link counts, from every fresh replica: only offsets read after the link dropped are final.
  // A demoted primary that follows, through replicas only, a node that follows it back: a
  // replication cycle (its step-down to a failover's target that was never promoted, while the
  // target followed it). Redis 7 keeps such links up (no PSYNC refused, no repl-timeout: nobody
  // sends), so no replica sees its link down and its probe finds the primary answering: a replica
  // whose link leads into the cycle is fed by no writer (simulator seed 221327).
  const cycle =
    demotedMs !== undefined && primaryId !== undefined
      ? replicationCycle(snapshot.nodes, primaryId, config, now)
      : undefined;
  // The same holds for a demoted primary whose own link is down: it hears no writer, so a replica
  // linked to it is fed by none, its link up all the same (simulator seed 110597: a failover
  // deposed the old primary to its target and was abandoned before PROMOTE; the topology named the
  // old primary again, a replica of a replica with its link down, and the replica linked to it kept
  // the quorum from being met: 60 s without a writable primary to the end). Guarantee 3.
  const unfed = demotedMs !== undefined && primary?.primary_link !== "up" ? primaryId : undefined;
  const fedByNoWriter = (node: Heartbeat): boolean =>
    node.primary_link === "up" &&
    node.primary_node_id !== undefined &&
    (cycle?.has(node.primary_node_id) === true || node.primary_node_id === unfed);
  const downVoters = voters.filter((node) =>
    crash !== undefined
      ? node.primary_link === "down"
      : node.primary_link === "down" ||
        (node.primary_probe !== undefined && node.primary_probe !== "ok") ||
        fedByNoWriter(node),
  );
  const needed =
    crash !== undefined ? Math.max(1, voters.length) : quorumNeeded(config.quorum, voters.length);
  const quorumText =
    voters.length === 0
      ? "no fresh replica to ask"
      : `${downVoters.length} of ${voters.length} fresh replicas report the primary down (${[...downVoters]
          .sort((a, b) => a.node_id.localeCompare(b.node_id))
          .map(
            (node) =>
              `${node.node_id}: ${
                node.primary_link === "down"
                  ? "link down"
                  : node.primary_probe !== undefined && node.primary_probe !== "ok"
                    ? node.primary_probe
                    : cycle?.has(node.primary_node_id ?? "") === true
                      ? `follows ${node.primary_node_id}, in a replication cycle`
                      : `follows ${node.primary_node_id}, a replica hearing no primary`
              }`,
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
    returning: "the primary",
  };
}

/**
 * The lineage a demoted primary's replacement must hold: the one its followers agree on (its own
 * \`repl_id\` is a new one when it restarted empty), up to the highest offset of it known, its own
 * included when it kept the lineage (an operator's REPLICAOF, a restart from its RDB).
 * Followers on a lineage the shard's history left for a later one (\`continuedLater\`) do not count.
 */
function demotedLineage(nodes: readonly Heartbeat[], primary: Heartbeat, topology: Topology): Lineage {
  const inferred = inferLineage(nodes, primary.node_id);
  // The followers' lineage counts unless the history shows it continued later or never synced.
  const trusted =
    inferred !== undefined &&
    !continuedLater(inferred.repl_id, topology) &&
    !offTip(inferred.repl_id, primary, topology)
      ? inferred
      : undefined;
  const followed = trusted ?? topology.lineage ?? historyTip(nodes, primary, topology);
  if (followed === undefined || followed.repl_id !== primary.repl_id) return followed ?? lineageOf(primary);
  return {
    ...followed,
    node_id: primary.node_id,
    last_txn_id: Math.max(followed.last_txn_id, primary.last_txn_id),
  };
}

/**
 * The shard's history continued \`replId\` into a later lineage (a link leaves it) and it is not the
 * newest one: followers on it hold an ancestor of what the demoted primary served, not its lineage.
 * A deposed primary whose agent was dead through later promotions steps down to follow the
 * topology's primary; that one, a replica with its link down, refuses its sync (Redis:
 * NOMASTERLINK), so it keeps its old lineage, maybe past the point the history left it. Nemesis seed
 * 6808: node-212r, primary two promotions before, was node-2's one follower; its lineage became the
 * shard's, node-253r, the member holding every write of node-2's (it had full-synced from it),
 * counted only up to that point, and gate outside_set_ahead held on node-212r for ever.
 */
function continuedLater(replId: string, topology: Topology): boolean {
  const links = topology.ancestry ?? [];
  return links.at(-1)?.by !== replId && links.some((link) => link.repl_id === replId);
}

/**
 * The demoted primary still answers on the lineage the shard's history recorded at its promotion
 * (the last link's \`by\`: a restart from its RDB as a replica keeps it) and its followers agree on
 * another one: they never synced from it (Redis refuses a PSYNC from a replica whose own link is
 * down, NOMASTERLINK), so theirs is their own process's, not the primary's. Simulator seed 7064:
 * n1, back from an RDB 85 KB behind with a new id, stepped down to n2, a replica back from its RDB
 * on the tip and parked; n1's new id became the shard's, n3 (parked on the tip, every write) was
 * "foreign", and the shard came back on n1: 1,786 writes lost.
 */
function offTip(replId: string, primary: Heartbeat, topology: Topology): boolean {
  const tip = topology.ancestry?.at(-1)?.by;
  return tip !== undefined && primary.repl_id === tip && replId !== tip;
}

/**
 * With no follower to ask and no stored lineage: the newest lineage of the shard's history (the
 * last link's, \`topology.ancestry\`), the one the demoted primary served since its promotion, up
 * to the highest offset any node reports on it. Its own \`repl_id\` is a new process's (simulator
 * seed 7008: a primary restarted from an older RDB as a replica of a restarted node was judged by
 * that node's new lineage, and the one replica holding the writes was passed over as foreign).
 */
function historyTip(
  nodes: readonly Heartbeat[],
  primary: Heartbeat,
  topology: Topology,
): Lineage | undefined {
  const tip = topology.ancestry?.at(-1);
  if (tip === undefined) return undefined;
  const offsets = nodes.filter((node) => node.repl_id === tip.by).map((node) => node.last_txn_id);
  return { node_id: primary.node_id, repl_id: tip.by, last_txn_id: Math.max(tip.until, ...offsets) };
}

/**
 * The nodes of the replication cycle \`primaryId\` is in, or undefined: from it, each fresh
 * replica's \`primary_node_id\` (its link up) leads back to it without reaching a node that
 * answers as a primary. No node of the cycle takes writes, nor feeds its replicas any.
 */
export function replicationCycle(
  nodes: readonly Heartbeat[],
  primaryId: string,
  config: FailoverConfig,
  now: number,
): ReadonlySet<string> | undefined {
  const byId = new Map(nodes.map((node) => [node.node_id, node]));
  const path = new Set<string>();
  let at: string | undefined = primaryId;
  while (at !== undefined && !path.has(at)) {
    const node = byId.get(at);
    if (
      node === undefined ||
      node.role !== "replica" ||
      node.db_status !== "up" ||
      node.primary_link !== "up" ||
      !isFresh(node, config, now)
    )
      return undefined;
    path.add(at);
    at = node.primary_node_id;
  }
  return at === primaryId ? path : undefined;
}

/** The primary's heartbeat is stale or missing (a crashed or restarted primary is still fresh). */
export function isPrimaryStale(v: OnlineView): boolean {
  return v.primaryState === "stale" || v.primaryState === "missing";
}

export function quorumMet(v: OnlineView): boolean {
  if (v.voters.length === 0 && v.crash === undefined)
    return v.config.quorum === "none" || v.target === undefined;
  return v.downVoters.length >= v.needed;
}
