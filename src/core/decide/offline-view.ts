import { canDepose } from "../depose.ts";
import type { Candidate, Heartbeat, Lineage, Topology } from "../model.ts";
import { HUNG_HOLDER_GRACE, LAST_COPY_GRACE } from "./gate.ts";
import { pickCandidates } from "./pick-candidate.ts";
import { agentAgeMs, awaitingReports, guardMembers, isAgentHeard, isAlive, type ShardView } from "./view.ts";

/**
 * An offline shard as its gates see it (\`offlineView\`), and the judgements its gates share
 * (src/core/decide/offline.ts holds the gates and the decision).
 */

/**
 * Every node of the snapshot, the old primary the lineage names among them, answers and its agent is
 * heard: none is hung or cut off with writes the snapshot lacks, which is what the last resort's
 * grace waits for. Its writes past a restart from its RDB died with the old process, and a replica
 * that held more either still does (it ranks on the lineage itself) or resynced from the restarted
 * process already. Simulator seeds 45033 and 44216: a primary restarted from its RDB while its
 * agent had yet to report the restart took the shard offline, and every node heard with its
 * database up waited the whole grace (111 s and 124 s without a writable primary).
 *
 * A node whose agent is heard reporting a new process in place of the dead one (\`restarted\`, kept
 * fenced when it holds nothing of the lineage) answers too: the process that held its writes is gone
 * and cannot return with more. Simulator seed 71251: the old primary restarted empty, its agent
 * heard; every other node alive; the shard waited the whole grace (29.6 s past the last heal).
 */
function everyNodeAnswers(view: ShardView, lineage: Lineage | undefined): boolean {
  const { snapshot, config, now } = view;
  const answers = (node: Heartbeat) =>
    isAgentHeard(node, config, now) && (isAlive(node, config, now) || node.db_crash?.state === "restarted");
  return (
    lineage?.node_id !== undefined &&
    snapshot.nodes.some((node) => node.node_id === lineage.node_id) &&
    snapshot.nodes.every(answers)
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
  const candidates = pickCandidates(snapshot.nodes, lineage, config, now, {
    acceptPrior: lastResort,
    links: topology.ancestry,
  });
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
export function lastResortInS(v: OfflineView): number {
  return Math.ceil((LAST_COPY_GRACE * v.config.failureTimeoutMs - v.offlineMs) / 1000);
}

/** Before the grace: the node that holds the lineage as its earlier one, promoted if nobody with more returns. */
export function lastResortWaiting(v: OfflineView): string {
  const waiting =
    !v.lastResort && v.lineage !== undefined
      ? pickCandidates(v.snapshot.nodes, v.lineage, v.config, v.now, {
          acceptPrior: true,
          links: v.topology.ancestry,
        }).find((candidate) => candidate.eligible)
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

export function unfencedOldPrimary(v: OfflineView, best: Candidate, lineage: Lineage): Heartbeat | undefined {
  return unfencedOldPrimaryOf(v, lineage.node_id, best.node_id);
}

/** Past the grace, with only the last resort eligible: nodes of the lineage with more that hang, not died. */
export function hungHolders(v: OfflineView, best: Candidate, lineage: Lineage): Heartbeat[] {
  const links = v.topology.ancestry;
  if (
    !v.lastResort ||
    pickCandidates(v.snapshot.nodes, lineage, v.config, v.now, { links }).some((c) => c.eligible)
  ) {
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
 * Before the grace, nodes other than the target that continue the lineage under another
 * replication id (its \`prior_lineage\`: a Redis 7 primary restarted from its RDB takes a new id and
 * keeps the old one as \`replid2\`, and its replicas adopt it) further than the target holds: they
 * are ranked by what they hold only as the last resort, so until then the target would drop
 * what they acknowledged. Live or not: a report late by a moment (a loaded host, at a failure timeout
 * of a second) is no sign its data is gone, and the grace bounds the wait (a real-process run of
 * seed 7007's scenario under load brought the shard back on the node behind while the holder's
 * report was late, and lost 200 acknowledged keys). A down report names no \`prior_lineage\` of the
 * dead process, so a node whose database died does not hold the shard here.
 */
export function priorHoldersAhead(v: OfflineView, best: Candidate, lineage: Lineage): Heartbeat[] {
  if (v.lastResort) return [];
  return v.snapshot.nodes.filter(
    (node) =>
      node.node_id !== best.node_id &&
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
export function heldByOldPrimaryReport(
  v: OfflineView,
  rule: (at: {
    best: Candidate;
    lineage: Lineage;
    oldId: string;
    old: Heartbeat | undefined;
  }) => string | undefined,
): string | undefined {
  if (v.target === undefined) return undefined;
  const { best, lineage } = v.target;
  const oldId = lineage.node_id;
  if (oldId === undefined) return undefined;
  if (best.node_id === oldId && ownRun(v, best.node_id, lineage)) return undefined;
  const reason = rule({ best, lineage, oldId, old: v.snapshot.nodes.find((node) => node.node_id === oldId) });
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
export function ownRun(v: OfflineView, nodeId: string, lineage: Lineage): boolean {
  const node = v.snapshot.nodes.find((n) => n.node_id === nodeId);
  return (
    node !== undefined &&
    node.db_status === "up" &&
    node.role === "primary" &&
    node.repl_id === lineage.repl_id
  );
}

/** The target's heartbeat when it can depose \`old\` (src/core/depose.ts \`canDepose\`). */
export function deposer(v: OfflineView, best: Candidate, old: Heartbeat): Heartbeat | undefined {
  const node = v.snapshot.nodes.find((candidate) => candidate.node_id === best.node_id);
  return node !== undefined && canDepose(node, old, v.config, v.now) ? node : undefined;
}
