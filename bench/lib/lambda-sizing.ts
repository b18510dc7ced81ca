import { lambdaMonthly, type Prices } from "./pricing.ts";

/**
 * Controller Lambda sizing from bench:scale's measurements. Lambda gives a function CPU in
 * proportion to its memory (1,769 MB = one vCPU), so a pass that needs `cpuMs` of CPU takes about
 * `cpuMs / share` on a function of that size, plus the time its requests wait on DynamoDB. This is
 * a model on top of measured CPU time and memory, not a measurement in Lambda.
 */

export const MEMORY_SIZES_MB = [128, 192, 256, 384, 512, 768, 1024, 1280, 1536, 1769] as const;
/** Memory at which Lambda gives one full vCPU. */
export const ONE_VCPU_MB = 1769;
/** Assumed DynamoDB round trip in the same region for a small strongly consistent Query. */
export const DYNAMO_LATENCY_MS = 5;
/** A pass should leave room in the tick for the pause, orchestrations and noise. */
export const PASS_BUDGET_FRACTION = 0.7;

/** CPU per pass as a + b * shards (least squares over the measured points). */
export function fitCpu(points: ReadonlyArray<{ shards: number; cpuMs: number }>): {
  fixedMs: number;
  perShardMs: number;
} {
  const n = points.length;
  const mx = points.reduce((sum, p) => sum + p.shards, 0) / n;
  const my = points.reduce((sum, p) => sum + p.cpuMs, 0) / n;
  const sxx = points.reduce((sum, p) => sum + (p.shards - mx) ** 2, 0);
  const sxy = points.reduce((sum, p) => sum + (p.shards - mx) * (p.cpuMs - my), 0);
  const perShardMs = sxx === 0 ? my / Math.max(1, mx) : sxy / sxx;
  return { fixedMs: Math.max(0, my - perShardMs * mx), perShardMs };
}

/** Modeled pass time of `shards` shards on a function of `memoryMb`. */
export function modeledPassMs(
  shards: number,
  memoryMb: number,
  cpu: { fixedMs: number; perShardMs: number },
  concurrency: number,
): number {
  const share = Math.min(1, memoryMb / ONE_VCPU_MB);
  return (
    (cpu.fixedMs + cpu.perShardMs * shards) / share + Math.ceil(shards / concurrency) * DYNAMO_LATENCY_MS
  );
}

export interface SizingRow {
  readonly shards: number;
  readonly partitions: number;
  readonly memoryMb: number;
  readonly modeledPassMs: number;
  /** Per month, all partitions, at `runSeconds` per one-minute invocation. */
  readonly lambdaMonthly: number;
}

/**
 * The cheapest (partitions, memory) whose modeled pass fits the tick budget and whose memory holds
 * the measured peak RSS (`rssMb`, plus 15% for the Lambda runtime).
 */
export function sizeController(options: {
  shards: number;
  cpu: { fixedMs: number; perShardMs: number };
  rssMb: (shardsPerPartition: number) => number;
  tickMs: number;
  concurrency: number;
  runSeconds: number;
  prices: Prices;
  maxPartitions?: number;
}): SizingRow | undefined {
  let best: SizingRow | undefined;
  for (let partitions = 1; partitions <= (options.maxPartitions ?? 20); partitions++) {
    const perPartition = Math.ceil(options.shards / partitions);
    for (const memoryMb of MEMORY_SIZES_MB) {
      if (memoryMb < options.rssMb(perPartition) * 1.15) continue;
      const pass = modeledPassMs(perPartition, memoryMb, options.cpu, options.concurrency);
      if (pass > options.tickMs * PASS_BUDGET_FRACTION) continue;
      const cost = lambdaMonthly(
        { memoryMb, secondsPerInvocation: options.runSeconds, invocationsPerMonth: 43_200, partitions },
        options.prices,
      );
      const row = {
        shards: options.shards,
        partitions,
        memoryMb,
        modeledPassMs: Math.round(pass),
        lambdaMonthly: cost.duration + cost.requests,
      };
      if (!best || row.lambdaMonthly < best.lambdaMonthly) best = row;
      break;
    }
  }
  return best;
}
