import { type ClockSample, clockStepBack } from "../core/clock-step.ts";
import type { Logger } from "../core/observability.ts";
import { PROMOTION_FENCE_WINDOW_MS } from "../core/write-guard.ts";
import type { ReplicationInfo } from "./redis-info.ts";

/** What the clock watch needs of its agent. */
export interface ClockWatchContext {
  readonly logger: Logger;
  readonly epochContext: Record<string, unknown>;
  monotonicNow(): number;
}

interface Watch {
  sample: ClockSample | undefined;
  /** Monotonic ms until which the primary stays fenced for a step. */
  fenceUntil: number;
  reason: string | undefined;
}

/**
 * How often a primary's agent reads its database's clock outside its heartbeat cycle, ms
 * (\`runClockWatch\`, src/agent/agent.ts): the longest a step goes unseen, plus one INFO round trip.
 */
export const CLOCK_WATCH_INTERVAL_MS = 250;

const watches = new WeakMap<ClockWatchContext, Watch>();

/**
 * Feeds one INFO of the agent's own database to its clock watch (src/core/clock-step.ts) and says
 * why the primary must stay fenced, or undefined. A backward step of the database host's clock
 * fences a primary for the step's upper bound plus the promotion window: by then Redis's guard
 * compares acknowledgement times on the stepped clock again (issue 30, finding 5). The fence then
 * lifts by itself: the write guard plans from this answer every cycle.
 */
export function clockStepFence(ctx: ClockWatchContext, info: ReplicationInfo): string | undefined {
  let watch = watches.get(ctx);
  if (watch === undefined) {
    watch = { sample: undefined, fenceUntil: Number.NEGATIVE_INFINITY, reason: undefined };
    watches.set(ctx, watch);
  }
  const sample = info.clock;
  // A read older than the last one judged (an INFO used late) or the same read again: nothing new.
  if (sample !== undefined && (watch.sample === undefined || sample.sentAtMs >= watch.sample.receivedAtMs)) {
    const step = clockStepBack(watch.sample, sample);
    watch.sample = sample;
    if (step !== undefined && info.role === "primary") {
      const fenceMs = Math.ceil(step.atMostMs) + PROMOTION_FENCE_WINDOW_MS;
      watch.fenceUntil = Math.max(watch.fenceUntil, ctx.monotonicNow() + fenceMs);
      watch.reason =
        `the database's clock stepped back ${Math.round(step.atLeastMs)}-${Math.round(step.atMostMs)} ms: its write guard` +
        ` would count a detached replica good that much longer; fenced for ${fenceMs} ms`;
      ctx.logger.error("database clock stepped back: writes fenced until the write guard's window is past", {
        ...ctx.epochContext,
        stepAtLeastMs: Math.round(step.atLeastMs),
        stepAtMostMs: Math.round(step.atMostMs),
        fenceMs,
      });
    }
  }
  return ctx.monotonicNow() < watch.fenceUntil ? watch.reason : undefined;
}
