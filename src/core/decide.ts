import type { FailoverConfig } from "./config.ts";
import { confirmedCrash } from "./crash.ts";
import { holdsAllOf, type ReplicationPoint } from "./identity.ts";
import type {
  Candidate,
  CrashReport,
  FailoverPhase,
  FailoverState,
  Heartbeat,
  Lineage,
  Topology,
} from "./model.ts";
import { FAILOVER_PHASES } from "./model.ts";
import type { ShardSnapshot } from "./ports.ts";

/**
 * The failover decision core: pure functions of (snapshot, config, now). No SDK, no clock, no
 * environment, so that every rule is a table row in a unit test.
 */

/** A node as the orchestrator addresses it. */
export interface NodeRef {
  readonly node_id: string;
  readonly node_address: string;
}

/** Why a cycle did nothing; lets the loop count stale detections and offline shards. */
export type NoActionCode =
  | "no_topology"
  | "ambiguous_primary"
  | "paused"
  | "cooldown"
  | "locked"
  | "healthy"
  | "quorum_not_met"
  | "no_agent_heard"
  | "crash_no_candidate"
  | "waiting_for_replica"
  | "awaiting_reports"
  | "store_recovering"
  | "offline_no_candidate"
  | "inconsistent_topology"
  | "legacy_layout";

export type Decision =
  | {
      readonly kind: "none";
      readonly code: NoActionCode;
      /** True when the primary's heartbeat is stale, whatever stopped the action. */
      readonly primaryStale: boolean;
      readonly reason: string;
      /**
       * \`awaiting_reports\`: the nodes whose agents are quiet (their last report stands, within its
       * keepalive) but not heard within the failure timeout: the controller asks them to report.
       */
      readonly awaiting?: readonly string[];
    }
  | {
      /** No topology yet: adopt the one node that reports itself primary. */
      readonly kind: "initialize";
      readonly primary: NodeRef;
      readonly epoch: number;
      readonly lineage: Lineage;
      readonly reason: string;
    }
  | {
      readonly kind: "failover";
      readonly epoch: number;
      readonly oldPrimary: string;
      readonly target: NodeRef;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage;
      /** Set when the crash fast path decided: the old primary's agent saw its process die. */
      readonly crash?: CrashReport;
      readonly reason: string;
    }
  | {
      readonly kind: "mark_offline";
      readonly epoch: number;
      readonly oldPrimary: string | undefined;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage | undefined;
      readonly reason: string;
    }
  | {
      readonly kind: "bring_online";
      readonly epoch: number;
      readonly target: NodeRef;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage;
      readonly reason: string;
    }
  | {
      /**
       * A change (failover, switchover, bring-online) left in `failing_over` by a controller that
       * stopped: continue it from its stored phase. Not the operator's `resume`, which lifts a pause.
       */
      readonly kind: "continue_failover";
      readonly epoch: number;
      readonly phase: FailoverPhase | undefined;
      readonly failover: FailoverState;
      readonly reason: string;
    };

export type DecisionKind = Decision["kind"];

export interface DecideOptions {
  /** The caller's own lock token: a lock held by it does not block the decision. */
  readonly lockOwner?: string;
}

/** Index of a phase in the ordered union; -1 for none. */
export function phaseIndex(phase: FailoverPhase | undefined): number {
  return phase === undefined ? -1 : FAILOVER_PHASES.indexOf(phase);
}

/** True once PROMOTE may have been sent: from then on a failover can no longer be aborted. */
export function isPastPointOfNoReturn(phase: FailoverPhase | undefined): boolean {
  return phaseIndex(phase) >= phaseIndex("promote");
}

/**
 * How far ahead of the reader's clock a heartbeat timestamp may be dated and still count, in ms.
 * Agents and controller stamp and judge on `AwsClock` (src/adapters/clock.ts): after its first
 * response each reads within its bounds' width of AWS time, at most the `Date` header's 1 s
 * resolution plus a round trip (tens of ms once a few dozen responses narrowed them). Two such
 * clocks differ by at most 2 × 1 s; 500 ms more covers the round trips of the first samples.
 * A timestamp further ahead comes from a clock outside that design (a host clock read before any
 * response, a bug): it is no evidence of liveness. The heartbeat store uses the same bound to let
 * a write replace a stored heartbeat dated that far ahead of the writer, so that no writer is ever
 * stuck behind it.
 */
export const MAX_CLOCK_SKEW_MS = 2_500;

/**
 * How many failure timeouts a stale replica further ahead than the best candidate is waited for
 * before a failover goes ahead without it (its acknowledged writes would be lost).
 */
export const AHEAD_GRACE = 3;

/**
 * Failure timeouts an offline shard waits before it promotes a node that holds its lineage only
 * as its earlier one (`prior_lineage`: a database restarted from its RDB): 90 s at the default
 * 3 s timeout, longer than Redis's 60 s `repl-timeout`. Sooner, a hung primary or a replica cut
 * off could still come back with writes the snapshot lacks.
 */
export const LAST_COPY_GRACE = 30;

