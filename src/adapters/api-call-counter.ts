import type { Pluggable } from "@smithy/types";

/** Counts for one AWS API operation, e.g. `DynamoDB.Query`. */
export interface ApiCallCount {
  /** Operations the code asked for (one `client.send`). */
  calls: number;
  /** HTTP requests actually sent, retries included: what AWS bills and throttles. */
  requests: number;
  /** Calls that ended in an error (conditional-check failures included). */
  errors: number;
}

/**
 * Counts AWS API calls per operation through SDK middleware, so the cost of a controller tick or
 * an agent heartbeat can be measured (`bench/api-calls.ts`) instead of estimated.
 */
export class ApiCallCounter {
  readonly #counts = new Map<string, ApiCallCount>();

  /** A copy of the counts, keyed `<Service>.<Operation>`. */
  snapshot(): Record<string, ApiCallCount> {
    const copy: Record<string, ApiCallCount> = {};
    for (const [key, count] of [...this.#counts].sort(([a], [b]) => a.localeCompare(b)))
      copy[key] = { ...count };
    return copy;
  }

  /** HTTP requests sent since the last reset, over all operations. */
  totalRequests(): number {
    let total = 0;
    for (const count of this.#counts.values()) total += count.requests;
    return total;
  }

  reset(): void {
    this.#counts.clear();
  }

  /** The middleware pair that feeds this counter; `service` names the client in the keys. */
  plugin<Input extends object, Output extends object>(service: string): Pluggable<Input, Output> {
    return {
      applyToStack: (stack) => {
        stack.add(
          (next, context) => async (args) => {
            const count = this.#entry(`${service}.${operationName(context.commandName)}`);
            count.calls += 1;
            try {
              return await next(args);
            } catch (error) {
              count.errors += 1;
              throw error;
            }
          },
          { step: "initialize", priority: "high", name: "shardguardApiCallCounter", override: true },
        );
        // Innermost, around the HTTP handler: runs once per attempt, so retries are counted.
        stack.add(
          (next, context) => async (args) => {
            this.#entry(`${service}.${operationName(context.commandName)}`).requests += 1;
            return next(args);
          },
          { step: "deserialize", priority: "low", name: "shardguardApiRequestCounter", override: true },
        );
      },
    };
  }

  #entry(key: string): ApiCallCount {
    let count = this.#counts.get(key);
    if (!count) {
      count = { calls: 0, requests: 0, errors: 0 };
      this.#counts.set(key, count);
    }
    return count;
  }
}

/** `QueryCommand` -> `Query`. */
function operationName(commandName: unknown): string {
  return typeof commandName === "string" ? commandName.replace(/Command$/, "") : "Unknown";
}

/** Per-operation difference `after - before`, leaving out operations that did not change. */
export function diffCounts(
  before: Record<string, ApiCallCount>,
  after: Record<string, ApiCallCount>,
): Record<string, ApiCallCount> {
  const diff: Record<string, ApiCallCount> = {};
  for (const [key, count] of Object.entries(after)) {
    const old = before[key] ?? { calls: 0, requests: 0, errors: 0 };
    const delta = {
      calls: count.calls - old.calls,
      requests: count.requests - old.requests,
      errors: count.errors - old.errors,
    };
    if (delta.calls || delta.requests || delta.errors) diff[key] = delta;
  }
  return diff;
}
