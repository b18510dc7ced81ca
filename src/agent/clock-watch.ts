import { type ClockSample, clockStepBack, clockStepForward } from "../core/clock-step.ts";
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
  /** Monotonic ms until which the replicas' lag is not trusted after a forward step. */
  freezeUntil: number;
  freezeReason: string | undefined;
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
    watch = {
      sample: undefined,
      fenceUntil: Number.NEGATIVE_INFINITY,
      reason: undefined,
      freezeUntil: Number.NEGATIVE_INFINITY,
      freezeReason: undefined,
    };
    watches.set(ctx, watch);
  }
  const sample = info.clock;
  // A forward step is judged on every read, even one that overlaps or precedes the last one judged
  // (its bound holds in any order): the write guard plans from this read's lags. Nemesis seed 7381:
  // a cycle's INFO sent before the watch's read arrived would otherwise go unjudged.
  if (sample !== undefined) freezeOnForwardStep(ctx, watch, sample);
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

/**
 * How long the replicas' lag is not trusted after a forward step of the database's clock, ms. Each
 * replica sends `REPLCONF ACK` once a second, which restamps its `repl_ack_time` on the new clock:
 * the promotion window (GUARD_MAX_LAG_S + 2 s + the cron's slack) outlasts the first ACK of every
 * replica that still acknowledges, so a lag read after it is true again. Not "until every replica
 * was re-read": INFO's whole-second lag cannot tell a restamped replica from a late one.
 */
export const FORWARD_STEP_FREEZE_MS = PROMOTION_FENCE_WINDOW_MS;

function freezeOnForwardStep(ctx: ClockWatchContext, watch: Watch, sample: ClockSample): void {
  const step = clockStepForward(watch.sample, sample);
  if (step === undefined) return;
  const freezeUntil = ctx.monotonicNow() + FORWARD_STEP_FREEZE_MS;
  if (freezeUntil <= watch.freezeUntil) return;
  watch.freezeUntil = freezeUntil;
  watch.freezeReason =
    `the database's clock stepped forward ${Math.round(step.atLeastMs)}-${Math.round(step.atMostMs)} ms: its replicas'` +
    ` lag reads that much too high until each acknowledges again; replica set frozen for ${FORWARD_STEP_FREEZE_MS} ms`;
  ctx.logger.warn(
    "database clock stepped forward: the replica set keeps its members and counts every online replica until each acknowledges again",
    {
      ...ctx.epochContext,
      stepAtLeastMs: Math.round(step.atLeastMs),
      stepAtMostMs: Math.round(step.atMostMs),
      freezeMs: FORWARD_STEP_FREEZE_MS,
    },
  );
}

/**
 * Why the replicas' INFO lag is not to be trusted now, or undefined: a forward step of the
 * database's clock was seen less than FORWARD_STEP_FREEZE_MS ago (\`clockStepFence\` judges the
 * reads). Meanwhile the write guard counts every online replica as acknowledging and drops no
 * member (guarantee 1: \`WAIT\` counts them by offset); it ends by itself, holding no fence.
 */
export function clockStepFreeze(ctx: ClockWatchContext): string | undefined {
  const watch = watches.get(ctx);
  if (watch === undefined) return undefined;
  return ctx.monotonicNow() < watch.freezeUntil ? watch.freezeReason : undefined;
}
