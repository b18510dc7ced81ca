import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { DEFAULT_STATE_DIR, resolveAgentOptions } from "../../src/agent/options.ts";

const configFile = (json: unknown) => ({
  configFile: "/etc/shardguard/agent.json",
  readFile: () => JSON.stringify(json),
});

describe("agent options from flags, environment and config file", () => {
  it("fills every default from the required settings alone", () => {
    // Act
    const config = resolveAgentOptions({ flags: { shard: "s1", redis: "127.0.0.1:6379" }, env: {} });

    // Assess
    expect(config.agent).toMatchObject({
      shard: "s1",
      redis: "127.0.0.1:6379",
      priority: 100,
      fencePolicy: "failsafe",
      heartbeatIntervalMs: 1000,
      fenceTimeoutMs: 2500,
      primaryKeepaliveMs: 2000,
      replicaKeepaliveMs: 20000,
      stateDir: DEFAULT_STATE_DIR,
    });
    expect(config).toMatchObject({ table: "shardguard", queuePrefix: "shardguard", logLevel: "info" });
    expect(config.agent.stateDir.startsWith("/")).toBe(true);
  });

  it("prefers a flag over a variable over the config file", () => {
    // Act
    const config = resolveAgentOptions({
      flags: { priority: "1" },
      env: { SHARDGUARD_PRIORITY: "2", SHARDGUARD_SHARD: "from-env" },
      ...configFile({ priority: 3, shard: "from-file", redis: "10.0.0.1:6379", fencePolicy: "keep-serving" }),
    });

    // Assess
    expect(config.agent).toMatchObject({
      priority: 1,
      shard: "from-env",
      redis: "10.0.0.1:6379",
      fencePolicy: "keep-serving",
    });
  });

  it("uses systemd's STATE_DIRECTORY when nothing else names a state dir", () => {
    // Act
    const config = resolveAgentOptions({
      flags: { shard: "s1", redis: "127.0.0.1:6379" },
      env: { STATE_DIRECTORY: "/var/lib/shardguard" },
    });

    // Assess
    expect(config.agent.stateDir).toBe("/var/lib/shardguard");
  });

  it("names the flag, the variable and the config key of every bad value at once", () => {
    // Act
    const attempt = () =>
      resolveAgentOptions({
        flags: { priority: "high", redis: "localhost" },
        env: { SHARDGUARD_FENCE_POLICY: "maybe" },
        ...configFile({ shard: "s1", heartbeatIntervalMs: "fast", colour: "blue" }),
      });

    // Assess
    expect(attempt).toThrowError(/--priority: must be an integer, got "high"/);
    expect(attempt).toThrowError(/--redis: must be host:port/);
    expect(attempt).toThrowError(/SHARDGUARD_FENCE_POLICY: Invalid option/);
    expect(attempt).toThrowError(/heartbeatIntervalMs in \/etc\/shardguard\/agent.json: must be an integer/);
    expect(attempt).toThrowError(/colour in \/etc\/shardguard\/agent.json: unknown setting/);
  });

  it("names a missing required setting by its flag and variable", () => {
    expect(() => resolveAgentOptions({ flags: { redis: "127.0.0.1:6379" }, env: {} })).toThrowError(
      "invalid agent options: --shard (or SHARDGUARD_SHARD): required",
    );
  });

  it("requires the fence timeout below the failure timeout, naming where each came from", () => {
    expect(() =>
      resolveAgentOptions({
        flags: { shard: "s1", redis: "127.0.0.1:6379", fenceTimeoutMs: "5000" },
        env: {},
      }),
    ).toThrowError(/--fence-timeout-ms: must be less than SHARDGUARD_FAILURE_TIMEOUT_MS \(3000 ms\)/);
  });

  it("refuses a queue prefix holding the queue-name separator '_', naming the variable", () => {
    expect(() =>
      resolveAgentOptions({
        flags: { shard: "s1", redis: "127.0.0.1:6379" },
        env: { SHARDGUARD_QUEUE_PREFIX: "team_a" },
      }),
    ).toThrow(/SHARDGUARD_QUEUE_PREFIX: must be 1-20 letters, digits or '-' \('_' separates/);
  });

  it("reports a config file that is not JSON", () => {
    expect(() =>
      resolveAgentOptions({ flags: {}, env: {}, configFile: "/x.json", readFile: () => "shard = s1" }),
    ).toThrowError(/config file \/x.json is not valid JSON/);
  });

  it("stops `shardguard agent` without --node-id against AWS, before it touches AWS", async () => {
    // Act: no endpoint variables, so the SDK's own (AWS) endpoints.
    const failure = await promisify(execFile)(
      process.execPath,
      ["src/cli/main.ts", "agent", "--shard", "orders", "--redis", "10.0.1.11:6379"],
      { env: { PATH: process.env.PATH, HOME: process.env.HOME, AWS_EC2_METADATA_DISABLED: "true" } },
    ).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    );

    // Assess
    expect(failure?.code).toBe(1);
    expect(failure?.stderr).toMatch(
      /^shardguard: --node-id \(SHARDGUARD_NODE_ID\) is required against AWS: the agent policy of each node names its id \(the `nodes` context entry orders:<node-id>/,
    );
  }, 30_000);
});
