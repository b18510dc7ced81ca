/**
 * A backward step of a database host's wall clock, seen from two `INFO` reads (issue 30, finding 5).
 *
 * Redis's write guard counts a replica good while `unixtime - repl_ack_time <= min-replicas-max-lag`
 * on the primary's own wall clock: a step back of S seconds keeps a detached replica counted for S
 * seconds more than the promotion window assumes, so a primary cut off with its replicas promoted
 * elsewhere could take writes that long. The primary's agent reads `server_time_usec` with every
 * INFO and fences for the step plus the promotion window when the clock went back.
 *
 * Sound under pauses: each read is bracketed by the agent's monotonic send and receive instants,
 * so the real time between the two server readings is at least `sent2 - received1`. A server
 * clock that advanced less than that, by more than the tolerance, stepped back; a paused agent or
 * a hung database only widens the brackets, never fakes a step.
 */

/** One INFO read: the server's `server_time_usec` (as ms) and the agent's monotonic brackets. */
export interface ClockSample {
  readonly serverTimeMs: number;
  readonly sentAtMs: number;
  readonly receivedAtMs: number;
}

/** Steps smaller than this are not acted on: within Redis's whole-second compare. */
export const CLOCK_STEP_TOLERANCE_MS = 1000;

/** A step between two reads (back or forward), ms, bounded from below and above. */
export interface ClockStep {
  /** The step is at least this. */
  readonly atLeastMs: number;
  /** And at most this (the brackets' widths added). */
  readonly atMostMs: number;
}

/** The backward step between `previous` and `next`, or undefined when none beyond the tolerance is proven. */
export function clockStepBack(
  previous: ClockSample | undefined,
  next: ClockSample,
  toleranceMs = CLOCK_STEP_TOLERANCE_MS,
): ClockStep | undefined {
  if (previous === undefined || next.sentAtMs < previous.receivedAtMs) return undefined;
  const atLeastMs = next.sentAtMs - previous.receivedAtMs - (next.serverTimeMs - previous.serverTimeMs);
  return beyondTolerance(atLeastMs, previous, next, toleranceMs);
}

/** A step proven to be at least \`atLeastMs\`, bounded above by the two reads' bracket widths. */
function beyondTolerance(
  atLeastMs: number,
  previous: ClockSample,
  next: ClockSample,
  toleranceMs: number,
): ClockStep | undefined {
  if (!(atLeastMs > toleranceMs)) return undefined;
  const widths = previous.receivedAtMs - previous.sentAtMs + (next.receivedAtMs - next.sentAtMs);
  return { atLeastMs, atMostMs: atLeastMs + widths };
}

/**
 * The forward step between `previous` and `next`, or undefined when none beyond the tolerance is
 * proven: the server's clock advanced more than the longest real time between the two readings
 * (`next.receivedAtMs - previous.sentAtMs`). That bound holds whatever the order of the reads, so
 * a read that overlaps the previous one is judged too. After a forward step Redis reports every
 * replica's `lag` (`unixtime - repl_ack_time`) that much too high until its next `REPLCONF ACK`
 * (once a second), while `WAIT` still counts it (offsets, not time): an agent that reads the lag to
 * decide whom its write guard demands would leave out a replica that acknowledges writes. Nemesis
 * seed 7381 (guarantee 1): a heal stepped node-42a's clock forward 9 s 0.25 s before its promotion
 * fence lifted with an empty replica set; node-9r acknowledged 14 writes as nobody's member, and
 * they were lost. Redis's own count only refuses more while the lag reads high (safe).
 */
export function clockStepForward(
  previous: ClockSample | undefined,
  next: ClockSample,
  toleranceMs = CLOCK_STEP_TOLERANCE_MS,
): ClockStep | undefined {
  if (previous === undefined) return undefined;
  const atLeastMs = next.serverTimeMs - previous.serverTimeMs - (next.receivedAtMs - previous.sentAtMs);
  return beyondTolerance(atLeastMs, previous, next, toleranceMs);
}
