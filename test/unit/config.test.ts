import { describe, expect, it } from "vitest";
import { DEFAULT_CONFIG, parseFailoverConfig } from "../../src/core/config.ts";
import { ConfigurationError } from "../../src/core/errors.ts";
import { keys, TABLE_KEYS, TTL_ATTRIBUTE, tableDefinition } from "../../src/core/table.ts";

describe("failover configuration", () => {
  it("defaults to the documented values", () => {
    expect(DEFAULT_CONFIG).toMatchObject({
      heartbeatIntervalMs: 1000,
      failureTimeoutMs: 3000,
      fenceTimeoutMs: 2500,
      tickIntervalMs: 1000,
      lockLeaseMs: 60_000,
      maxLagOnFailover: 1048576,
      quorum: "majority",
      cooldownMs: 300_000,
    });
  });

  it("rejects a failure timeout not above the heartbeat interval, naming the field", () => {
    expect(() =>
      parseFailoverConfig({ heartbeatIntervalMs: 3000, failureTimeoutMs: 3000, fenceTimeoutMs: 1000 }),
    ).toThrowError(/failureTimeoutMs: must be greater than heartbeatIntervalMs/);
  });

  it("rejects a fence timeout not below the failure timeout and reports every bad field at once", () => {
    const parse = () => parseFailoverConfig({ heartbeatIntervalMs: 4000, fenceTimeoutMs: 5000 });
    expect(parse).toThrowError(ConfigurationError);
    expect(parse).toThrowError(
      /failureTimeoutMs: must be greater.*; fenceTimeoutMs: must be less than failureTimeoutMs/,
    );
  });

  it("names an unknown quorum mode", () => {
    expect(() => parseFailoverConfig({ quorum: "most" as never })).toThrowError(/quorum: /);
  });
});

describe("coordination table definition", () => {
  it("keys every item by string pk and sk", () => {
    const definition = tableDefinition("t");
    expect(definition.KeySchema).toEqual([
      { AttributeName: TABLE_KEYS.partitionKey, KeyType: "HASH" },
      { AttributeName: TABLE_KEYS.sortKey, KeyType: "RANGE" },
    ]);
    expect(TTL_ATTRIBUTE).toBe("ttl");
  });

  it("pads history epochs so that sort-key order is epoch order", () => {
    expect(keys.history(9) < keys.history(10)).toBe(true);
    expect(keys.history(42)).toBe("HISTORY#000000000042");
  });
});
