import { setTimeout as pause } from "node:timers/promises";

/**
 * The one way tests wait: poll a condition until it holds or a deadline passes.
 *
 * `waitFor` is for "this must happen": it returns as soon as `probe` gives a value (anything but
 * `undefined` or `false`) and fails with `what` once `timeoutMs` is spent.
 *
 * `holdsFor` is for "this must NOT happen": a negative check needs an observation window, so it
 * polls `check` for `windowMs` and fails the moment the condition breaks. Each caller says why its
 * window is long enough.
 */
export async function waitFor<T>(
  probe: () => Promise<T | undefined | false> | T | undefined | false,
  what: string,
  timeoutMs = 10_000,
  intervalMs = 50,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await probe();
      if (value !== undefined && value !== false) return value;
    } catch (error) {
      lastError = error;
    }
    await pause(intervalMs);
  }
  throw new Error(
    `timed out after ${timeoutMs} ms waiting for ${what}${lastError ? `: ${String(lastError)}` : ""}`,
  );
}

/** Polls `check` for `windowMs`; throws as soon as it is false (or throws), naming `what`. */
export async function holdsFor(
  check: () => Promise<boolean> | boolean,
  what: string,
  windowMs: number,
  intervalMs = 50,
): Promise<void> {
  const started = Date.now();
  const deadline = started + windowMs;
  for (;;) {
    let held: boolean;
    try {
      held = await check();
    } catch (error) {
      throw new Error(`${what} stopped holding after ${Date.now() - started} ms: ${String(error)}`);
    }
    if (!held) throw new Error(`${what} stopped holding after ${Date.now() - started} ms`);
    const left = deadline - Date.now();
    if (left <= 0) return;
    await pause(Math.min(intervalMs, left));
  }
}
