import type { FailoverConfig } from "../config.ts";
import { holdsThroughLinks, type LineageLink, reportedPointOf } from "../identity.ts";
import type { Heartbeat, Lineage } from "../model.ts";
import type { ShardSnapshot } from "../ports.ts";
import { freshVoters } from "./view.ts";

/** The evidence about an online shard's primary: what its replicas and its own agent say. */

/** How many `down` reports the quorum mode needs out of `voters` fresh replicas. */
export function quorumNeeded(mode: FailoverConfig["quorum"], voters: number): number {
  switch (mode) {
    case "none":
      return 0;
    case "majority":
      return Math.floor(voters / 2) + 1;
    case "all":
      return voters;
  }
}

/**
 * The lineage of a primary whose heartbeat item is gone: the one `repl_id` that all the nodes
 * still naming it as their primary agree on; unknown when they disagree or none exists.
 */
export function inferLineage(
  nodes: readonly Heartbeat[],
  primaryId: string | undefined,
): Lineage | undefined {
  const followers = nodes.filter((node) => primaryId !== undefined && node.primary_node_id === primaryId);
  const replIds = new Set(followers.map((node) => node.repl_id));
  const [replId] = replIds;
  if (replIds.size !== 1 || !replId) return undefined;
  return {
    node_id: primaryId,
    repl_id: replId,
    last_txn_id: Math.max(...followers.map((node) => node.last_txn_id)),
  };
}

/**
 * A strict majority of the fresh replicas (database up) report the primary `restarted` and agree
 * on one lineage that is not the primary's: the reason, and that lineage (the highest offset any
 * of them holds). Undefined otherwise, and for a primary that answers on the lineage the shard's
 * history recorded at its promotion (`links`' last `by`): a process that restarted, empty or from
 * its RDB, answers with a new replication id (Redis 7), so this one is the process promoted, its
 * data intact. A replica that never replicated from it (parked before its link came up, on a
 * lineage of its own) finds only that it does not hold the replica's data: simulator seed 7039,
 * where a stale replica's vote made the live primary's lineage "foreign" and promoted the stale one.
 */
export function restartedPrimary(
  snapshot: ShardSnapshot,
  primary: Heartbeat,
  config: FailoverConfig,
  now: number,
  links: readonly LineageLink[] = [],
): { reason: string; lineage: Lineage } | undefined {
  if (primary.role === "primary" && primary.repl_id !== "" && primary.repl_id === links.at(-1)?.by)
    return undefined;
  const voters = freshVoters(snapshot, primary.node_id, config, now);
  // A replica whose data the primary holds all of (through either one's earlier lineage: a node
  // restarted from its RDB, or promoted; or through the shard's recorded lineage history, as the
  // replica's own probe judges a primary: `holdsThroughLinks`) has no evidence that the primary
  // lost anything. Simulator seed 7094: primary n3, back from its RDB on the lineage of its
  // promotion as a replica (its config's `replicaof`), holding every write; n1, the one fresh
  // voter, back from an older RDB of an earlier lineage of that history, found it "restarted";
  // its lineage became the shard's and the shard was brought back on n1 (1,023 lost).
  const restarted = voters.filter(
    (node) =>
      node.primary_probe === "restarted" &&
      node.repl_id !== undefined &&
      node.repl_id !== primary.repl_id &&
      !holdsThroughLinks(reportedPointOf(primary), reportedPointOf(node), links),
  );
  const replIds = new Set(restarted.map((node) => node.repl_id));
  const [replId] = replIds;
  if (restarted.length * 2 <= voters.length || replIds.size !== 1 || !replId) return undefined;
  return {
    reason: `${restarted
      .map((node) => node.node_id)
      .sort()
      .join(", ")} of ${voters.length} fresh replicas report it restarted on another lineage than theirs`,
    lineage: {
      node_id: primary.node_id,
      repl_id: replId,
      last_txn_id: Math.max(...restarted.map((node) => node.last_txn_id)),
    },
  };
}
