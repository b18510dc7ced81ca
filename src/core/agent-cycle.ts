import { CRASH_CONFIRM_MS } from "./crash.ts";
import { isFresh } from "./freshness.ts";
import type { CrashReport, Heartbeat, HeartbeatInput, Role, Topology } from "./model.ts";
import type { Wake } from "./wake.ts";

/**
 * The agent's heartbeat cycle as a pure plan (src/agent/heartbeat-loop.ts is the effectful loop
 * around it): from what the agent remembers (`AgentCycleState`), what this cycle observed so far
 * (`CycleObservation`) and the monotonic time, what the cycle does: whether it reads the topology,
 * raises the write guard before its heartbeat goes out, writes the heartbeat, wakes the controller,
 * and how soon the next cycle runs. The loop asks again as it learns more (at the start; after INFO
 * and the probe on a cycle that did not read the store; after the topology read).
 */

/** The agent timings the plan depends on (AgentOptions). */
export interface AgentCycleTimings {
  readonly heartbeatIntervalMs: number;
  readonly failureTimeoutMs: number;
  readonly primaryKeepaliveMs: number;
  readonly replicaKeepaliveMs: number;
}

/** Heartbeat cadence while the database or the link to the primary is in doubt, ms. */
export const DOUBT_HEARTBEAT_MS = 150;

/** Failure timeouts a stretch of doubt keeps the fast cadence (DOUBT_HEARTBEAT_MS) and reads the store every cycle. */
export const DOUBT_WINDOW_TIMEOUTS = 2;

/** What the agent remembers between cycles, as the plan needs it. */
export interface AgentCycleState {
  /** A read and a write were asked for: at start, after a failed store call, a wake-up, a command. */
  readonly storeRequested: boolean;
  /** The topology was read since this process started. */
  readonly topologyRead: boolean;
  /** The topology last read confirms this node as primary (undefined before the first read). */
  readonly confirmed: boolean | undefined;
  /** The last heartbeat written: its keepalive, its report's signature, monotonic ms of the write. */
  readonly lastWritten:
    | { readonly keepaliveMs: number; readonly signature: string; readonly at: number }
    | undefined;
  /** Monotonic ms since which the database or the link to the primary is in doubt. */
  readonly doubtSince: number | undefined;
  /** What the controller was last woken for: once per crash and per stretch of doubt. */
  readonly wokeFor: string | undefined;
  /** Monotonic ms until which the controller asked for a report every cycle (REPORT). */
  readonly reportUntil: number;
  /** A replica's last topology read showed something to watch (`topologyToWatch`). */
  readonly topologyDoubt: boolean;
  readonly dbUp: boolean;
  /** The database restarted without its data while primary: fenced until it follows. */
  readonly dbRestarted: boolean;
  /** What this agent saw of its database's death since it last answered. */
  readonly crash: CrashReport | undefined;
}

/** This cycle's INFO and probe. */
export type DatabaseObservation =
  | { readonly answered: false }
  | {
      readonly answered: true;
      readonly role: Role;
      /** A replica's link to its primary (undefined: no primary configured). */
      readonly link: "up" | "down" | undefined;
      /** A replica parked away from its primary (it refused to follow it). */
      readonly parked: boolean;
      /** The replica's own probe of its primary, if it ran. */
      readonly probed: "ok" | "unreachable" | "restarted" | "fenced" | undefined;
    };

/** What the cycle has observed so far; a field left out is not known yet. */
export interface CycleObservation {
  /** Read the topology and write the heartbeat whatever changed (a command applied, a wake-up). */
  readonly force?: boolean;
  readonly database?: DatabaseObservation;
  /** The heartbeat the cycle would write; undefined with `database` known: nothing to write yet. */
  readonly heartbeat?: HeartbeatInput;
  /** A primary's synced replica whose node id the agent does not know yet (only the store tells). */
  readonly unknownReplica?: boolean;
  /** The database's role changed while the heartbeat was built (a command ran). */
  readonly roleChanged?: boolean;
}

/** Why a heartbeat is not written (`write` when it is). */
export type WriteVerdict = "write" | "nothing_to_write" | "primary_before_topology" | "role_changed";

