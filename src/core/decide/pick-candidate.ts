import type { FailoverConfig } from "../config.ts";
import { heldThroughLinks, type LineageLink } from "../identity.ts";
import type { Candidate, Heartbeat, Lineage } from "../model.ts";
import { describeHeartbeatAge, isAgentHeard, isAlive, isFresh, isRestartedHolder } from "./view.ts";

/** How to judge the nodes for promotion. */
export interface RankOptions {
  /** The node being replaced (the old primary): never a candidate. */
  readonly exclude?: string;
  /** The old primary's guarded replica set: a node outside it would not fence the old primary. */
  readonly members?: readonly string[];
  /**
   * The last resort: a node that holds the lineage only as its earlier one (`prior_lineage`, a
   * database restarted from its RDB) counts by that, a restarted holder included.
   */
  readonly acceptPrior?: boolean;
  /**
   * The order: \`offset\` (a failover, a bring-online: priority only breaks ties at the highest
   * offset) or \`priority\` (a switchover: the target catches up to the old primary before
   * PROMOTE, so the preferred node loses nothing). Priority 0 is never eligible; a priority-0 node
   * holding more than the best candidate holds up a failover (gate \`priority_zero_ahead\`).
   * @default "offset"
   */
  readonly order?: "offset" | "priority";
  /**
   * The shard's lineage history (\`topology.ancestry\`): a node on a later lineage of its main line
   * holds the lineage by it (\`heldThroughLinks\`); with \`acceptPrior\`, a node on an earlier one too.
   */
  readonly links?: readonly LineageLink[];
}

/**
 * Judges each node (except `options.exclude`) for promotion and returns them in promotion order:
 * eligible first; then, by default, last_txn_id descending, priority ascending, node_id
 * ascending: priority only chooses among the nodes tied at the highest offset, which hold every
 * write any replica may have acknowledged (guarantee 1). With \`order: "priority"\` (a
 * switchover, which catches up first): priority ascending, then last_txn_id, then node_id.
 * The lag reference is the highest offset known in the lineage: the old primary's last report
 * or a same-lineage fresh node that received more after it.
 */
export function pickCandidates(
  nodes: readonly Heartbeat[],
  lineage: Lineage | undefined,
  config: FailoverConfig,
  now: number,
  options: RankOptions = {},
): Candidate[] {
  const { exclude, members, acceptPrior = false, order = "offset", links = [] } = options;
  const considered = nodes.filter((node) => node.node_id !== exclude);
  const knownLineage = lineage !== undefined && lineage.repl_id !== "";
  let reference = lineage?.last_txn_id ?? 0;
  for (const node of considered) {
    if (knownLineage && node.repl_id === lineage.repl_id && isFresh(node, config, now)) {
      reference = Math.max(reference, node.last_txn_id);
    }
    const held =
      knownLineage && isAlive(node, config, now) ? heldOffset(node, lineage, acceptPrior, links) : undefined;
    if (held !== undefined) reference = Math.max(reference, held);
  }
  const judged = considered.map((node): Candidate => {
    const held = knownLineage ? heldOffset(node, lineage, acceptPrior, links) : undefined;
    const base = {
      node_id: node.node_id,
      node_address: node.node_address,
      last_txn_id: held ?? node.last_txn_id,
      priority: node.priority,
    };
    const ineligible = (reason: string): Candidate => ({ ...base, eligible: false, reason });
    if (isRestartedHolder(node)) {
      // Its own database is down; only the last resort takes what it holds, while its agent is heard.
      if (!acceptPrior || !isAgentHeard(node, config, now)) return ineligible("database reported down");
    } else if (!isFresh(node, config, now)) {
      return ineligible(`heartbeat stale (${describeHeartbeatAge(node, now)})`);
    } else if (node.db_status === "down") {
      return ineligible("database reported down");
    }
    if (!knownLineage) return ineligible("the old primary's replication lineage is unknown");
    if (held === undefined) {
      return ineligible(
        `foreign replication lineage ${node.repl_id || "(none)"}, expected ${lineage.repl_id}`,
      );
    }
    if (node.priority === 0) return ineligible("priority 0 (never promote)");
    if (members !== undefined && !members.includes(node.node_id)) {
      // The old primary's write guard does not count this node: promoting it would not fence the old primary.
      return ineligible(
        `not in ${exclude ?? "the primary"}'s replica set (its write guard does not wait for it)`,
      );
    }
    // Measured on what it holds of the lineage (a node on another lineage may count more on its own).
    const lag = reference - held;
    if (lag > config.maxLagOnFailover) {
      return ineligible(`lag ${lag} exceeds maxLagOnFailover ${config.maxLagOnFailover}`);
    }
    return { ...base, eligible: true, reason: "eligible" };
  });
  return judged.sort(order === "priority" ? compareByPriority : compareByOffset);
}

