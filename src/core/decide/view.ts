import type { FailoverConfig } from "../config.ts";
import {
  agentAgeMs,
  agentWrittenAt,
  heartbeatAgeMs,
  isAgentHeard,
  isFresh,
  isRecent,
  isReportCurrent,
  isWithin,
  MAX_CLOCK_SKEW_MS,
} from "../freshness.ts";
import type { Heartbeat, Lineage, Topology } from "../model.ts";
import type { ShardSnapshot } from "../ports.ts";

/**
 * The one pass from `(snapshot, config, now)` to a `ShardView`. Every judgement of a timestamp
 * (fresh, heard, current) is src/core/freshness.ts's; the decision takes them from here.
 */

export {
  agentAgeMs,
  heartbeatAgeMs,
  isAgentHeard,
  isFresh,
  isRecent,
  isReportCurrent,
  MAX_CLOCK_SKEW_MS,
} from "../freshness.ts";

/**
 * A database that restarted in place of a dead one and that its agent keeps fenced (`db_status:
 * down`, a `restarted` crash report) but reads this cycle: what it holds of an earlier lineage
 * (`prior_lineage`, from its RDB) may still be the best copy left of the shard's data.
 */
export function isRestartedHolder(node: Heartbeat): boolean {
  return (
    node.db_status === "down" && node.db_crash?.state === "restarted" && node.prior_lineage !== undefined
  );
}

/**
 * The node may serve as a candidate: its database answered within the failure timeout, or it is a
 * restarted holder whose agent was heard within it (the holder's `last_updated` is the dead
 * process's; its agent writes `prior_lineage` only from an answer of the same cycle).
 */
export function isAlive(node: Heartbeat, config: FailoverConfig, now: number): boolean {
  if (isRestartedHolder(node)) return isAgentHeard(node, config, now);
  return node.db_status === "up" && isFresh(node, config, now);
}

export function lineageOf(node: Heartbeat): Lineage {
  return { node_id: node.node_id, repl_id: node.repl_id, last_txn_id: node.last_txn_id };
}

/**
 * The lineage `node`'s data is: its own, or for a restarted holder the earlier one its new process
 * holds (its `repl_id` and `last_txn_id` are the dead process's).
 */
export function dataLineageOf(node: Heartbeat): Lineage {
  const prior = isRestartedHolder(node) ? node.prior_lineage : undefined;
  return prior === undefined ? lineageOf(node) : { node_id: node.node_id, ...prior };
}

/**
 * Nodes (except \`exclude\`) whose vote and offset are not recent enough to act on although their
 * report still stands: agents quiet within their keepalive (alive by their own promise, but not
 * heard within the failure timeout), and replicas whose agent was heard but whose database's answer
 * in that report is older than the failure timeout (a cycle whose store write came late after its
 * INFO read). Every decision that changes the primary waits for their reports (the controller asks
 * for them: a REPORT command); a node that stays silent past its keepalive is stale, as any other.
 * A heard replica left out would be neither a voter nor waited for, and its offset never looked at:
 * in an AZ split it may be the member still acknowledging on the old primary's side (nemesis 7335).
 */
export function awaitingReports(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  exclude?: string,
): Heartbeat[] {
  return snapshot.nodes.filter(
    (node) =>
      node.node_id !== exclude &&
      isReportCurrent(node, config, now) &&
      (!isAgentHeard(node, config, now) || isHeardNotFresh(node, config, now)),
  );
}

/** A replica whose agent was heard with its database up, on a database answer too old to vote or rank on. */
function isHeardNotFresh(node: Heartbeat, config: FailoverConfig, now: number): boolean {
  return node.role === "replica" && node.db_status === "up" && !isFresh(node, config, now);
}

/**
 * Nodes (except \`exclude\`) a switchover asks to report: every one whose report still stands,
 * heard or not. A replica heard just now (a write on a change) writes again only on its next
 * change or at its keepalive, so it would turn stale while the switchover waits for the others,
 * locks and plans again; asked, it writes every cycle through the switchover.
 */
export function switchoverReporters(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  exclude?: string,
): Heartbeat[] {
  return snapshot.nodes.filter((node) => node.node_id !== exclude && isReportCurrent(node, config, now));
}

/**
 * Of the nodes \`asked\` to report, the quiet ones (a \`keepalive_ms\`: they write only on a change
 * and at their keepalive) whose agent was not heard within half the failure timeout: a report older
 * than that could turn stale between the wait and the replan under the lock. A node that writes
 * every cycle needs no asking.
 */
export function reportsPending(
  snapshot: ShardSnapshot,
  asked: readonly string[],
  config: FailoverConfig,
  now: number,
): Heartbeat[] {
  return snapshot.nodes.filter(
    (node) =>
      asked.includes(node.node_id) &&
      node.keepalive_ms !== undefined &&
      !isWithin(agentWrittenAt(node), config.failureTimeoutMs / 2, now),
  );
}

export function describeAgentAge(heartbeat: Heartbeat, now: number): string {
  return `${Math.max(0, Math.round(agentAgeMs(heartbeat, now)))} ms ago`;
}