export interface CyclePlan {
  /** Read the shard snapshot (the topology) this cycle; `because` says why, undefined when not. */
  readonly readTopology: boolean;
  readonly because: string | undefined;
  /** Doubt after this cycle's observation (monotonic ms since it began), undefined when none. */
  readonly doubtSince: number | undefined;
  /** Enforce the write guard this cycle: the database answered and the topology was read since start (or it restarted). */
  readonly guard: boolean;
  /** Raise it before the heartbeat goes out: the topology no longer confirms this primary. */
  readonly guardFirst: boolean;
  readonly writeHeartbeat: WriteVerdict;
  /** Once the heartbeat is written: whom to wake (undefined: nobody) and what `wokeFor` becomes. */
  readonly wake: { readonly reason: Wake["reason"]; readonly key: string } | undefined;
  readonly wokeFor: string | undefined;
  /** The next cycle's cadence after a healthy one, ms. */
  readonly cadenceMs: number;
}

/** Doubt this cycle: a crash report stands, or a replica's link is down or parked, or its probe failed. */
export function nextDoubtSince(
  state: AgentCycleState,
  database: DatabaseObservation,
  now: number,
): number | undefined {
  const replicaInDoubt =
    database.answered &&
    database.role === "replica" &&
    (database.parked ||
      database.link !== "up" ||
      (database.probed !== undefined && database.probed !== "ok"));
  return state.crash !== undefined || replicaInDoubt ? (state.doubtSince ?? now) : undefined;
}

/**
 * In doubt: heartbeats go out every DOUBT_HEARTBEAT_MS for at most DOUBT_WINDOW_TIMEOUTS failure
 * timeouts, so the controller sees a crash confirmed by both sides within a few hundred ms, and a
 * long outage costs no more writes than usual.
 */
export function inDoubt(doubtSince: number | undefined, timings: AgentCycleTimings, now: number): boolean {
  return doubtSince !== undefined && now - doubtSince < DOUBT_WINDOW_TIMEOUTS * timings.failureTimeoutMs;
}

/** The cadence after a healthy cycle: the heartbeat interval, DOUBT_HEARTBEAT_MS while in doubt. */
export function cadenceMs(doubtSince: number | undefined, timings: AgentCycleTimings, now: number): number {
  return inDoubt(doubtSince, timings, now)
    ? Math.min(timings.heartbeatIntervalMs, DOUBT_HEARTBEAT_MS)
    : timings.heartbeatIntervalMs;
}

/**
 * The longest this agent will go without writing again while nothing it reports changes (the
 * heartbeat's `keepalive_ms`). A primary: `primaryKeepaliveMs`. A replica with nothing to watch
 * (database up, following, link up, probe ok, the topology online with its primary fresh):
 * `replicaKeepaliveMs`; otherwise, like an agent whose database is down or dead, every cycle.
 */
export function keepaliveMs(
  state: AgentCycleState,
  timings: AgentCycleTimings,
  role: Role,
  now: number,
): number {
  const watching =
    !state.dbUp ||
    state.dbRestarted ||
    state.crash !== undefined ||
    state.doubtSince !== undefined ||
    state.topologyDoubt ||
    now < state.reportUntil;
  if (watching) return timings.heartbeatIntervalMs;
  return role === "primary" ? timings.primaryKeepaliveMs : timings.replicaKeepaliveMs;
}

/**
 * What a heartbeat reports, without what moves on its own (timestamps, the offset, the link's
 * last I/O, a crash report's latest sighting): a heartbeat whose signature equals the last one
 * written is written only at the keepalive.
 */
export function reportSignature(heartbeat: HeartbeatInput): string {
  const {
    last_updated: _updated,
    agent_updated: _agent,
    last_txn_id: _offset,
    lag_s: _lag,
    ttl: _ttl,
    db_crash: crash,
    ...stable
  } = heartbeat;
  const crashed = crash === undefined ? undefined : { ...crash, last_seen: undefined };
  return JSON.stringify({ ...stable, db_crash: crashed }, Object.keys({ ...stable, db_crash: 0 }).sort());
}

/**
 * Why the cycle reads the topology and writes whatever it reports, or undefined: forced, asked to,
 * never read or written, in doubt, the keepalive of the last heartbeat written would pass before the
 * next cycle; once the database was read, also a changed report or a replica the agent cannot name.
 */
function readReason(
  state: AgentCycleState,
  observation: CycleObservation,
  doubtSince: number | undefined,
  timings: AgentCycleTimings,
  now: number,
): string | undefined {
  if (observation.force === true) return "forced";
  if (state.storeRequested) return "requested";
  if (!state.topologyRead) return "topology never read";
  const last = state.lastWritten;
  if (last === undefined) return "nothing written yet";
  if (inDoubt(doubtSince, timings, now)) return "in doubt";
  if (now - last.at >= last.keepaliveMs - timings.heartbeatIntervalMs / 2) return "keepalive due";
  if (observation.unknownReplica === true) return "a replica the agent cannot name";
  const heartbeat = observation.heartbeat;
  if (heartbeat !== undefined && reportSignature(heartbeat) !== last.signature) return "report changed";
  return undefined;
}

