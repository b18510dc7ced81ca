import { readFileSync } from "node:fs";

/**
 * Monthly cost arithmetic for bench/cost.ts and bench/scale.ts: measured request rates in,
 * dollars out, from the dated price table bench/prices.json. Pure apart from reading that file.
 */

export interface Prices {
  region: string;
  currency: string;
  asOf: string;
  checked: string;
  source: string;
  dynamodb: {
    onDemandWriteRequestUnitPerMillion: number;
    onDemandReadRequestUnitPerMillion: number;
    provisionedWcuHour: number;
    provisionedRcuHour: number;
    storageGbMonth: number;
  };
  sqs: { requestPerMillion: number };
  lambda: { arm64GbSecond: number; x86GbSecond: number; requestPerMillion: number };
  cloudwatch: {
    customMetricMonth: number;
    logsIngestedGb: number;
    logsStoredGbMonth: number;
    alarmStandardMonth: number;
    dashboardMonth: number;
  };
}

export function loadPrices(path = new URL("../prices.json", import.meta.url)): Prices {
  return JSON.parse(readFileSync(path, "utf8")) as Prices;
}

/** A 30-day month. */
export const SECONDS_PER_MONTH = 30 * 86_400;
export const HOURS_PER_MONTH = 30 * 24;

/** Auto scaling's target utilization for provisioned capacity (the CDK's default, cdk/table-capacity.ts). */
export const PROVISIONED_TARGET_UTILIZATION = 0.7;

/** Request and capacity rates per second, as measured. */
export interface Rates {
  /** DynamoDB write request units per second (= WCU needed, sustained). */
  readonly writeUnits: number;
  /** DynamoDB read request units per second. */
  readonly readUnits: number;
  readonly sqsRequests: number;
}

export interface DynamoCost {
  readonly onDemand: number;
  /** Provisioned capacity at the target utilization, no reserved capacity, no free tier. */
  readonly provisioned: number;
}

export function dynamoMonthly(rates: Rates, prices: Prices): DynamoCost {
  const d = prices.dynamodb;
  const onDemand =
    (rates.writeUnits * SECONDS_PER_MONTH * d.onDemandWriteRequestUnitPerMillion) / 1e6 +
    (rates.readUnits * SECONDS_PER_MONTH * d.onDemandReadRequestUnitPerMillion) / 1e6;
  const provisioned =
    ((rates.writeUnits / PROVISIONED_TARGET_UTILIZATION) * d.provisionedWcuHour +
      (rates.readUnits / PROVISIONED_TARGET_UTILIZATION) * d.provisionedRcuHour) *
    HOURS_PER_MONTH;
  return { onDemand, provisioned };
}

export function sqsMonthly(requestsPerSecond: number, prices: Prices): number {
  return (requestsPerSecond * SECONDS_PER_MONTH * prices.sqs.requestPerMillion) / 1e6;
}

export interface LambdaShape {
  readonly memoryMb: number;
  /** Billed seconds of one scheduled invocation. */
  readonly secondsPerInvocation: number;
  /** Scheduled invocations per month (one a minute: 43,200), per partition. */
  readonly invocationsPerMonth: number;
  readonly partitions: number;
}

export function lambdaMonthly(shape: LambdaShape, prices: Prices): { duration: number; requests: number } {
  const invocations = shape.invocationsPerMonth * shape.partitions;
  return {
    duration:
      (shape.memoryMb / 1024) * shape.secondsPerInvocation * invocations * prices.lambda.arm64GbSecond,
    requests: (invocations * prices.lambda.requestPerMillion) / 1e6,
  };
}

export function logsMonthly(bytesPerSecond: number, prices: Prices): number {
  const gb = (bytesPerSecond * SECONDS_PER_MONTH) / 1024 ** 3;
  // Ingestion, plus one month of storage for what a month writes (the retention is 1-2 weeks).
  return gb * (prices.cloudwatch.logsIngestedGb + prices.cloudwatch.logsStoredGbMonth);
}

export const round = (value: number, digits = 4): number => Number(value.toFixed(digits));
