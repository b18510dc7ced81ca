import type { Heartbeat } from "./model.ts";

/**
 * Every judgement of a timestamp: how old a report is, and whether it still counts. One formula
 * (`isWithin`), used by the decision (decide/view.ts), the agent, the Sentinel endpoint and the
 * status view (node-age.ts); every window is the failure timeout, or a node's keepalive plus it.
 * Timestamps are µs on the AWS-aligned clock (src/adapters/clock.ts); `now` is ms on the same.
 */

/**
 * How far ahead of the reader's clock a timestamp may be dated and still count, in ms.
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

/** The timings the windows are made of. */
export interface FreshnessTimings {
  /** A report older than this is no evidence about now (`failureTimeoutMs` of the config and the agent). */
  readonly failureTimeoutMs: number;
}

/** Age of a µs timestamp at `now`, in ms (negative: dated ahead of `now`). */
export function ageOfMs(timestampMicros: number, now: number): number {
  return now - timestampMicros / 1000;
}

/**
 * The one currency rule: a timestamp (µs) counts at `now` while it is at most `windowMs` old and
 * dated at most MAX_CLOCK_SKEW_MS ahead of `now`. So the reader's times at which it counts form
 * one interval `[t - MAX_CLOCK_SKEW_MS, t + windowMs]`: no timestamp, however far in the future,
 * counts for longer than `windowMs + MAX_CLOCK_SKEW_MS`, while one from a clock within the
 * design's bound always counts exactly as its age says.
 */
export function isWithin(timestampMicros: number, windowMs: number, now: number): boolean {
  const ageMs = ageOfMs(timestampMicros, now);
  return ageMs <= windowMs && ageMs >= -MAX_CLOCK_SKEW_MS;
}

/** Within the failure timeout (`isWithin`). */
export function isRecent(timestampMicros: number, timings: FreshnessTimings, now: number): boolean {
  return isWithin(timestampMicros, timings.failureTimeoutMs, now);
}

/** Age of a heartbeat's database-alive timestamp, in ms (negative: dated ahead of `now`). */
export function heartbeatAgeMs(heartbeat: Heartbeat, now: number): number {
  return ageOfMs(heartbeat.last_updated, now);
}

/** When the agent last wrote, whatever its database's state (µs); older heartbeats: `last_updated`. */
export function agentWrittenAt(heartbeat: Heartbeat): number {
  return heartbeat.agent_updated ?? heartbeat.last_updated;
}

/** ms since the agent last wrote, whatever its database's state (\`agent_updated\`). */
export function agentAgeMs(heartbeat: Heartbeat, now: number): number {
  return ageOfMs(agentWrittenAt(heartbeat), now);
}

/**
 * How long a report of a node that keeps silent for up to \`keepaliveMs\` while nothing it reports
 * changes (a quiet replica) still stands: its keepalive plus the failure timeout.
 */
export function reportWindowMs(keepaliveMs: number | undefined, timings: FreshnessTimings): number {
  return (keepaliveMs ?? 0) + timings.failureTimeoutMs;
}

/**
 * Fresh: the database answered within `failureTimeoutMs`. A heartbeat dated more than
 * MAX_CLOCK_SKEW_MS in the future is not fresh (see `isWithin`).
 */
export function isFresh(heartbeat: Heartbeat, timings: FreshnessTimings, now: number): boolean {
  return isRecent(heartbeat.last_updated, timings, now);
}

/**
 * The agent itself was heard within `failureTimeoutMs` (its last write, whatever its database's
 * state), by the same rule as `isFresh`. Heartbeats written before `agent_updated` existed count
 * by `last_updated`.
 */
export function isAgentHeard(heartbeat: Heartbeat, timings: FreshnessTimings, now: number): boolean {
  return isRecent(agentWrittenAt(heartbeat), timings, now);
}

/**
 * The agent's last report still stands: it was written within its keepalive (\`keepalive_ms\`, the
 * longest the agent stays silent while nothing it reports changes) plus \`failureTimeoutMs\`
 * (\`reportWindowMs\`). A quiet replica writes only on a change and at its keepalive, so its silence
 * is no evidence of failure until then; its offset, though, is as old as the write.
 */
export function isReportCurrent(heartbeat: Heartbeat, timings: FreshnessTimings, now: number): boolean {
  return isWithin(agentWrittenAt(heartbeat), reportWindowMs(heartbeat.keepalive_ms, timings), now);
}

/**
 * The database's last answer still stands for a node that writes at its keepalive: it answered
 * within its keepalive plus the failure timeout (the Sentinel endpoint's view of a replica).
 */
export function isAnswerCurrent(heartbeat: Heartbeat, timings: FreshnessTimings, now: number): boolean {
  return isWithin(heartbeat.last_updated, reportWindowMs(heartbeat.keepalive_ms, timings), now);
}
