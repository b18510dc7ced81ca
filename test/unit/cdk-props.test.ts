import { readFileSync } from "node:fs";
import path from "node:path";
import { Duration, Stack } from "aws-cdk-lib";
import { describe, expect, it } from "vitest";
import { DEFAULT_CONTROLLER_ENTRY, resolveControllerProps } from "../../cdk/controller-props.ts";
import { ShardguardController, type ShardguardControllerProps } from "../../cdk/shardguard-controller.ts";
import { parseNodeList } from "../../cdk/shardguard-stack.ts";
import { defaultQueuePrefix } from "../../src/adapters/queue-names.ts";
import { DEFAULT_CONFIG } from "../../src/core/config.ts";
import { ConfigurationError } from "../../src/core/errors.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

/** Builds the construct in a fresh app that skips bundling: validation runs before any asset. */
function build(props: ShardguardControllerProps): ShardguardController {
  const app = cdkApp({ bundle: false });
  return new ShardguardController(new Stack(app, "Props"), "Shardguard", {
    controllerEntry: FIXTURE_ENTRY,
    ...props,
  });
}

describe("ShardguardController props", () => {
  it("rejects a failure timeout not above the heartbeat interval, naming both props", () => {
    const act = () => build({ heartbeatInterval: Duration.seconds(3), failureTimeout: Duration.seconds(3) });

    expect(act).toThrowError(ConfigurationError);
    expect(act).toThrowError(/failureTimeout: must be greater than heartbeatInterval \(3000 ms\)/);
  });

  it("rejects a fence timeout not below the failure timeout, naming the prop", () => {
    const act = () => build({ fenceTimeout: Duration.seconds(3), failureTimeout: Duration.seconds(3) });

    expect(act).toThrowError(/fenceTimeout: must be less than failureTimeout \(3000 ms\)/);
  });

  it.each([
    ["a character SQS rejects", "shard.guard"],
    ["a space", "shard guard"],
    ["an empty prefix", ""],
    ["a prefix too long for <prefix>_<shard>_<node>_dlq", "p".repeat(21)],
  ])("rejects a queue prefix with %s, naming the prop", (_case, queuePrefix) => {
    expect(() => build({ queuePrefix })).toThrowError(
      /queuePrefix: invalid queue prefix ".*": must be 1-20 letters, digits or '-' \('_' separates/,
    );
  });

  it("accepts the longest queue prefix the agents accept, and its longest queue names fit SQS", () => {
    // Prepare
    const controller = build({ queuePrefix: "p".repeat(20) });

    // Act
    const node = controller.addNode({ shard: "s".repeat(24), node: "n".repeat(24) });

    // Assess
    expect(node.queueName).toBe(`${"p".repeat(20)}_${"s".repeat(24)}_${"n".repeat(24)}`);
    expect(node.deadLetterQueueName).toBe(`${"p".repeat(20)}_dlq`);
    // An older release's per-node dead-letter queue, which decommission still deletes, fits too.
    expect(`${node.queueName}_dlq`.length).toBeLessThanOrEqual(80);
  });

  it.each([
    ["at one minute, which leaves gaps between invocations", 60],
    ["at two minutes, which lets three invocations overlap", 120],
  ])("rejects a controller timeout %s", (_case, seconds) => {
    expect(() => build({ controllerTimeout: Duration.seconds(seconds) })).toThrowError(
      /controllerTimeout: must be above 60 s/,
    );
  });

  it("rejects a reserved concurrency that cannot cover the overlap of two invocations", () => {
    expect(() => build({ controllerReservedConcurrency: 1 })).toThrowError(
      /controllerReservedConcurrency: must be an integer of at least 2/,
    );
  });

  it("rejects a point-in-time recovery period outside 1 to 35 days", () => {
    expect(() => build({ pointInTimeRecoveryPeriod: Duration.days(36) })).toThrowError(
      /pointInTimeRecoveryPeriod: /,
    );
  });

  it("names a controller entry that does not exist", () => {
    expect(() => build({ controllerEntry: "functions/nowhere/handler.ts" })).toThrowError(
      /controllerEntry: no file at .*functions\/nowhere\/handler\.ts/,
    );
  });

  it("reports every bad prop in one error", () => {
    // Act
    let message = "";
    try {
      build({ heartbeatInterval: Duration.seconds(5), queuePrefix: "a/b", controllerMemorySize: 64 });
    } catch (error) {
      message = (error as Error).message;
    }

    // Assess
    expect(message).toMatch(/^ShardguardController: invalid props: /);
    expect(message).toMatch(/failureTimeout: /);
    expect(message).toMatch(/queuePrefix: /);
    expect(message).toMatch(/controllerMemorySize: /);
  });

  it("resolves the default controller entry from the package root, not the working directory", () => {
    const packageRoot = path.resolve(import.meta.dirname, "..", "..");

    expect(DEFAULT_CONTROLLER_ENTRY).toBe(path.join(packageRoot, "functions", "controller", "handler.ts"));
  });

  it("resolves a relative controller entry against the package root", () => {
    const resolved = resolveControllerProps({ controllerEntry: "test/fixtures/controller-handler.ts" });

    expect(resolved.controllerCode).toEqual({ entry: FIXTURE_ENTRY });
  });

  it("applies the documented defaults", () => {
    const resolved = resolveControllerProps({ controllerEntry: FIXTURE_ENTRY });

    expect(resolved).toMatchObject({
      deletionProtection: true,
      controllerMemorySize: 512,
      controllerReservedConcurrency: 3,
      operatorReservedConcurrency: 2,
    });
    // The construct derives the prefix from its stack's name (defaultQueuePrefix).
    expect(resolved.queuePrefix).toBeUndefined();
    expect(resolved.controllerTimeout.toSeconds()).toBe(75);
    expect(resolved.config.failureTimeoutMs).toBe(3000);
  });
});

describe("agent identities", () => {
  it("rejects a node id that is not a valid id, naming the field", () => {
    const controller = build({});

    expect(() => controller.addNode({ shard: "orders", node: "n/1" })).toThrowError(
      /node: "n\/1" must be 1-24 letters/,
    );
  });

  it("parses the app's node list and names a malformed entry", () => {
    expect(parseNodeList("orders:n1, orders:n2")).toEqual([
      { shard: "orders", node: "n1" },
      { shard: "orders", node: "n2" },
    ]);
    expect(() => parseNodeList("orders")).toThrowError(/nodes: "orders" must be shard:node/);
  });

  it("documents the timing defaults it applies and a queue prefix that keeps the stack name's case", () => {
    // Prepare: each timing prop's `@default Duration.<unit>(n)` in the props' doc comments.
    const source = readFileSync(
      path.join(import.meta.dirname, "..", "..", "cdk", "controller-props.ts"),
      "utf8",
    );
    const msPer = { millis: 1, seconds: 1000, minutes: 60_000 } as const;
    const documented = (prop: string) => {
      const [, unit, amount] =
        new RegExp(
          `@default Duration\\.(millis|seconds|minutes)\\((\\d+)\\)\\n\\s*\\*/\\n\\s*readonly ${prop}\\?`,
        ).exec(source) ?? [];
      return Number(amount) * msPer[unit as keyof typeof msPer];
    };

    // Act
    const config = build({}).config;

    // Assess
    expect({
      heartbeatIntervalMs: documented("heartbeatInterval"),
      failureTimeoutMs: documented("failureTimeout"),
      fenceTimeoutMs: documented("fenceTimeout"),
      tickIntervalMs: documented("tickInterval"),
      lockLeaseMs: documented("lockLease"),
      cooldownMs: documented("cooldown"),
    }).toEqual({
      heartbeatIntervalMs: config.heartbeatIntervalMs,
      failureTimeoutMs: config.failureTimeoutMs,
      fenceTimeoutMs: config.fenceTimeoutMs,
      tickIntervalMs: config.tickIntervalMs,
      lockLeaseMs: config.lockLeaseMs,
      cooldownMs: config.cooldownMs,
    });
    expect(config).toMatchObject(DEFAULT_CONFIG);
    expect(source).toContain("`Shardguard`, `Shardguard-Staging`");
    expect([defaultQueuePrefix("Shardguard"), defaultQueuePrefix("Shardguard-Staging")]).toEqual([
      "Shardguard",
      "Shardguard-Staging",
    ]);
  });
});