/** Age of a heartbeat's database-alive timestamp, in ms (negative: dated ahead of `now`). */
export function heartbeatAgeMs(heartbeat: Heartbeat, now: number): number {
  return now - heartbeat.last_updated / 1000;
}

/** ms since the agent last wrote, whatever its database's state (\`agent_updated\`). */
function agentAgeMs(heartbeat: Heartbeat, now: number): number {
  return now - (heartbeat.agent_updated ?? heartbeat.last_updated) / 1000;
}

/**
 * A timestamp (µs) counts as recent at `now`: at most `failureTimeoutMs` old and dated at most
 * MAX_CLOCK_SKEW_MS ahead of `now`. So the controller times at which it counts form one interval
 * `[t - MAX_CLOCK_SKEW_MS, t + failureTimeoutMs]`: no timestamp, however far in the future, counts
 * for longer than `failureTimeoutMs + MAX_CLOCK_SKEW_MS`, while one from a clock within the
 * design's bound always counts exactly as its age says.
 */
export function isRecent(timestampMicros: number, config: FailoverConfig, now: number): boolean {
  const ageMs = now - timestampMicros / 1000;
  return ageMs <= config.failureTimeoutMs && ageMs >= -MAX_CLOCK_SKEW_MS;
}

/**
 * Fresh: the database answered within `failureTimeoutMs`. A heartbeat dated more than
 * MAX_CLOCK_SKEW_MS in the future is not fresh (see `isRecent`).
 */
export function isFresh(heartbeat: Heartbeat, config: FailoverConfig, now: number): boolean {
  return isRecent(heartbeat.last_updated, config, now);
}

/**
 * The agent itself was heard within `failureTimeoutMs` (its last write, whatever its database's
 * state), by the same rule as `isFresh`. Heartbeats written before `agent_updated` existed count
 * by `last_updated`.
 */
export function isAgentHeard(heartbeat: Heartbeat, config: FailoverConfig, now: number): boolean {
  return isRecent(heartbeat.agent_updated ?? heartbeat.last_updated, config, now);
}

/**
 * The agent's last report still stands: it was written at most its keepalive (\`keepalive_ms\`, the
 * longest the agent stays silent while nothing it reports changes) plus \`failureTimeoutMs\` ago, by
 * the clock rule of \`isRecent\`. A quiet replica writes only on a change and at its keepalive, so
 * its silence is no evidence of failure until then; its offset, though, is as old as the write.
 */
export function isReportCurrent(heartbeat: Heartbeat, config: FailoverConfig, now: number): boolean {
  const ageMs = agentAgeMs(heartbeat, now);
  return ageMs <= (heartbeat.keepalive_ms ?? 0) + config.failureTimeoutMs && ageMs >= -MAX_CLOCK_SKEW_MS;
}

/**
 * Nodes (except \`exclude\`) whose agents are quiet within their keepalive: alive by their own
 * promise, but not heard within the failure timeout, so neither their vote nor their offset is
 * recent enough to act on. Every decision that changes the primary waits for their reports (the
 * controller asks for them: a REPORT command); a node that stays silent past its keepalive is
 * stale, as any other.
 */
export function awaitingReports(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  exclude?: string,
): Heartbeat[] {
  return snapshot.nodes.filter(
    (node) =>
      node.node_id !== exclude && isReportCurrent(node, config, now) && !isAgentHeard(node, config, now),
  );
}

function awaitingDecision(
  quiet: readonly Heartbeat[],
  context: string,
  now: number,
  primaryStale: boolean,
): Decision {
  const ids = quiet.map((node) => node.node_id).sort();
  return {
    kind: "none",
    code: "awaiting_reports",
    primaryStale,
    awaiting: ids,
    reason: `${context}; waiting for ${ids.join(", ")} to report: quiet within their keepalive (${quiet
      .map(
        (node) =>
          `${node.node_id} heard ${describeAgentAge(node, now)}, keepalive ${node.keepalive_ms ?? 0} ms`,
      )
      .sort()
      .join("; ")}), too old to vote or be ranked on`,
  };
}

