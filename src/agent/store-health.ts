import { errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";

/**
 * Whether the coordination store answers this agent, and since when it did not: the outage's
 * start, and the time of the last heartbeat that ended one of at least the failure timeout
 * (`store_resumed_at`, by which the controller waits for the agents the same outage holds back).
 */
export class StoreHealth {
  up = true;
  /** AWS-aligned ms of the first failed store call of the current outage; undefined while it answers. */
  failingSince: number | undefined;
  /** µs of the last heartbeat that ended an outage of at least the failure timeout. */
  resumedAt: number | undefined;
  readonly #logger: Logger;
  readonly #failureTimeoutMs: number;
  readonly #count: (what: string) => void;

  constructor(logger: Logger, failureTimeoutMs: number, count: (what: string) => void) {
    this.#logger = logger;
    this.#failureTimeoutMs = failureTimeoutMs;
    this.#count = count;
  }

  /** A store call failed at AWS-aligned `nowMs`. */
  failed(what: string, error: unknown, nowMs: number): void {
    this.#count(what);
    this.failingSince ??= nowMs;
    if (this.up)
      this.#logger.warn("coordination store unreachable", { operation: what, error: errorMessage(error) });
    this.up = false;
  }

  answered(): void {
    if (!this.up) this.#logger.info("coordination store reachable again");
    this.up = true;
  }

  /**
   * `store_resumed_at` for the heartbeat written at `nowMs`: this write's own time when it ends an
   * outage of at least the failure timeout, else this process's last such return (the controller
   * looks only at recent ones).
   */
  resumedAtFor(nowMs: number): number | undefined {
    const since = this.failingSince;
    if (since !== undefined && nowMs - since >= this.#failureTimeoutMs) return Math.floor(nowMs * 1000);
    return this.resumedAt;
  }

  /** A heartbeat carrying `resumedAt` (`resumedAtFor` its time) went through: the outage, if any, is over. */
  heartbeatWritten(resumedAt: number | undefined): void {
    this.resumedAt = resumedAt;
    this.failingSince = undefined;
  }
}
