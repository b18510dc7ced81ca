import { vi } from "vitest";

/** Settles `work` under fake timers, moving the clock on while it waits (phase polls, timeouts). */
export async function settled<T>(work: Promise<T>): Promise<T> {
  let done = false;
  const tracked = work.finally(() => {
    done = true;
  });
  for (let step = 0; step < 1000 && !done; step++) await vi.advanceTimersByTimeAsync(50);
  return tracked;
}
