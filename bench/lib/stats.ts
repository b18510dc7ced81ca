/** Descriptive statistics of one measured series, in the series' unit. */
export interface Summary {
  readonly count: number;
  readonly min: number;
  readonly max: number;
  readonly mean: number;
  readonly median: number;
  /** Nearest-rank 99th percentile: with fewer than 100 values, the maximum. */
  readonly p99: number;
}

function sortedCopy(values: readonly number[]): number[] {
  if (values.length === 0) throw new RangeError("statistics of an empty series are undefined");
  if (values.some((value) => !Number.isFinite(value)))
    throw new RangeError("series holds a non-finite value");
  return [...values].sort((a, b) => a - b);
}

/** The middle value; the mean of the two middle values for an even count. */
export function median(values: readonly number[]): number {
  const sorted = sortedCopy(values);
  const middle = sorted.length >> 1;
  if (sorted.length % 2 === 1) return sorted[middle] as number;
  return ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

/**
 * Nearest-rank percentile: the smallest value such that at least `p` percent of the values are at
 * or below it (rank ⌈p/100 · n⌉). Always one of the measured values, never an interpolation.
 */
export function percentile(values: readonly number[], p: number): number {
  if (!(p > 0 && p <= 100)) throw new RangeError(`percentile must be in (0, 100], got ${p}`);
  const sorted = sortedCopy(values);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[rank - 1] as number;
}

export function mean(values: readonly number[]): number {
  const sorted = sortedCopy(values);
  return sorted.reduce((sum, value) => sum + value, 0) / sorted.length;
}

/** All statistics at once; undefined for an empty series (e.g. every trial failed). */
export function summarize(values: readonly number[]): Summary | undefined {
  if (values.length === 0) return undefined;
  const sorted = sortedCopy(values);
  return {
    count: sorted.length,
    min: sorted[0] as number,
    max: sorted[sorted.length - 1] as number,
    mean: mean(sorted),
    median: median(sorted),
    p99: percentile(sorted, 99),
  };
}