/**
 * How far `node`'s data holds `lineage` (the offset in it), undefined when it holds none: a node
 * on it to its offset; one that continues it under another replication id (promoted, or a
 * primary restarted from its RDB) to its `prior_lineage` offset; a restarted holder only by that;
 * else through the shard's lineage history (\`heldThroughLinks\`). A node's earlier lineage is a
 * prefix of its own, so when both hold some of `lineage` it ranks by the larger: simulator seed
 * 7135, the last resort ranked n1 by its earlier lineage (414,048) where its own, the lineage the
 * stored one branched from, held it to 527,424, and brought the shard back on a node restarted
 * from an RDB at 485,616: n1 full-synced from it and 871 acknowledged writes were lost.
 */
function heldOffset(
  node: Heartbeat,
  lineage: Lineage,
  acceptPrior: boolean,
  links: readonly LineageLink[],
): number | undefined {
  if (node.db_status === "down" && !isRestartedHolder(node)) return undefined;
  const judged = { replId: lineage.repl_id, offset: lineage.last_txn_id };
  const prior = acceptPrior ? node.prior_lineage : undefined;
  // A restarted holder's `repl_id` and `last_txn_id` are the dead process's, not what it holds.
  const up = node.db_status !== "down";
  if (up && node.repl_id === lineage.repl_id) return node.last_txn_id;
  // A database restarted from an RDB older than a later promotion: its earlier lineage is an ancestor.
  const byPrior =
    prior === undefined
      ? undefined
      : prior.repl_id === lineage.repl_id
        ? prior.last_txn_id
        : heldThroughLinks({ replId: prior.repl_id, offset: prior.last_txn_id }, judged, links, true);
  if (!up) return byPrior;
  const byOwn = heldThroughLinks(
    { replId: node.repl_id, offset: node.last_txn_id },
    judged,
    links,
    acceptPrior,
  );
  if (byPrior === undefined || byOwn === undefined) return byPrior ?? byOwn;
  return Math.max(byPrior, byOwn);
}

function compareByOffset(a: Candidate, b: Candidate): number {
  if (a.eligible !== b.eligible) return a.eligible ? -1 : 1;
  if (a.last_txn_id !== b.last_txn_id) return b.last_txn_id - a.last_txn_id;
  if (a.priority !== b.priority) return a.priority - b.priority;
  return a.node_id < b.node_id ? -1 : a.node_id > b.node_id ? 1 : 0;
}

function compareByPriority(a: Candidate, b: Candidate): number {
  if (a.eligible !== b.eligible) return a.eligible ? -1 : 1;
  if (a.priority !== b.priority) return a.priority - b.priority;
  if (a.last_txn_id !== b.last_txn_id) return b.last_txn_id - a.last_txn_id;
  return a.node_id < b.node_id ? -1 : a.node_id > b.node_id ? 1 : 0;
}

/** Every candidate's verdict, for reasons. */
export function describeCandidates(candidates: readonly Candidate[]): string {
  if (candidates.length === 0) return "no other node reports a heartbeat";
  return candidates.map((c) => `${c.node_id}: ${c.reason}`).join("; ");
}