function describeAgentAge(heartbeat: Heartbeat, now: number): string {
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
 * Judges each node (except `exclude`) for promotion and returns them in promotion order:
 * eligible first, then priority ascending, last_txn_id descending, node_id ascending.
 * The lag reference is the highest offset known in the lineage: the old primary's last report
 * or a same-lineage fresh node that received more after it.
 */
export function rankCandidates(
  nodes: readonly Heartbeat[],
  lineage: Lineage | undefined,
  config: FailoverConfig,
  now: number,
  exclude?: string,
  members?: readonly string[],
  acceptPrior = false,
): Candidate[] {
  const considered = nodes.filter((node) => node.node_id !== exclude);
  const knownLineage = lineage !== undefined && lineage.repl_id !== "";
  let reference = lineage?.last_txn_id ?? 0;
  for (const node of considered) {
    if (knownLineage && node.repl_id === lineage.repl_id && isFresh(node, config, now)) {
      reference = Math.max(reference, node.last_txn_id);
    }
    const held =
      knownLineage && isAlive(node, config, now) ? heldOffset(node, lineage, acceptPrior) : undefined;
    if (held !== undefined) reference = Math.max(reference, held);
  }
  const judged = considered.map((node): Candidate => {
    const held = knownLineage ? heldOffset(node, lineage, acceptPrior) : undefined;
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
    const lag = reference - node.last_txn_id;
    if (lag > config.maxLagOnFailover) {
      return ineligible(`lag ${lag} exceeds maxLagOnFailover ${config.maxLagOnFailover}`);
    }
    return { ...base, eligible: true, reason: "eligible" };
  });
  return judged.sort(compareCandidates);
}

/**
 * A database that restarted in place of a dead one and that its agent keeps fenced (`db_status:
 * down`, a `restarted` crash report) but reads this cycle: what it holds of an earlier lineage
 * (`prior_lineage`, from its RDB) may still be the best copy left of the shard's data.
 */
function isRestartedHolder(node: Heartbeat): boolean {
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

/**
 * The lineage `node`'s data is: its own, or for a restarted holder the earlier one its new process
 * holds (its `repl_id` and `last_txn_id` are the dead process's).
 */
export function dataLineageOf(node: Heartbeat): Lineage {
  const prior = isRestartedHolder(node) ? node.prior_lineage : undefined;
  return prior === undefined ? lineageOf(node) : { node_id: node.node_id, ...prior };
}

/**
 * How far `node`'s data holds `lineage` (the offset in it), undefined when it holds none: a node
 * on it to its offset; one that continues it under another replication id (promoted, or a
 * primary restarted from its RDB) to its `prior_lineage` offset; a restarted holder only by that.
 */
function heldOffset(node: Heartbeat, lineage: Lineage, acceptPrior: boolean): number | undefined {
  if (node.db_status === "down" && !isRestartedHolder(node)) return undefined;
  if (acceptPrior && node.prior_lineage?.repl_id === lineage.repl_id) return node.prior_lineage.last_txn_id;
  // A restarted holder's `repl_id` and `last_txn_id` are the dead process's, not what it holds.
  if (node.db_status === "down") return undefined;
  return node.repl_id === lineage.repl_id ? node.last_txn_id : undefined;
}

function compareCandidates(a: Candidate, b: Candidate): number {
  if (a.eligible !== b.eligible) return a.eligible ? -1 : 1;
  if (a.priority !== b.priority) return a.priority - b.priority;
  if (a.last_txn_id !== b.last_txn_id) return b.last_txn_id - a.last_txn_id;
  return a.node_id < b.node_id ? -1 : a.node_id > b.node_id ? 1 : 0;
}

function lineageOf(node: Heartbeat): Lineage {
  return { node_id: node.node_id, repl_id: node.repl_id, last_txn_id: node.last_txn_id };
}

/**
 * The lineage of a primary whose heartbeat item is gone: the one `repl_id` that all the nodes
 * still naming it as their primary agree on; unknown when they disagree or none exists.
 */
function inferLineage(nodes: readonly Heartbeat[], primaryId: string | undefined): Lineage | undefined {
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
 * Agents back from a coordination-store outage within the failure timeout (`store_resumed_at`)
 * while others are not heard yet: the same outage may be what holds those back, and an agent heard
 * first says nothing of the ones behind it (a primary that served through the outage under its
 * replica-set guard, a replica further ahead). Their silence is no evidence for a failure timeout
 * after the last agent came back: the reason to wait, or undefined. (Nemesis seed 3108: right after
 * a store-wide outage the shard went offline and came back on the first replica heard, behind the
 * primary that had served throughout.)
 */
function storeReturning(snapshot: ShardSnapshot, config: FailoverConfig, now: number): string | undefined {
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

function pointOf(node: Heartbeat): ReplicationPoint {
  const prior = node.prior_lineage;
  return {
    replId: node.repl_id,
    offset: node.last_txn_id,
    prior: prior === undefined ? undefined : { replId: prior.repl_id, offset: prior.last_txn_id },
  };
}

/** The replicas whose report counts: fresh heartbeat, database up, not the primary itself. */
function freshVoters(
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
 * A strict majority of the fresh replicas (database up) report the primary `restarted` and agree
 * on one lineage that is not the primary's: the reason, and that lineage (the highest offset any
 * of them holds). Undefined otherwise.
 */
function restartedPrimary(
  snapshot: ShardSnapshot,
  primary: Heartbeat,
  config: FailoverConfig,
  now: number,
): { reason: string; lineage: Lineage } | undefined {
  const voters = freshVoters(snapshot, primary.node_id, config, now);
  // A replica whose data the primary holds all of (through either one's earlier lineage: a node
  // restarted from its RDB, or promoted) has no evidence that the primary lost anything.
  const restarted = voters.filter(
    (node) =>
      node.primary_probe === "restarted" &&
      node.repl_id !== undefined &&
      node.repl_id !== primary.repl_id &&
      !holdsAllOf(pointOf(primary), pointOf(node)),
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

function refOf(candidate: Candidate): NodeRef {
  return { node_id: candidate.node_id, node_address: candidate.node_address };
}

function describeCandidates(candidates: readonly Candidate[]): string {
  if (candidates.length === 0) return "no other node reports a heartbeat";
  return candidates.map((c) => `${c.node_id}: ${c.reason}`).join("; ");
}

function lockBlocks(snapshot: ShardSnapshot, now: number, options: DecideOptions): boolean {
  const lock = snapshot.lock;
  return lock !== undefined && lock.expires_at > now && lock.owner !== options.lockOwner;
}

function none(code: NoActionCode, reason: string, primaryStale = false): Decision {
  return { kind: "none", code, primaryStale, reason };
}

/**
 * Decides what the controller should do with one shard, from one snapshot. Always returns a
 * reason sentence that the loop logs.
 */
export function decide(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  options: DecideOptions = {},
): Decision {
  const broken = snapshot.malformed.find((item) => item.sk === "TOPOLOGY");
  if (broken !== undefined) {
    // Fail closed: an unreadable topology is not "no topology yet", which would adopt a primary.
    return none(
      "inconsistent_topology",
      `the topology item is malformed (${broken.field}: ${broken.reason}); no automatic action until an operator repairs it`,
    );
  }
  if (snapshot.legacyTopology) {
    // Guarantee 6: the topology sits where agents can write it; acting on it would obey a forgery.
    return none(
      "legacy_layout",
      "the topology is in the agents' partition (an older installation); no automatic action until `shardguard migrate-layout` moves it to the controller's",
    );
  }
  const topology = snapshot.topology;
  if (topology === undefined) return decideWithoutTopology(snapshot, config, now, options);

  if (topology.status === "paused") {
    return none("paused", `shard paused${topology.paused_reason ? `: ${topology.paused_reason}` : ""}`);
  }
  if (topology.status === "failing_over") return decideContinueFailover(snapshot, topology, now, options);
  if (topology.cooldown_until !== undefined && now < topology.cooldown_until) {
    const stale = topology.status === "online" && primaryStale(snapshot, topology, config, now);
    return none(
      "cooldown",
      `in cool-down for ${topology.cooldown_until - now} ms more after the last change of primary` +
        (stale ? "; the primary's heartbeat is stale but no automatic action is taken" : ""),
      stale,
    );
  }
  if (topology.status === "offline") return decideOffline(snapshot, topology, config, now, options);
  return decideOnline(snapshot, topology, config, now, options);
}

function primaryHeartbeat(snapshot: ShardSnapshot, topology: Topology): Heartbeat | undefined {
  return snapshot.nodes.find((node) => node.node_id === topology.primary_node_id);
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

function primaryStale(snapshot: ShardSnapshot, topology: Topology, config: FailoverConfig, now: number) {
  const primary = primaryHeartbeat(snapshot, topology);
  return primary === undefined || !isFresh(primary, config, now);
}

function decideWithoutTopology(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  options: DecideOptions,
): Decision {
  const primaries = snapshot.nodes.filter(
    (node) => node.role === "primary" && node.db_status === "up" && isFresh(node, config, now),
  );
  if (primaries.length === 0) {
    return none("no_topology", "no topology yet and no node reports itself primary with a fresh heartbeat");
  }
  if (primaries.length > 1) {
    const ids = primaries.map((node) => node.node_id).join(", ");
    return none("ambiguous_primary", `no topology yet and several nodes report themselves primary: ${ids}`);
  }
  const [primary] = primaries as [Heartbeat];
  if (lockBlocks(snapshot, now, options)) {
    return none("locked", "no topology yet; another controller holds the shard's lock");
  }
  // The topology epoch must not start below an epoch an agent has already applied.
  const epoch = Math.max(0, ...snapshot.nodes.map((node) => node.epoch));
  return {
    kind: "initialize",
    primary: { node_id: primary.node_id, node_address: primary.node_address },
    epoch,
    lineage: lineageOf(primary),
    reason: `no topology yet; adopting ${primary.node_id}, the only node reporting itself primary`,
  };
}

function decideContinueFailover(
  snapshot: ShardSnapshot,
  topology: Topology,
  now: number,
  options: DecideOptions,
): Decision {
  if (topology.failover === undefined) {
    return none("inconsistent_topology", "shard is failing_over but the topology holds no failover state");
  }
  if (lockBlocks(snapshot, now, options)) {
    return none(
      "locked",
      `${topology.failover.kind} to ${topology.failover.new_primary_node_id} in progress at epoch ${topology.epoch}` +
        ` (phase ${topology.phase ?? "unknown"}); another controller holds the lock`,
    );
  }
  return {
    kind: "continue_failover",
    epoch: topology.epoch,
    phase: topology.phase,
    failover: topology.failover,
    reason:
      `${topology.failover.kind} to ${topology.failover.new_primary_node_id} at epoch ${topology.epoch} stopped` +
      ` in phase ${topology.phase ?? "unknown"} and its lock is free; continuing it`,
  };
}

function decideOffline(
  snapshot: ShardSnapshot,
  topology: Topology,
  config: FailoverConfig,
  now: number,
  options: DecideOptions,
): Decision {
  // The lineage stored when the shard went offline: a node that returns with another one (an
  // empty restart, a foreign dataset) must never be promoted.
  const lineage = topology.lineage;
  // A node that holds the lineage only as its earlier one (restarted from its RDB: a snapshot up
  // to seconds old) is the last resort: it is promoted only after LAST_COPY_GRACE failure timeouts
  // offline, time for a node with more of it (a hung primary, a replica cut off) to come back.
  const returning = storeReturning(snapshot, config, now);
  if (returning !== undefined) return none("store_recovering", `shard offline; ${returning}`);
  const quiet = awaitingReports(snapshot, config, now);
  if (quiet.length > 0) return awaitingDecision(quiet, "shard offline", now, false);
  const offlineMs = now - topology.updated_at;
  const lastResort = offlineMs >= LAST_COPY_GRACE * config.failureTimeoutMs;
  const candidates = rankCandidates(snapshot.nodes, lineage, config, now, undefined, undefined, lastResort);
  const best = candidates[0];
  if (best === undefined || !best.eligible || lineage === undefined) {
    const waiting =
      !lastResort && lineage !== undefined
        ? rankCandidates(snapshot.nodes, lineage, config, now, undefined, undefined, true).find(
            (candidate) => candidate.eligible,
          )
        : undefined;
    const grace = Math.ceil((LAST_COPY_GRACE * config.failureTimeoutMs - offlineMs) / 1000);
    return none(
      "offline_no_candidate",
      `shard offline; no eligible node to bring it back (${describeCandidates(candidates)})` +
        (waiting === undefined
          ? ""
          : `; ${waiting.node_id} holds the lineage up to ${waiting.last_txn_id} as its earlier one (restarted from its RDB): the last resort, promoted if no node with more returns within ${grace} s`),
    );
  }
  // Promoting a node fences the old primary only through its write guard (a member detached). An
  // old primary whose agent is not heard and that reported no crash may still be serving, unfenced
  // (its agent paused or dead: nobody read it the offline topology): a node outside its replica set
  // would make two writable primaries (nemesis seed 3113: the shard went offline with no fresh
  // replica while the primary's agent was paused, then came back on a replica that had left the set
  // while hung; both took writes until the agent woke). Wait for its agent, a confirmed crash, a
  // member, or an operator.
  const oldId = lineage.node_id;
  const old = oldId === undefined ? undefined : snapshot.nodes.find((node) => node.node_id === oldId);
  const oldMembers = oldId === undefined ? undefined : guardMembers(snapshot, oldId);
  if (
    old !== undefined &&
    best.node_id !== old.node_id &&
    !isAgentHeard(old, config, now) &&
    old.db_crash === undefined &&
    oldMembers !== undefined &&
    !oldMembers.includes(best.node_id)
  ) {
    return none(
      "offline_no_candidate",
      `shard offline; ${best.node_id} is eligible but not in ${old.node_id}'s replica set, and ${old.node_id}'s agent ` +
        `is not heard (${describeHeartbeatAge(old, now, "ago")}) nor reported a crash: its database may still take ` +
        "writes unfenced; waiting for its agent, a confirmed crash, a member of its set, or shardguard recover",
    );
  }
  // The last resort is a snapshot that may be seconds old. A node of the lineage with more, whose
  // agent last reported its database down without a confirmed crash, is hung, not gone: it may
  // come back with writes acknowledged nowhere else (nemesis seed 3109: a primary hung 71 s, past
  // the grace, was replaced by its replica's RDB and lost 63 writes when it woke; in its rerun the
  // agent was paused too, for 8 s). Wait for it or for an operator; a crash it confirms, or its
  // agent silent for LAST_COPY_GRACE failure timeouts as well, lets the last resort go on.
  if (lastResort && !rankCandidates(snapshot.nodes, lineage, config, now).some((c) => c.eligible)) {
    const hung = snapshot.nodes.filter(
      (node) =>
        node.node_id !== best.node_id &&
        node.db_status === "down" &&
        node.db_crash === undefined &&
        agentAgeMs(node, now) <= LAST_COPY_GRACE * config.failureTimeoutMs &&
        node.repl_id === lineage.repl_id &&
        node.last_txn_id > best.last_txn_id,
    );
    if (hung.length > 0) {
      return none(
        "offline_no_candidate",
        `shard offline; the last resort ${best.node_id} (its RDB, up to ${best.last_txn_id}) waits while ${hung
          .map((node) => `${node.node_id} (up to ${node.last_txn_id})`)
          .sort()
          .join(
            ", ",
          )} does not answer but did not die (hung, its agent last reported): it may return with more; ` +
          "or an operator runs shardguard recover",
      );
    }
  }
  if (lockBlocks(snapshot, now, options)) {
    return none(
      "locked",
      `shard offline and ${best.node_id} is eligible, but another controller holds the lock`,
    );
  }
  return {
    kind: "bring_online",
    epoch: topology.epoch,
    target: refOf(best),
    candidates,
    lineage,
    reason: `shard offline and ${best.node_id} returned eligible (priority ${best.priority}, last_txn_id ${best.last_txn_id}); promoting it`,
  };
}

function decideOnline(
  snapshot: ShardSnapshot,
  topology: Topology,
  config: FailoverConfig,
  now: number,
  options: DecideOptions,
): Decision {
  const primaryId = topology.primary_node_id;
  const primary = primaryHeartbeat(snapshot, topology);
  const fresh = primary !== undefined && isFresh(primary, config, now);
  // The crash fast path: a fresh primary is failed before the timeout only on its own agent's
  // confirmed report of a dead process. Nothing else (replicas' reports, an unreachable or hung
  // database) shortens the failure timeout: a stall is not a crash.
  // The primary's agent's confirmed report that its process died (fresh or not: see the replica-set
  // rule below); only a fresh primary's report is the crash fast path.
  const deadPrimary =
    primary === undefined ? undefined : confirmedCrash(primary, config, now, MAX_CLOCK_SKEW_MS);
  const crash = fresh ? deadPrimary : undefined;
  // A fresh primary that its replicas find back as another process, not continuing their lineage
  // (their agents parked them), restarted without its data; its own agent did not tell (it lost
  // its state dir too): failed, like a stale one, and the replicas' lineage is the shard's.
  const restarted =
    fresh && crash === undefined ? restartedPrimary(snapshot, primary, config, now) : undefined;
  if (fresh && crash === undefined && restarted === undefined) {
    return none(
      "healthy",
      `primary ${primary.node_id} is fresh (database answered ${Math.max(0, Math.round(heartbeatAgeMs(primary, now)))} ms ago)`,
    );
  }
  const staleness =
    primary === undefined
      ? `primary ${primaryId ?? "(none)"} has no heartbeat`
      : restarted !== undefined
        ? `primary ${primary.node_id} is back as a new process without its data (${restarted.reason})`
        : crash !== undefined
          ? `primary ${primary.node_id}'s agent saw its database die (${crash.state}, process ${crash.run_id || "unknown"},` +
            ` confirmed over ${Math.round((crash.last_seen - crash.first_seen) / 1000)} ms)`
          : `primary ${primary.node_id} is stale (database last answered ${describeHeartbeatAge(primary, now, "ago")}` +
            `${primary.db_status === "down" ? ", its agent reports the database down" : ""})`;

  // Nothing that changes the primary is decided on reports older than the failure timeout: a quiet
  // replica's offset and its view of the primary are as old as its last write.
  const quiet = awaitingReports(snapshot, config, now, primaryId);
  if (quiet.length > 0) return awaitingDecision(quiet, staleness, now, true);

  const lineage =
    restarted !== undefined
      ? restarted.lineage
      : primary
        ? lineageOf(primary)
        : (topology.lineage ?? inferLineage(snapshot.nodes, primaryId));
  // The replica-set rule fences an old primary that may still serve: promoting a member detaches
  // one of the replicas its write guard waits for. A primary whose own agent confirms its process
  // dead (or restarted without its data, and fenced by that agent) has nothing left to fence, and
  // the rule would only stand between the shard and the replica holding the most: a replica whose
  // acknowledgements lagged past the guard's 2 s under load leaves the set while still acknowledging
  // WAIT (CI, chaos-primary: the member promoted was a replica stalled 40 KB behind).
  const members = deadPrimary === undefined ? guardMembers(snapshot, primaryId) : undefined;
  const candidates = rankCandidates(snapshot.nodes, lineage, config, now, primaryId, members);
  const best = candidates[0];
  const anyEligible = best?.eligible === true && lineage !== undefined;

  // Quorum: fresh replicas (database up) vote with their own view of the link to the primary.
  // With no voter at all nobody can confirm the failure: that may only lead to offline (nobody
  // eligible either), never to a promotion, unless the quorum mode is none.
  const voters = freshVoters(snapshot, primaryId, config, now);
  // A replica votes the primary down when its replication link is down, or when its own probe
  // got no answer (a hung primary keeps the link "up" until Redis's repl-timeout), found it
  // restarted without its data, or found it refusing every write (fenced by its own agent, e.g.
  // an agent cut off from the store while its replicas are not).
  // On the fast path only the replication link counts (a crash drops it at once), and every fresh
  // replica (at least one) must report it down, whatever the configured quorum: a replica's offset
  // is final only in an INFO read after its link dropped, and the candidates are ranked by these
  // offsets. One heartbeat from before the death could hide a replica that acknowledged more
  // (WAIT) than the one promoted; the slow path has no such risk, its reports are a timeout old.
  const downVoters = voters.filter((node) =>
    crash !== undefined
      ? node.primary_link === "down"
      : node.primary_link === "down" || (node.primary_probe !== undefined && node.primary_probe !== "ok"),
  );
  const down = downVoters.length;
  const needed =
    crash !== undefined ? Math.max(1, voters.length) : quorumNeeded(config.quorum, voters.length);
  if (crash !== undefined && down < needed) {
    return none(
      "quorum_not_met",
      `${staleness}, but only ${down} of ${voters.length} fresh replicas see the replication link down` +
        ` (the crash fast path needs ${needed}); waiting for them or for the failure timeout`,
    );
  }
  // Not one agent heard: the controller cannot tell a dead shard from agents cut off from the
  // table or stalled while every database serves. Marking it offline is then no harmless status:
  // the next tick brings it online with whichever node is heard first, possibly not the primary
  // that kept taking writes, which lose them when it steps down. Wait until some agent reports.
  if (config.quorum !== "none" && !snapshot.nodes.some((node) => isAgentHeard(node, config, now))) {
    return none(
      "no_agent_heard",
      `${staleness}, and no agent of the shard was heard for more than ${config.failureTimeoutMs} ms: ` +
        "a dead shard cannot be told from agents cut off from the table; not failing over or marking it offline",
      true,
    );
  }
  const returning = storeReturning(snapshot, config, now);
  if (returning !== undefined) return none("store_recovering", `${staleness}; ${returning}`, true);
  // With no fresh replica to ask, a replica whose agent was just heard reporting its database up
  // is one whose heartbeat is stale only by its own cycle's latency (the database's answer is dated
  // at the start of the cycle, the write at its end: hundreds of ms on a loaded host). Its next
  // heartbeat is fresh, or says the database is down: wait for it rather than mark the shard
  // offline on a replica that is alive (found by chaos-agent-stall under load: every agent stopped
  // together, one replica's write the last heard).
  const answering =
    voters.length === 0 && crash === undefined && config.quorum !== "none"
      ? snapshot.nodes.filter(
          (node) =>
            node.node_id !== primaryId &&
            node.role === "replica" &&
            node.db_status === "up" &&
            isAgentHeard(node, config, now) &&
            heartbeatAgeMs(node, now) <= AHEAD_GRACE * config.failureTimeoutMs,
        )
      : [];
  if (answering.length > 0) {
    return none(
      "quorum_not_met",
      `${staleness}; no fresh replica to ask, but the agents of ${answering
        .map((node) => node.node_id)
        .sort()
        .join(", ")} were just heard with their databases up (${answering
        .map((node) => describeHeartbeatAge(node, now))
        .join(", ")}); waiting for their next heartbeat`,
      true,
    );
  }
  const quorumMet =
    voters.length === 0 && crash === undefined ? config.quorum === "none" || !anyEligible : down >= needed;
  if (!quorumMet) {
    return none(
      "quorum_not_met",
      `${staleness}, but only ${down} of ${voters.length} fresh replicas report the primary down (quorum ${config.quorum} needs ${Math.max(needed, 1)}); not failing over`,
      true,
    );
  }
  const quorumText =
    voters.length === 0
      ? "no fresh replica to ask"
      : `${down} of ${voters.length} fresh replicas report the primary down (${[...downVoters]
          .sort((a, b) => a.node_id.localeCompare(b.node_id))
          .map(
            (node) => `${node.node_id}: ${node.primary_link === "down" ? "link down" : node.primary_probe}`,
          )
          .join(", ")})`;

  if (!anyEligible && crash !== undefined) {
    // The fast path only promotes; marking a shard offline waits for the failure timeout.
    return none(
      "crash_no_candidate",
      `${staleness}, ${quorumText}, but no node is eligible (${describeCandidates(candidates)}); waiting for the failure timeout`,
    );
  }
  if (!anyEligible) {
    if (lockBlocks(snapshot, now, options)) {
      return none("locked", `${staleness}; another controller holds the lock`, true);
    }
    return {
      kind: "mark_offline",
      epoch: topology.epoch,
      oldPrimary: primaryId,
      candidates,
      lineage,
      reason: `${staleness}, ${quorumText}, and no node is eligible (${describeCandidates(candidates)}); marking the shard offline`,
    };
  }
  // A replica of the lineage that is further ahead than the best candidate but stale only just
  // now (a slow agent, a late heartbeat) may hold writes it acknowledged (WAIT) that the best
  // candidate lacks: promoting now would lose them. Wait for it for up to AHEAD_GRACE failure
  // timeouts; a replica that stays silent longer is taken as gone and its writes with it.
  const ahead = snapshot.nodes.filter(
    (node) =>
      node.node_id !== primaryId &&
      node.node_id !== best.node_id &&
      node.db_status === "up" &&
      lineage !== undefined &&
      node.repl_id === lineage.repl_id &&
      node.last_txn_id > best.last_txn_id &&
      !isFresh(node, config, now) &&
      heartbeatAgeMs(node, now) <= AHEAD_GRACE * config.failureTimeoutMs &&
      // A heartbeat dated beyond the clock bound is no evidence of a live replica.
      heartbeatAgeMs(node, now) >= -MAX_CLOCK_SKEW_MS,
  );
  if (ahead.length > 0) {
    return none(
      "waiting_for_replica",
      `${staleness}, ${quorumText}; not promoting ${best.node_id} (last_txn_id ${best.last_txn_id}) while ${[
        ...ahead,
      ]
        .sort((a, b) => a.node_id.localeCompare(b.node_id))
        .map(
          (node) =>
            `${node.node_id} (last_txn_id ${node.last_txn_id}, heartbeat ${describeHeartbeatAge(node, now, "old")})`,
        )
        .join(", ")}, further ahead, may still answer`,
      true,
    );
  }
  // A live replica of the lineage outside the replica set, further ahead than the member to be
  // promoted, acknowledged writes the member lacks (WAIT counts every replica; the set is only what
  // the guard demands). While the old primary may still serve it cannot be promoted (nothing would
  // fence the old primary), and promoting the member would lose those writes: wait, for up to
  // AHEAD_GRACE failure timeouts past the primary's staleness, for the old primary to come back or
  // its agent to confirm a crash (then the rule above lets the replica ahead be promoted).
  const outside =
    members === undefined || lineage === undefined
      ? []
      : snapshot.nodes.filter(
          (node) =>
            node.node_id !== primaryId &&
            node.node_id !== best.node_id &&
            !members.includes(node.node_id) &&
            isAlive(node, config, now) &&
            node.repl_id === lineage.repl_id &&
            node.last_txn_id > best.last_txn_id,
        );
  const primaryAgeMs = primary === undefined ? Number.POSITIVE_INFINITY : heartbeatAgeMs(primary, now);
  if (outside.length > 0 && primaryAgeMs <= (1 + AHEAD_GRACE) * config.failureTimeoutMs) {
    return none(
      "waiting_for_replica",
      `${staleness}, ${quorumText}; not promoting ${best.node_id} (last_txn_id ${best.last_txn_id}) while ${outside
        .map((node) => `${node.node_id} (last_txn_id ${node.last_txn_id})`)
        .sort()
        .join(", ")}, outside ${primaryId}'s replica set, holds more: waiting up to ${
        AHEAD_GRACE * config.failureTimeoutMs
      } ms past the failure timeout for ${primaryId} to return or its agent to confirm a crash`,
      true,
    );
  }
  if (lockBlocks(snapshot, now, options)) {
    return none("locked", `${staleness}; another controller holds the lock`, true);
  }
  return {
    kind: "failover",
    epoch: topology.epoch,
    oldPrimary: primaryId ?? "",
    target: refOf(best),
    candidates,
    lineage,
    ...(crash !== undefined ? { crash } : {}),
    reason: `${staleness}, ${quorumText}; promoting ${best.node_id} (priority ${best.priority}, last_txn_id ${best.last_txn_id})`,
  };
}

/**
 * Two decisions are "the same answer" when they would do the same thing: same kind, same
 * epoch, same target. The orchestrator aborts when its re-read answers differently.
 */
export function sameDecision(a: Decision, b: Decision): boolean {
  if (a.kind !== b.kind) return false;
  if ("epoch" in a && "epoch" in b && a.epoch !== b.epoch) return false;
  return targetOf(a) === targetOf(b);
}

export function targetOf(decision: Decision): string | undefined {
  switch (decision.kind) {
    case "failover":
    case "bring_online":
      return decision.target.node_id;
    case "initialize":
      return decision.primary.node_id;
    case "continue_failover":
      return decision.failover.new_primary_node_id;
    default:
      return undefined;
  }
}

export type SwitchoverPlan =
  | { readonly kind: "refused"; readonly reason: string }
  | {
      readonly kind: "switchover";
      readonly epoch: number;
      readonly oldPrimary: NodeRef;
      readonly target: NodeRef;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage;
      readonly reason: string;
    };

/**
 * Plans an operator-requested switchover: the primary must be alive (writes are paused on it
 * while the target catches up), the target eligible by the same rules as a failover. Cool-down
 * does not apply (an operator asked); a paused shard may be switched over (maintenance).
 */
export function planSwitchover(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  request: { readonly to?: string; readonly lockOwner?: string },
): SwitchoverPlan {
  const topology = snapshot.topology;
  if (topology === undefined) return { kind: "refused", reason: "the shard has no topology yet" };
  if (topology.status !== "online" && topology.status !== "paused") {
    return { kind: "refused", reason: `the shard is ${topology.status}; a switchover needs a live primary` };
  }
  if (lockBlocks(snapshot, now, { lockOwner: request.lockOwner })) {
    return { kind: "refused", reason: "another controller holds the shard's lock" };
  }
  const primary = primaryHeartbeat(snapshot, topology);
  if (primary === undefined || !isFresh(primary, config, now) || primary.db_status === "down") {
    return { kind: "refused", reason: `primary ${topology.primary_node_id ?? "(none)"} is not alive` };
  }
  const lineage = lineageOf(primary);
  const candidates = rankCandidates(
    snapshot.nodes,
    lineage,
    config,
    now,
    primary.node_id,
    guardMembers(snapshot, primary.node_id),
  );
  const chosen =
    request.to === undefined
      ? candidates[0]
      : candidates.find((candidate) => candidate.node_id === request.to);
  if (request.to === primary.node_id) {
    return { kind: "refused", reason: `${request.to} is already the primary` };
  }
  if (chosen === undefined) {
    return {
      kind: "refused",
      reason:
        request.to === undefined ? "no other node reports a heartbeat" : `${request.to} has no heartbeat`,
    };
  }
  if (!chosen.eligible) {
    return { kind: "refused", reason: `${chosen.node_id} is not eligible: ${chosen.reason}` };
  }
  return {
    kind: "switchover",
    epoch: topology.epoch,
    oldPrimary: { node_id: primary.node_id, node_address: primary.node_address },
    target: refOf(chosen),
    candidates,
    lineage,
    reason:
      `switchover requested from ${primary.node_id} to ${chosen.node_id}` +
      (request.to === undefined ? " (best eligible replica)" : ""),
  };
}
