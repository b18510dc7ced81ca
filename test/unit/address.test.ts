import { describe, expect, it } from "vitest";
import { MalformedAddress, parseAddress, tryParseAddress } from "../../src/core/address.ts";
import { ConfigurationError } from "../../src/core/errors.ts";

/**
 * One parser for `host:port` (the agent, the Sentinel view, the workloads). No IPv6 row: no caller
 * takes one (`addressSchema` allows no colon in a host).
 */

describe("parseAddress", () => {
  it.each([
    { name: "IPv4", address: "127.0.0.1:6380", expected: { host: "127.0.0.1", port: 6380 } },
    {
      name: "hostname",
      address: "redis-1.internal:6379",
      expected: { host: "redis-1.internal", port: 6379 },
    },
    { name: "lowest port", address: "db:1", expected: { host: "db", port: 1 } },
    { name: "highest port", address: "db:65535", expected: { host: "db", port: 65_535 } },
  ])("splits $name", ({ address, expected }) => {
    // Act and Assess
    expect(parseAddress(address)).toEqual(expected);
    expect(tryParseAddress(address)).toEqual(expected);
  });

  it.each([
    { name: "a missing port", address: "127.0.0.1", problem: "no port" },
    { name: "an empty port", address: "127.0.0.1:", problem: 'port "" is not a number' },
    { name: "a missing host", address: ":6379", problem: "no host" },
    { name: "a non-numeric port", address: "db:redis", problem: 'port "redis" is not a number' },
    { name: "a hexadecimal port", address: "db:0x10", problem: 'port "0x10" is not a number' },
    { name: "a negative port", address: "db:-1", problem: 'port "-1" is not a number' },
    { name: "port 0", address: "db:0", problem: "port 0 is outside 1-65535" },
    { name: "a port out of range", address: "127.0.0.1:99999", problem: "port 99999 is outside 1-65535" },
  ])("refuses $name, naming the address and the problem", ({ address, problem }) => {
    // Act
    const thrown = (() => {
      try {
        parseAddress(address);
      } catch (error) {
        return error;
      }
    })();

    // Assess
    expect(thrown).toBeInstanceOf(MalformedAddress);
    expect(thrown).toBeInstanceOf(ConfigurationError);
    expect((thrown as MalformedAddress).message).toBe(`address "${address}" is not host:port: ${problem}`);
    expect(tryParseAddress(address)).toBeUndefined();
  });
});
