import { describe, expect, it } from "vitest";
import { fitCpu, modeledPassMs, sizeController } from "../../bench/lib/lambda-sizing.ts";
import { dynamoMonthly, lambdaMonthly, loadPrices } from "../../bench/lib/pricing.ts";

const prices = loadPrices();

describe("bench pricing", () => {
  it("prices one write unit per second for a 30-day month at $1.62 on-demand", () => {
    const cost = dynamoMonthly({ writeUnits: 1, readUnits: 0, sqsRequests: 0 }, prices);
    expect(cost.onDemand).toBeCloseTo(1.62, 2);
    // 1/0.7 WCU for 720 hours at $0.00065.
    expect(cost.provisioned).toBeCloseTo(0.6686, 3);
  });

  it("prices a 128 MB arm64 controller looping 62 s of every minute at $4.46 plus requests", () => {
    const cost = lambdaMonthly(
      { memoryMb: 128, secondsPerInvocation: 62, invocationsPerMonth: 43_200, partitions: 1 },
      prices,
    );
    expect(cost.duration).toBeCloseTo(4.464, 2);
    expect(cost.requests).toBeCloseTo(0.00864, 4);
  });
});

describe("controller Lambda sizing", () => {
  it("fits CPU per pass as a line", () => {
    const fit = fitCpu([
      { shards: 100, cpuMs: 70 },
      { shards: 1000, cpuMs: 610 },
    ]);
    expect(fit.perShardMs).toBeCloseTo(0.6, 6);
    expect(fit.fixedMs).toBeCloseTo(10, 6);
  });

  it("models pass time as CPU over the memory's vCPU share plus a round trip per 32 shards", () => {
    const cpu = { fixedMs: 8, perShardMs: 0.6 };
    expect(modeledPassMs(100, 1769, cpu, 32)).toBeCloseTo(68 + 4 * 5, 6);
    expect(modeledPassMs(100, 3538, cpu, 32)).toBeCloseTo(68 + 20, 6);
    expect(modeledPassMs(100, 1769 / 2, cpu, 32)).toBeCloseTo(136 + 20, 6);
  });

  it("picks the cheapest partitions and memory whose pass fits 700 ms and whose memory holds the controller", () => {
    const cpu = { fixedMs: 8, perShardMs: 0.6 };
    const options = { cpu, rssMb: () => 120, tickMs: 1000, concurrency: 32, runSeconds: 62, prices };
    const one = sizeController({ ...options, shards: 1 });
    // 120 MB + 15% does not fit in 128 MB.
    expect(one).toMatchObject({ partitions: 1, memoryMb: 192 });
    const many = sizeController({ ...options, shards: 1000 });
    expect(many?.modeledPassMs).toBeLessThanOrEqual(700);
    expect(many?.partitions).toBeGreaterThan(1);
  });
});
