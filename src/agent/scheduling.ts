import { CoordinationUnavailable, errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import { sleep } from "./backoff.ts";

/**
 * A self-rescheduling loop that a throwing body cannot kill: the body returns how long to wait
 * before its next run; an exception is logged and retried after `onErrorDelayMs`.
 */
export async function runLoop(
  name: string,
  signal: AbortSignal,
  logger: Logger,
  body: () => Promise<number>,
  onErrorDelayMs: () => number,
): Promise<void> {
  while (!signal.aborted) {
    let delay: number;
    try {
      delay = await body();
    } catch (error) {
      logger.error(`${name} failed; retrying`, { error: errorMessage(error) });
      delay = onErrorDelayMs();
    }
    await sleep(delay, signal);
  }
}

/** Runs critical sections one at a time, in arrival order. */
export class Mutex {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(section: () => Promise<T>): Promise<T> {
    const result = this.tail.then(section, section);
    // The chain must survive a failing section.
    this.tail = result.catch(() => {});
    return result;
  }
}

/**
 * Bounds a coordination-store call: a call that hangs counts as the store being unreachable.
 * The call itself goes on in the background; its late answer is ignored.
 */
export function withStoreTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new CoordinationUnavailable(`${what} did not answer within ${ms} ms`)),
      ms,
    );
  });
  // A late rejection after the timeout won must not surface as unhandled.
  promise.catch(() => {});
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
