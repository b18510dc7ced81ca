import { afterEach, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../src/adapters/observability.ts";
import { Backoff, sleep } from "../../src/agent/backoff.ts";
import { Mutex, runLoop, withStoreTimeout } from "../../src/agent/scheduling.ts";

afterEach(() => {
  vi.useRealTimers();
});

describe("capped exponential back-off with full jitter", () => {
  it("doubles the ceiling per failure up to the cap", () => {
    // Prepare: a random source at its maximum shows each ceiling.
    const backoff = new Backoff({ baseMs: 100, capMs: 1000, random: () => 0.999999 });

    // Act
    const delays = Array.from({ length: 6 }, () => backoff.next());

    // Assess
    expect(delays).toEqual([99, 199, 399, 799, 999, 999]);
  });

  it("spreads delays over the whole range below the ceiling", () => {
    // Prepare
    const backoff = new Backoff({ baseMs: 1000, capMs: 1000 });

    // Act
    const delays = Array.from({ length: 200 }, () => backoff.next());

    // Assess
    expect(Math.min(...delays)).toBeLessThan(200);
    expect(Math.max(...delays)).toBeGreaterThan(800);
    expect(delays.every((delay) => delay >= 0 && delay < 1000)).toBe(true);
  });

  it("starts over after a reset and never goes below its floor", () => {
    // Prepare
    const backoff = new Backoff({ baseMs: 100, capMs: 5000, floorMs: 50, random: () => 0 });
    backoff.next();
    backoff.next();

    // Act
    backoff.reset();

    // Assess
    expect(backoff.attempts).toBe(0);
    expect(backoff.next()).toBe(50);
  });

  it("refuses a cap below its base", () => {
    expect(() => new Backoff({ baseMs: 100, capMs: 10 })).toThrowError(RangeError);
  });
});

describe("agent loops", () => {
  it("keeps running a loop whose body throws", async () => {
    // Prepare
    vi.useFakeTimers();
    const controller = new AbortController();
    let runs = 0;
    const loop = runLoop(
      "test",
      controller.signal,
      silentLogger,
      async () => {
        runs++;
        if (runs % 2 === 1) throw new Error("boom");
        return 100;
      },
      () => 100,
    );

    // Act
    await vi.advanceTimersByTimeAsync(1000);
    controller.abort();
    await loop;

    // Assess
    expect(runs).toBeGreaterThanOrEqual(10);
  });

  it("wakes a sleeping loop at once when it is stopped", async () => {
    // Prepare
    vi.useFakeTimers();
    const controller = new AbortController();
    const sleeping = sleep(60_000, controller.signal);

    // Act
    controller.abort();

    // Assess
    await expect(sleeping).resolves.toBeUndefined();
  });

  it("runs critical sections one at a time even when one fails", async () => {
    // Prepare
    const mutex = new Mutex();
    const order: string[] = [];
    const section =
      (name: string, fail = false) =>
      async () => {
        order.push(`${name}:start`);
        // Yield to the event loop: the other section would interleave here without the mutex.
        await new Promise((resolve) => setImmediate(resolve));
        order.push(`${name}:end`);
        if (fail) throw new Error(name);
      };

    // Act
    const results = await Promise.allSettled([mutex.run(section("a", true)), mutex.run(section("b"))]);

    // Assess
    expect(order).toEqual(["a:start", "a:end", "b:start", "b:end"]);
    expect(results.map((result) => result.status)).toEqual(["rejected", "fulfilled"]);
  });

  it("counts a store call that hangs as the store being unavailable", async () => {
    // Prepare
    vi.useFakeTimers();
    const hanging = withStoreTimeout(new Promise(() => {}), 500, "heartbeat write");
    const assertion = expect(hanging).rejects.toMatchObject({
      name: "CoordinationUnavailable",
      message: "heartbeat write did not answer within 500 ms",
    });

    // Act
    await vi.advanceTimersByTimeAsync(500);

    // Assess
    await assertion;
  });
});
