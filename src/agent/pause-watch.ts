/**
 * Notices the times this process did not run: SIGSTOP, a frozen VM or container, a long GC pause,
 * CPU starvation. Every observation (a ticker's, or a caller's `mark`) records the monotonic time;
 * a gap longer than `thresholdMs` since the previous one was a pause. A slow call is no pause: the
 * ticker runs while the call waits.
 *
 * The heartbeat cycle asks it whether the process paused after its topology read began: a read
 * from before a pause says nothing of what the controller decided during it (the shard marked
 * offline for this very silence), while a heartbeat stamped after it says "now".
 */
export class PauseWatch {
  readonly thresholdMs: number;
  readonly #now: () => number;
  /** The last observation; undefined while the watch does not run. */
  #lastSeen: number | undefined;
  #lastPauseEnd = Number.NEGATIVE_INFINITY;
  #lastPauseMs = 0;
  #timer: ReturnType<typeof setInterval> | undefined;

  constructor(now: () => number, thresholdMs: number) {
    this.#now = now;
    this.thresholdMs = thresholdMs;
  }

  /** Starts the ticker (4 observations per threshold); a no-op when running. */
  start(): void {
    if (this.#timer !== undefined) return;
    this.#lastSeen = this.#now();
    this.#timer = setInterval(() => this.mark(), Math.max(1, Math.floor(this.thresholdMs / 4)));
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
    this.#lastSeen = undefined;
  }

  /** Observes the time now (monotonic ms, returned): a gap since the last observation was a pause. */
  mark(): number {
    const now = this.#now();
    if (this.#lastSeen === undefined) return now;
    if (now - this.#lastSeen > this.thresholdMs) {
      this.#lastPauseEnd = now;
      this.#lastPauseMs = now - this.#lastSeen;
    }
    this.#lastSeen = now;
    return now;
  }

  /**
   * How long the process paused after `since` (a `mark()` time), a pause not yet observed by the
   * ticker included; undefined when it did not, or the watch does not run.
   */
  pausedSince(since: number): number | undefined {
    this.mark();
    return this.#lastPauseEnd > since ? this.#lastPauseMs : undefined;
  }
}
