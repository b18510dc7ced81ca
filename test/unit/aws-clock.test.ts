import { describe, expect, it } from "vitest";
import { AwsClock, type TimeSource } from "../../src/adapters/clock.ts";

/** A host whose wall clock is `skew` ms off AWS time and whose monotonic clock starts at 0. */
class FakeHost implements TimeSource {
  aws = Date.UTC(2030, 0, 1, 12, 0, 0, 250);
  mono = 0;
  skew: number;
  constructor(skew: number) {
    this.skew = skew;
  }
  wallNow(): number {
    return this.aws + this.skew;
  }
  monotonicNow(): number {
    return this.mono;
  }
  advance(ms: number): void {
    this.aws += ms;
    this.mono += ms;
  }
  /** One request taking `rttMs`, answered by AWS at mid-flight with a whole-second Date header. */
  request(clock: AwsClock, rttMs: number): void {
    const sentAt = this.mono;
    this.advance(rttMs / 2);
    const date = new Date(Math.floor(this.aws / 1000) * 1000).toUTCString();
    this.advance(rttMs / 2);
    clock.observe(date, sentAt, this.mono);
  }
}

describe("AWS-aligned clock", () => {
  it("uses the host clock plus the SDK's offset before any response", () => {
    const host = new FakeHost(5000);
    const clock = new AwsClock({ source: host, sdkOffset: () => -5000 });
    expect(clock.now()).toBe(host.aws);
  });

  it("reads the host's own time when the host is in sync with AWS", () => {
    // Prepare
    const host = new FakeHost(3);
    const clock = new AwsClock({ source: host });

    // Act
    host.request(clock, 20);

    // Assess
    expect(clock.now()).toBe(host.wallNow());
  });

  it.each([60_000, -60_000, 10 * 60_000])(
    "pulls a host clock %i ms off to within a second of AWS time",
    (skew) => {
      // Prepare
      const host = new FakeHost(skew);
      const clock = new AwsClock({ source: host });

      // Act
      host.request(clock, 20);

      // Assess
      expect(Math.abs(clock.now() - host.aws)).toBeLessThanOrEqual(1020);
    },
  );

  it("narrows to the round trip after responses at different points of the second", () => {
    // Prepare
    const host = new FakeHost(-7000);
    const clock = new AwsClock({ source: host });

    // Act
    for (let index = 0; index < 24; index += 1) {
      host.request(clock, 10);
      host.advance(1000 + 47);
    }

    // Assess
    const bounds = clock.offsetBounds();
    expect((bounds?.highMs ?? 0) - (bounds?.lowMs ?? 0)).toBeLessThan(100);
    expect(Math.abs(clock.now() - host.aws)).toBeLessThan(100);
  });

  it("is not moved by a host clock that steps after it was aligned", () => {
    // Prepare
    const host = new FakeHost(0);
    const clock = new AwsClock({ source: host });
    for (let index = 0; index < 12; index += 1) {
      host.request(clock, 10);
      host.advance(1000 + 83);
    }

    // Act: NTP (or an operator) steps the wall clock 30 s forward; the monotonic clock does not move.
    host.skew = 30_000;

    // Assess
    expect(Math.abs(clock.now() - host.aws)).toBeLessThan(100);
  });

  it("starts over when a response contradicts what it knew", () => {
    // Prepare
    const host = new FakeHost(0);
    const clock = new AwsClock({ source: host });
    host.request(clock, 10);

    // Act: the process was frozen for 10 s while monotonic time did not advance (a suspended VM).
    host.aws += 10_000;
    host.request(clock, 10);

    // Assess
    expect(Math.abs(clock.now() - host.aws)).toBeLessThanOrEqual(1010);
  });
});
