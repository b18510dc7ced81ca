import { describe, expect, it } from "vitest";
import { AuthThrottle } from "../../src/agent/sentinel-throttle.ts";

/** A clock the test moves by hand. */
function aClock() {
  const clock = { now: 0, read: () => clock.now };
  return clock;
}

describe("back-off for wrong Sentinel passwords", () => {
  it("lets a few mistakes through, then blocks the address twice as long after each further one, up to the cap", () => {
    // Prepare
    const clock = aClock();
    const throttle = new AuthThrottle(clock.read, { freeFailures: 2, baseBlockMs: 1000, maxBlockMs: 4000 });

    // Act
    const waits: number[] = [];
    for (let attempt = 0; attempt < 6; attempt++) {
      throttle.failed("10.0.0.9");
      waits.push(throttle.blockedFor("10.0.0.9"));
    }

    // Assess
    expect(waits).toEqual([0, 0, 1000, 2000, 4000, 4000]);
    expect(throttle.blockedFor("10.0.0.10")).toBe(0);
  });

  it("lifts the block when it expires and forgets an address quiet for long enough", () => {
    // Prepare
    const clock = aClock();
    const throttle = new AuthThrottle(clock.read, {
      freeFailures: 0,
      baseBlockMs: 1000,
      forgetAfterMs: 5000,
    });
    throttle.failed("10.0.0.9");

    // Act
    clock.now = 999;
    const during = throttle.blockedFor("10.0.0.9");
    clock.now = 1000;
    const after = throttle.blockedFor("10.0.0.9");
    clock.now = 6001;
    const forgotten = throttle.blockedFor("10.0.0.9");

    // Assess
    expect([during, after, forgotten]).toEqual([1, 0, 0]);
    expect(throttle.addresses).toBe(0);
  });

  it("forgets an address once it gives the right password", () => {
    const throttle = new AuthThrottle(aClock().read, { freeFailures: 1 });
    throttle.failed("10.0.0.9");
    throttle.succeeded("10.0.0.9");
    expect(throttle.addresses).toBe(0);
  });

  it("remembers at most maxAddresses, forgetting the oldest first", () => {
    // Prepare
    const throttle = new AuthThrottle(aClock().read, { freeFailures: 0, maxAddresses: 100 });

    // Act
    for (let n = 0; n < 1000; n++) throttle.failed(`10.0.${n >> 8}.${n & 255}`);

    // Assess
    expect(throttle.addresses).toBe(100);
    expect(throttle.blockedFor("10.0.0.0")).toBe(0);
    expect(throttle.blockedFor("10.0.3.231")).toBeGreaterThan(0);
  });
});