/**
 * A heartbeat's age for reasons: "1234 ms old" (or "ago"), or how far it is dated ahead beyond
 * the clock bound.
 */
export function describeHeartbeatAge(heartbeat: Heartbeat, now: number, word: "old" | "ago" = "old"): string {
  const ageMs = Math.round(heartbeatAgeMs(heartbeat, now));
  return ageMs < -MAX_CLOCK_SKEW_MS
    ? `dated ${-ageMs} ms in the future, beyond the ${MAX_CLOCK_SKEW_MS} ms clock bound`
    : `${Math.max(0, ageMs)} ms ${word}`;
}

/**
 * The members of a primary's replica set when the set is under the write guard (versioned):
 * only these may be promoted in its place. Undefined for sets written before the guard.
 */
export function guardMembers(
  snapshot: ShardSnapshot,
  primaryId: string | undefined,
): readonly string[] | undefined {
  if (primaryId === undefined || snapshot.replicaSetVersions[primaryId] === undefined) return undefined;
  return snapshot.replicaSets[primaryId] ?? [];
}

/** The replicas whose report counts: fresh heartbeat, database up, not the primary itself. */
export function freshVoters(
  snapshot: ShardSnapshot,
  primaryId: string | undefined,
  config: FailoverConfig,
  now: number,
): Heartbeat[] {
  return snapshot.nodes.filter(
    (node) =>
      node.node_id !== primaryId &&
      node.role === "replica" &&
      node.db_status === "up" &&
      isFresh(node, config, now),
  );
}

/**
 * Agents back from a coordination-store outage within the failure timeout (`store_resumed_at`)
 * while others are not heard yet: the same outage may be what holds those back, and an agent heard
 * first says nothing of the ones behind it (a primary that served through the outage under its
 * replica-set guard, a replica further ahead). Their silence is no evidence for a failure timeout
 * after the last agent came back: the reason to wait, or undefined (docs/safety.md, gate
 * `store_returning`).
 */
export function storeReturning(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
): string | undefined {
  const back = snapshot.nodes.filter(
    (node) =>
      node.store_resumed_at !== undefined &&
      isAgentHeard(node, config, now) &&
      isRecent(node.store_resumed_at, config, now),
  );
  if (back.length === 0) return undefined;
  const unheard = snapshot.nodes.filter((node) => !isAgentHeard(node, config, now));
  if (unheard.length === 0) return undefined;
  const ids = (nodes: readonly Heartbeat[]) =>
    nodes
      .map((node) => node.node_id)
      .sort()
      .join(", ");
  return (
    `the agents of ${ids(back)} came back from a coordination-store outage less than ${config.failureTimeoutMs} ms ago` +
    ` and ${ids(unheard)} not yet (the same outage may hold them back); waiting for them`
  );
}

/** The caller's options that the view depends on. */
export interface DecideOptions {
  /** The caller's own lock token: a lock held by it does not block the decision. */
  readonly lockOwner?: string;
}

/** Another controller holds the shard's lock (a lock held by `options.lockOwner` does not count). */
export function lockBlocks(snapshot: ShardSnapshot, now: number, options: DecideOptions): boolean {
  const lock = snapshot.lock;
  return lock !== undefined && lock.expires_at > now && lock.owner !== options.lockOwner;
}

/** One node as every rule sees it this cycle. */
export interface NodeView {
  readonly heartbeat: Heartbeat;
  /** Its database answered within the failure timeout. */
  readonly fresh: boolean;
  /** Its agent wrote within the failure timeout. */
  readonly heard: boolean;
  /** Its agent's last report still stands (within its keepalive). */
  readonly current: boolean;
  /** It may serve as a candidate (`isAlive`). */
  readonly alive: boolean;
  /** The lineage its data is (`dataLineageOf`). */
  readonly dataLineage: Lineage;
}

/** The shard as every rule of one decision sees it: computed once, never changed. */
export interface ShardView {
  readonly snapshot: ShardSnapshot;
  readonly config: FailoverConfig;
  readonly now: number;
  readonly topology: Topology | undefined;
  readonly nodes: readonly NodeView[];
  /** Some agent of the shard was heard within the failure timeout. */
  readonly anyAgentHeard: boolean;
  /** Why agents back from a store outage make the shard wait for the others, if they do. */
  readonly storeReturning: string | undefined;
  /** Another controller holds the lock. */
  readonly locked: boolean;
}

export function shardView(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  options: DecideOptions = {},
): ShardView {
  const nodes = snapshot.nodes.map(
    (heartbeat): NodeView => ({
      heartbeat,
      fresh: isFresh(heartbeat, config, now),
      heard: isAgentHeard(heartbeat, config, now),
      current: isReportCurrent(heartbeat, config, now),
      alive: isAlive(heartbeat, config, now),
      dataLineage: dataLineageOf(heartbeat),
    }),
  );
  return {
    snapshot,
    config,
    now,
    topology: snapshot.topology,
    nodes,
    anyAgentHeard: nodes.some((node) => node.heard),
    storeReturning: storeReturning(snapshot, config, now),
    locked: lockBlocks(snapshot, now, options),
  };
}
