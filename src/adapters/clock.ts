import type { Pluggable } from "@smithy/types";
import type { Clock } from "../core/ports.ts";

/** Where the clock reads time; injectable so tests can skew the host clock. */
export interface TimeSource {
  /** Host wall clock, ms since 1970 (may be skewed or step). */
  wallNow(): number;
  /** Monotonic ms from an arbitrary origin (never steps). */
  monotonicNow(): number;
}

export const systemTimeSource: TimeSource = {
  wallNow: () => Date.now(),
  monotonicNow: () => performance.now(),
};

/** Bounds on AWS time expressed as `monotonicNow() + offset`. */
interface Bounds {
  low: number;
  high: number;
  /** monotonicNow() when the bounds were last narrowed; drift widens them from there. */
  at: number;
}

/** HTTP Date headers have one-second resolution. */
const DATE_RESOLUTION_MS = 1000;

/**
 * A clock aligned with AWS, so that a host whose clock is skewed neither fakes nor hides a stale
 * heartbeat: agents stamp heartbeats and the controller measures their age on the same (AWS) time.
 *
 * How: the SDK already measures its offset to AWS from the `Date` header of every response
 * (`client.config.systemClockOffset`, used to sign requests), but with one-second resolution and
 * no error bound. This clock reads the same header through middleware together with the
 * monotonic instants the request left and the response arrived: AWS time at `received` lies in
 * `[date, date + 1 s + (received - sent)]`. Intersecting these intervals over many responses
 * narrows them; they widen with elapsed time by a drift allowance. `now()` is the host wall clock
 * clamped into the interval: a well-synced host reads its exact time, a skewed one is pulled to
 * within the interval's width of AWS time, and a host clock that steps cannot leave it. Before the
 * first response it falls back to the host clock plus the SDK's offset. A sample that contradicts
 * the interval (AWS never steps, so a bad sample or a suspended VM) restarts it.
 */
export class AwsClock implements Clock {
  readonly #source: TimeSource;
  readonly #sdkOffset: () => number;
  readonly #driftPerMs: number;
  #bounds: Bounds | undefined;
  #samples = 0;

  constructor(
    options: {
      source?: TimeSource;
      /** The SDK's measured offset (ms, AWS minus host), used until the first sample. */
      sdkOffset?: () => number;
      /** How fast the monotonic clock may drift from AWS time. @default 100 ppm */
      driftPpm?: number;
    } = {},
  ) {
    this.#source = options.source ?? systemTimeSource;
    this.#sdkOffset = options.sdkOffset ?? (() => 0);
    this.#driftPerMs = (options.driftPpm ?? 100) / 1_000_000;
  }

  now(): number {
    const wall = this.#source.wallNow();
    const mono = this.#source.monotonicNow();
    const bounds = this.#widened(mono);
    if (!bounds) return wall + this.#sdkOffset();
    return Math.round(Math.min(Math.max(wall, mono + bounds.low), mono + bounds.high));
  }

  /** µs on the same clock, for heartbeat `last_updated`. */
  nowMicros(): number {
    return this.now() * 1000;
  }

  /** The current bounds on `AWS time - host wall time`, in ms, for diagnostics and logs. */
  offsetBounds(): { lowMs: number; highMs: number; samples: number } | undefined {
    const mono = this.#source.monotonicNow();
    const bounds = this.#widened(mono);
    if (!bounds) return undefined;
    const wall = this.#source.wallNow();
    return { lowMs: mono + bounds.low - wall, highMs: mono + bounds.high - wall, samples: this.#samples };
  }

  /** Feeds one response: its `Date` header and the monotonic instants the request was sent and answered. */
  observe(dateHeader: string, sentAt: number, receivedAt: number): void {
    const serverTime = Date.parse(dateHeader);
    if (Number.isNaN(serverTime) || receivedAt < sentAt) return;
    const sample = { low: serverTime - receivedAt, high: serverTime + DATE_RESOLUTION_MS - sentAt };
    const current = this.#widened(receivedAt);
    this.#samples += 1;
    if (current && current.low <= sample.high && sample.low <= current.high) {
      this.#bounds = {
        low: Math.max(current.low, sample.low),
        high: Math.min(current.high, sample.high),
        at: receivedAt,
      };
    } else {
      this.#bounds = { ...sample, at: receivedAt };
    }
  }

  /** Middleware that feeds this clock from every response of a client. */
  plugin<Input extends object, Output extends object>(): Pluggable<Input, Output> {
    return {
      applyToStack: (stack) => {
        stack.add(
          (next) => async (args) => {
            const sentAt = this.#source.monotonicNow();
            const result = await next(args);
            const headers = (result.response as { headers?: Record<string, string> } | undefined)?.headers;
            const date = headers?.date ?? headers?.Date;
            if (date) this.observe(date, sentAt, this.#source.monotonicNow());
            return result;
          },
          { step: "deserialize", priority: "low", name: "shardguardAwsClock", override: true },
        );
      },
    };
  }

  #widened(mono: number): Bounds | undefined {
    const bounds = this.#bounds;
    if (!bounds) return undefined;
    const drift = Math.abs(mono - bounds.at) * this.#driftPerMs;
    return { low: bounds.low - drift, high: bounds.high + drift, at: bounds.at };
  }
}
