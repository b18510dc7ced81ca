/**
 * Capped exponential back-off with full jitter (AWS Architecture Blog, "Exponential Backoff
 * and Jitter"): the n-th consecutive failure waits a uniform random time in
 * [0, min(cap, base * 2^n)). Full jitter keeps several agents that failed together from
 * retrying together.
 */
export interface BackoffOptions {
  /** Delay ceiling for the first retry, ms. */
  readonly baseMs: number;
  /** Largest delay ever returned, ms. */
  readonly capMs: number;
  /** Smallest delay ever returned, ms, so that a tight failure loop cannot spin. @default 0 */
  readonly floorMs?: number;
  /** Uniform random number in [0, 1). @default Math.random */
  readonly random?: () => number;
}

export class Backoff {
  private failures = 0;
  private readonly options: BackoffOptions;

  constructor(options: BackoffOptions) {
    if (options.baseMs <= 0 || options.capMs < options.baseMs) {
      throw new RangeError(`back-off needs 0 < baseMs <= capMs, got ${options.baseMs} and ${options.capMs}`);
    }
    this.options = options;
  }

  /** Consecutive failures since the last reset. */
  get attempts(): number {
    return this.failures;
  }

  /** Records one more failure and returns how long to wait before the next attempt. */
  next(): number {
    const { baseMs, capMs, floorMs = 0, random = Math.random } = this.options;
    // 2^failures overflows to Infinity long after the cap is reached; Math.min keeps it finite.
    const ceiling = Math.min(capMs, baseMs * 2 ** this.failures);
    this.failures++;
    return Math.max(floorMs, Math.floor(random() * ceiling));
  }

  reset(): void {
    this.failures = 0;
  }
}

/** Resolves after `ms`, or at once (without rejecting) when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
