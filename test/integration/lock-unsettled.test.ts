import { afterAll, afterEach, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import type { ControllerDeps } from "../../src/controller/deps.ts";
import { ShardLock } from "../../src/controller/lock.ts";
import { DEFAULT_CONFIG } from "../../src/core/config.ts";
import { awsEnv, tableName, uniqueName } from "../support/aws.ts";
import { MemoryEventPublisher, MemoryMetrics } from "../support/controller-fakes.ts";
import { TcpProxy } from "../support/tcp-proxy.ts";

/**
 * Simulator seed 52929 (guarantee 3: 21.1 s without a writable primary), against DynamoDB Local
 * through a real TCP proxy: a controller whose lock acquire committed but whose answer was lost,
 * or whose release never reached the table, holds the shard's lock without knowing. Its next
 * acquire must take that lock again under the same owner token (the table's condition grants it
 * to its holder) instead of waiting out its own lease; another controller still waits. The code
 * before drew a fresh token and got "another controller holds the shard's lock" until the lease
 * (60 s by default) ran out.
 */

const UPDATE_ITEM = "DynamoDB_20120810.UpdateItem";

const opened: AwsAdapters[] = [];
let proxy: TcpProxy | undefined;

function adapters(env: Record<string, string> = {}): AwsAdapters {
  const built = createAwsAdapters({ env: { ...awsEnv(), ...env }, tableName: tableName(), maxAttempts: 1 });
  opened.push(built);
  return built;
}

function controllerDeps(aws: AwsAdapters): ControllerDeps {
  return {
    store: aws.store,
    bus: aws.bus,
    clock: aws.clock,
    config: DEFAULT_CONFIG,
    log: silentLogger,
    events: new MemoryEventPublisher(),
    metrics: new MemoryMetrics(),
  };
}

/** A controller whose DynamoDB traffic goes through a proxy the test controls. */
async function controllerBehindProxy(): Promise<ControllerDeps> {
  const endpoint = new URL(awsEnv().AWS_ENDPOINT_URL_DYNAMODB ?? "");
  proxy = new TcpProxy(endpoint.hostname, Number(endpoint.port));
  await proxy.start();
  return controllerDeps(adapters({ AWS_ENDPOINT_URL_DYNAMODB: proxy.url }));
}

afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
});

afterAll(() => {
  for (const built of opened) built.destroy();
});

function shardId(): string {
  return uniqueName("lock").slice(0, 24);
}

describe("a controller's lock whose outcome it does not know (simulator seed 52929)", () => {
  it("after an acquire that committed but whose answer was lost: the next acquire takes it under the same token", async () => {
    // Prepare
    const shard = shardId();
    const deps = await controllerBehindProxy();
    const observer = adapters().store;
    const other = controllerDeps(adapters());

    // Act: the acquire reaches the table, its answer does not reach the controller.
    proxy?.loseAnswersTo(UPDATE_ITEM);
    await expect(ShardLock.acquire(deps, shard)).rejects.toThrow();
    const remembered = ShardLock.unsettledOwner(deps, shard);
    const committed = (await observer.heartbeats.snapshot(shard)).lock;
    proxy?.loseAnswersTo(undefined);
    const byOther = await ShardLock.acquire(other, shard);
    const again = await ShardLock.acquire(deps, shard);

    // Assess: the lock was taken (under the token the controller remembers), the other controller
    // waits, and this one holds it now, at once, with a new fence.
    expect(committed?.owner, "the lost acquire committed").toBe(remembered);
    expect(byOther).toEqual({ outcome: "lost_race", reason: "another controller holds the shard's lock" });
    if (!(again instanceof ShardLock)) throw new Error(`not locked: ${again.reason}`);
    expect(again.owner).toBe(committed?.owner);
    expect(again.lease.fence).toBe((committed?.fence ?? 0) + 1);
    expect(ShardLock.unsettledOwner(deps, shard)).toBeUndefined();
  });

  it("after a release that never reached the table: the next acquire takes its own lock again", async () => {
    // Prepare
    const shard = shardId();
    const deps = await controllerBehindProxy();
    const observer = adapters().store;
    const other = controllerDeps(adapters());
    const lock = await ShardLock.acquire(deps, shard);
    if (!(lock instanceof ShardLock)) throw new Error(`not locked: ${lock.reason}`);

    // Act: the release's connection is reset before it reaches the table; then the next passes.
    proxy?.resetRequestsContaining(UPDATE_ITEM);
    await lock.release();
    const held = (await observer.heartbeats.snapshot(shard)).lock;
    proxy?.resetRequestsContaining(undefined);
    const byOther = await ShardLock.acquire(other, shard);
    const again = await ShardLock.acquire(deps, shard);

    // Assess
    expect(held?.owner, "the lock is still held after the failed release").toBe(lock.owner);
    expect(byOther).toEqual({ outcome: "lost_race", reason: "another controller holds the shard's lock" });
    if (!(again instanceof ShardLock)) throw new Error(`not locked: ${again.reason}`);
    expect(again.owner).toBe(lock.owner);
    expect(again.lease.fence).toBe(lock.lease.fence + 1);
  });
});