/**
 * Whom to wake after writing `heartbeat`: the controller acts on a confirmed crash report, a
 * replica's link down or its probe failing soon; once per crash and per stretch of doubt. The
 * heartbeat is written first, so the controller's read finds it.
 */
export function planWake(
  heartbeat: HeartbeatInput,
  doubtSince: number | undefined,
  crash: CrashReport | undefined,
  wokeFor: string | undefined,
): { readonly wake: CyclePlan["wake"]; readonly wokeFor: string | undefined } {
  const reported = heartbeat.db_status === "down" ? heartbeat.db_crash : undefined;
  let wake: CyclePlan["wake"];
  if (reported !== undefined && reported.last_seen - reported.first_seen >= CRASH_CONFIRM_MS * 1000) {
    wake = { reason: "crash", key: `crash:${reported.first_seen}` };
  } else if (heartbeat.role === "replica" && heartbeat.primary_link === "down" && doubtSince !== undefined) {
    wake = { reason: "link_down", key: `link_down:${doubtSince}` };
  } else if (
    heartbeat.role === "replica" &&
    heartbeat.primary_probe !== undefined &&
    heartbeat.primary_probe !== "ok" &&
    doubtSince !== undefined
  ) {
    // A hung or fenced primary keeps the replication link up: only the probe tells.
    wake = { reason: "probe", key: `probe:${doubtSince}` };
  } else {
    return {
      wake: undefined,
      wokeFor: crash === undefined && doubtSince === undefined ? undefined : wokeFor,
    };
  }
  return wokeFor === wake.key ? { wake: undefined, wokeFor } : { wake, wokeFor: wake.key };
}

/** What a replica's topology read says of the primary it follows. */
export interface FollowedPrimary {
  readonly topology: Topology | undefined;
  /** The primary the topology names (the failover's target once past PROMOTE). */
  readonly named: { readonly node_id: string; readonly address: string } | undefined;
  /** host:port the replica's database follows. */
  readonly following: string | undefined;
  /** The named primary's heartbeat in the same snapshot. */
  readonly heartbeat: Heartbeat | undefined;
}

/**
 * A replica's topology read shows something to watch: the shard neither online nor paused, a
 * primary other than the one it follows, or that primary's heartbeat stale or its database down.
 * The replica then reports every cycle (`topologyDoubt`) until it reads otherwise.
 */
export function topologyToWatch(read: FollowedPrimary, timings: AgentCycleTimings, now: number): boolean {
  const { topology, named, heartbeat } = read;
  // Paused: no automatic action to report for (a switchover asks with REPORT).
  if (topology === undefined || (topology.status !== "online" && topology.status !== "paused")) return true;
  if (named === undefined || named.address !== read.following) return true;
  if (heartbeat === undefined || heartbeat.db_status !== "up") return true;
  return !isFresh(heartbeat, timings, now);
}

/** The plan of one cycle from what it observed so far (see the file's comment). */
export function planCycle(
  state: AgentCycleState,
  observation: CycleObservation,
  timings: AgentCycleTimings,
  now: number,
): CyclePlan {
  const { database, heartbeat } = observation;
  const doubtSince = database === undefined ? state.doubtSince : nextDoubtSince(state, database, now);
  const because = readReason(state, observation, doubtSince, timings, now);
  const answered = database?.answered === true;
  const guard = answered && (state.topologyRead || state.dbRestarted);
  const guardFirst =
    guard && database?.answered === true && database.role === "primary" && state.confirmed === false;
  const writeHeartbeat: WriteVerdict =
    heartbeat === undefined
      ? "nothing_to_write"
      : !state.topologyRead && heartbeat.role === "primary"
        ? "primary_before_topology"
        : observation.roleChanged === true
          ? "role_changed"
          : "write";
  const woken =
    heartbeat === undefined
      ? { wake: undefined, wokeFor: state.wokeFor }
      : planWake(heartbeat, doubtSince, state.crash, state.wokeFor);
  return {
    readTopology: because !== undefined,
    because,
    doubtSince,
    guard,
    guardFirst,
    writeHeartbeat,
    wake: woken.wake,
    wokeFor: woken.wokeFor,
    cadenceMs: cadenceMs(doubtSince, timings, now),
  };
}
