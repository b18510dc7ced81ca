import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { mean, median, percentile, summarize } from "../../bench/lib/stats.ts";

describe("benchmark statistics", () => {
  it("takes the middle value as the median of an odd count, whatever the input order", () => {
    // Act
    const value = median([5, 1, 9, 3, 7]);

    // Assess
    expect(value).toBe(5);
  });

  it("averages the two middle values as the median of an even count", () => {
    // Act
    const value = median([4000, 4300, 4100, 4200]);

    // Assess
    expect(value).toBe(4150);
  });

  it("reports the maximum as nearest-rank p99 of fewer than 100 values", () => {
    // Prepare
    const tenTrials = [4210, 4190, 4255, 4301, 4220, 5900, 4230, 4205, 4240, 4215];

    // Act
    const p99 = percentile(tenTrials, 99);

    // Assess
    expect(p99).toBe(5900);
  });

  it("picks rank ceil(p/100 * n) for nearest-rank percentiles", () => {
    // Prepare
    const hundred = Array.from({ length: 100 }, (_, index) => 100 - index);
    const twoHundred = Array.from({ length: 200 }, (_, index) => index + 1);

    // Act and Assess
    expect(percentile(hundred, 99)).toBe(99);
    expect(percentile(twoHundred, 99)).toBe(198);
    expect(percentile([15, 20, 35, 40, 50], 30)).toBe(20);
    expect(percentile([15, 20, 35, 40, 50], 100)).toBe(50);
  });

  it("always returns a measured value between min and max for any series", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 100_000 }), { minLength: 1, maxLength: 60 }),
        fc.integer({ min: 1, max: 100 }),
        (values, p) => {
          const value = percentile(values, p);
          expect(values).toContain(value);
          expect(value).toBeGreaterThanOrEqual(Math.min(...values));
          expect(value).toBeLessThanOrEqual(Math.max(...values));
        },
      ),
    );
  });

  it("summarizes count, min, max, mean, median and p99 together", () => {
    // Act
    const summary = summarize([3, 1, 2, 10]);

    // Assess
    expect(summary).toEqual({ count: 4, min: 1, max: 10, mean: 4, median: 2.5, p99: 10 });
    expect(mean([1, 2, 3])).toBe(2);
  });

  it("summarizes an empty series as undefined but refuses single statistics of one", () => {
    // Act and Assess
    expect(summarize([])).toBeUndefined();
    expect(() => median([])).toThrow(RangeError);
    expect(() => percentile([1], 0)).toThrow(RangeError);
    expect(() => mean([1, Number.NaN])).toThrow(RangeError);
  });
});
