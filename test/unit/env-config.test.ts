import { describe, expect, it } from "vitest";
import { failoverConfigFromEnv, tableNameFromEnv } from "../../src/adapters/env.ts";

describe("configuration from the environment", () => {
  it("defaults every value when no variable is set", () => {
    expect(failoverConfigFromEnv({}).failureTimeoutMs).toBe(3000);
    expect(tableNameFromEnv({})).toBe("shardguard");
  });

  it("reads the variables the CDK construct sets", () => {
    const config = failoverConfigFromEnv({ SHARDGUARD_FAILURE_TIMEOUT_MS: "5000", SHARDGUARD_QUORUM: "all" });
    expect(config.failureTimeoutMs).toBe(5000);
    expect(config.quorum).toBe("all");
  });

  it("names the variable that is not an integer", () => {
    expect(() => failoverConfigFromEnv({ SHARDGUARD_TICK_INTERVAL_MS: "1s" })).toThrowError(
      'invalid configuration: SHARDGUARD_TICK_INTERVAL_MS: must be an integer, got "1s"',
    );
  });

  it("names the variable of a cross-field violation", () => {
    expect(() => failoverConfigFromEnv({ SHARDGUARD_FENCE_TIMEOUT_MS: "4000" })).toThrowError(
      /SHARDGUARD_FENCE_TIMEOUT_MS: must be less than SHARDGUARD_FAILURE_TIMEOUT_MS \(3000 ms\)/,
    );
  });
});
