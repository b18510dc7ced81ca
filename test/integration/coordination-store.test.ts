import { PutCommand, QueryCommand } from "@aws-sdk/lib-dynamodb";
import { afterAll, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { AwsClock } from "../../src/adapters/clock.ts";
import { createDynamoCoordinationStore } from "../../src/adapters/dynamo-coordination-store.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { listAllShards } from "../../src/cli/aws-session.ts";
import { CoordinationUnavailable } from "../../src/core/errors.ts";
import type { HeartbeatInput, HistoryRecord, Topology } from "../../src/core/model.ts";
import type { Logger } from "../../src/core/observability.ts";
import { type Clock, type CoordinationStore, LockLost } from "../../src/core/ports.ts";
import { keys, SHARD_INDEX } from "../../src/core/table.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { ensureTable } from "../../src/dev/local-stack/table.ts";
import { awsEnv, dynamoClient, tableName, uniqueName } from "../support/aws.ts";
import { waitFor } from "../support/wait.ts";

const opened: AwsAdapters[] = [];

function adapters(options: Parameters<typeof createAwsAdapters>[0] = {}): AwsAdapters {
  const built = createAwsAdapters({ env: { ...awsEnv() }, tableName: tableName(), ...options });
  opened.push(built);
  return built;
}

afterAll(() => {
  for (const built of opened) built.destroy();
});

/** A clock the test moves by hand, so lease expiry needs no sleeping. */
class ManualClock implements Clock {
  at: number;
  constructor(at: number) {
    this.at = at;
  }
  now(): number {
    return this.at;
  }
}

function storeWithClock(clock: Clock, logger?: Logger): CoordinationStore {
  return createDynamoCoordinationStore({
    documents: adapters().clients.documents,
    tableName: tableName(),
    clock,
    logger,
  });
}

function shardId(): string {
  return uniqueName("s").slice(0, 24);
}

function aHeartbeat(shard: string, nodeId: string, overrides: Partial<HeartbeatInput> = {}): HeartbeatInput {
  return {
    shard,
    node_id: nodeId,
    node_address: `10.0.0.${nodeId.length}:6379`,
    role: "replica",
    last_updated: Date.now() * 1000,
    last_txn_id: 100,
    primary_node_id: "n1",
    ...overrides,
  };
}

function aHistoryRecord(shard: string, epoch: number, overrides: Partial<HistoryRecord> = {}): HistoryRecord {
  return {
    shard,
    epoch,
    kind: "failover",
    at: epoch,
    reason: `epoch ${epoch}`,
    candidates: [],
    phase_timings: {},
    ...overrides,
  };
}

function aTopology(shard: string, epoch: number, primary: string): Topology {
  return { shard, epoch, primary_node_id: primary, status: "online", updated_at: Date.now() };
}

describe("lock", () => {
  it("has exactly one winner in each of 50 rounds of 20 concurrent acquirers", async () => {
    // Prepare: four independent clients, as several controllers would be.
    const stores = [adapters(), adapters(), adapters(), adapters()].map((built) => built.store);
    const shard = shardId();
    const winnersPerRound: number[] = [];

    for (let round = 0; round < 50; round += 1) {
      // Act
      const owners = Array.from({ length: 20 }, (_, index) => `owner-${round}-${index}`);
      const results = await Promise.all(
        owners.map((owner, index) => stores[index % stores.length]?.locks.acquire(shard, owner, 60_000)),
      );
      const winners = owners.filter((_, index) => results[index] !== false);
      winnersPerRound.push(winners.length);
      const holder = (await stores[0]?.heartbeats.snapshot(shard))?.lock?.owner;
      expect(holder).toBe(winners[0]);
      await stores[0]?.locks.release(shard, winners[0] ?? "");
    }

    // Assess
    expect(winnersPerRound).toEqual(Array.from({ length: 50 }, () => 1));
  });

  it("lets a second owner take over an expired lock but not a live one", async () => {
    // Prepare
    const clock = new ManualClock(Date.now());
    const store = storeWithClock(clock);
    const shard = shardId();
    await expect(store.locks.acquire(shard, "first", 1000, "n1")).resolves.toEqual({
      shard,
      owner: "first",
      fence: 1,
    });

    // Act
    clock.at += 999;
    const whileLive = await store.locks.acquire(shard, "second", 1000);
    clock.at += 2;
    const afterExpiry = await store.locks.acquire(shard, "second", 1000);
    const renewByFormerOwner = await store.locks.renew(shard, "first", 1000);

    // Assess
    expect(whileLive).toBe(false);
    expect(afterExpiry).toEqual({ shard, owner: "second", fence: 2 });
    expect(renewByFormerOwner).toBe(false);
    expect((await store.heartbeats.snapshot(shard)).lock?.owner).toBe("second");
  });

  it("expires on the real clock after its lease", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();
    const acquiredAt = Date.now();
    await store.locks.acquire(shard, "first", 300);

    // Act
    const early = await store.locks.acquire(shard, "second", 300);
    const late = await waitFor(
      () => store.locks.acquire(shard, "second", 300),
      "the lease to expire",
      3000,
      20,
    );
    const heldMs = Date.now() - acquiredAt;

    // Assess
    expect(early).toBe(false);
    expect(late).toMatchObject({ owner: "second" });
    expect(heldMs).toBeGreaterThanOrEqual(300);
  });

  it("refuses release by a non-owner and leaves the lock intact", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();
    await store.locks.acquire(shard, "holder", 60_000, "n1");
    const before = (await store.heartbeats.snapshot(shard)).lock;

    // Act
    const released = await store.locks.release(shard, "intruder");

    // Assess
    expect(released).toBe(false);
    expect((await store.heartbeats.snapshot(shard)).lock).toEqual(before);
    expect(before?.owner).toBe("holder");
    expect(before?.for_primary).toBe("n1");
  });

  it("renews only for its owner and while the lease is live", async () => {
    // Prepare
    const clock = new ManualClock(Date.now());
    const store = storeWithClock(clock);
    const shard = shardId();
    await store.locks.acquire(shard, "holder", 1000);

    // Act
    clock.at += 500;
    const byOwner = await store.locks.renew(shard, "holder", 1000);
    const byOther = await store.locks.renew(shard, "other", 1000);
    clock.at += 1001;
    const afterExpiry = await store.locks.renew(shard, "holder", 1000);

    // Assess
    expect([byOwner, byOther, afterExpiry]).toEqual([true, false, false]);
    expect((await store.heartbeats.snapshot(shard)).lock?.expires_at).toBe(clock.at - 1001 + 1000);
  });

  it("treats acquiring a lock it already holds as held, so a retried put is not a lost race", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();
    await store.locks.acquire(shard, "holder", 60_000);

    // Act
    const again = await store.locks.acquire(shard, "holder", 60_000);

    // Assess
    expect(again).toMatchObject({ owner: "holder" });
  });
});

describe("topology", () => {
  it("lets exactly one of 10 concurrent writers bump each epoch", async () => {
    // Prepare
    const stores = [adapters(), adapters()].map((built) => built.store);
    const shard = shardId();
    await stores[0]?.topology.compareAndSet(shard, undefined, aTopology(shard, 0, "n0"));
    const successesPerEpoch: number[] = [];

    for (let epoch = 0; epoch < 20; epoch += 1) {
      // Act
      const writers = Array.from({ length: 10 }, (_, index) => `w${index}`);
      const results = await Promise.all(
        writers.map((writer, index) =>
          stores[index % stores.length]?.topology.compareAndSet(
            shard,
            epoch,
            aTopology(shard, epoch + 1, writer),
          ),
        ),
      );
      const winners = writers.filter((_, index) => results[index] === true);
      successesPerEpoch.push(winners.length);
      const stored = await stores[0]?.topology.read(shard);
      expect(stored?.epoch).toBe(epoch + 1);
      expect(stored?.primary_node_id).toBe(winners[0]);
    }

    // Assess
    expect(successesPerEpoch).toEqual(Array.from({ length: 20 }, () => 1));
  });

  it("creates the first topology only when none exists", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();

    // Act
    const first = await store.topology.compareAndSet(shard, undefined, aTopology(shard, 1, "a"));
    const second = await store.topology.compareAndSet(shard, undefined, aTopology(shard, 1, "b"));
    const stale = await store.topology.compareAndSet(shard, 0, aTopology(shard, 1, "c"));

    // Assess
    expect([first, second, stale]).toEqual([true, false, false]);
    expect(await store.topology.read(shard)).toMatchObject({
      epoch: 1,
      primary_node_id: "a",
      status: "online",
    });
  });

  it("reads nothing for a shard without a topology", async () => {
    const { store } = adapters();
    await expect(store.topology.read(shardId())).resolves.toBeUndefined();
  });
});

describe("fenced writes (every controller write conditioned on its lease)", () => {
  /** A controller that took the lock, and a second one that took it over after the lease expired. */
  async function takenOver() {
    const clock = new ManualClock(Date.now());
    const store = storeWithClock(clock);
    const shard = shardId();
    await store.topology.compareAndSet(shard, undefined, aTopology(shard, 1, "n1"));
    const first = await store.locks.acquire(shard, "first", 1000);
    if (!first) throw new Error("first acquire failed");
    clock.at += 1001;
    const second = await store.locks.acquire(shard, "second", 1000);
    if (!second) throw new Error("takeover failed");
    return { store, shard, first, second };
  }

  it("raises the fence by one on every acquisition", async () => {
    // Prepare
    const { shard, first, second } = await takenOver();

    // Assess
    expect(first).toEqual({ shard, owner: "first", fence: 1 });
    expect(second).toEqual({ shard, owner: "second", fence: 2 });
  });

  it("rejects a topology write by a controller whose lease was taken over with LockLost, writing nothing", async () => {
    // Prepare
    const { store, shard, first, second } = await takenOver();

    // Act
    const stale = store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "stale"), { lease: first });
    const error = await stale.catch((caught: unknown) => caught);
    const current = await store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "current"), {
      lease: second,
    });

    // Assess
    expect(error).toBeInstanceOf(LockLost);
    expect(String(error)).toMatch(/no longer held by first \(fence 1\); nothing written/);
    expect(current).toBe(true);
    expect(await store.topology.read(shard)).toMatchObject({ epoch: 2, primary_node_id: "current" });
  });

  it("rejects a history append and a node deletion by the stale holder with LockLost", async () => {
    // Prepare
    const { store, shard, first } = await takenOver();
    await store.heartbeats.put(aHeartbeat(shard, "n1", { role: "primary", primary_node_id: undefined }));

    // Act + Assess
    await expect(store.history.append(aHistoryRecord(shard, 2), { lease: first })).rejects.toBeInstanceOf(
      LockLost,
    );
    await expect(store.heartbeats.deleteNode(shard, "n1", { lease: first })).rejects.toBeInstanceOf(LockLost);
    expect(await store.history.list(shard)).toEqual([]);
    expect((await store.heartbeats.snapshot(shard)).nodes.map((node) => node.node_id)).toEqual(["n1"]);
  });

  it("rejects a write after the lock was released, and one by a former holder that re-acquired", async () => {
    // Prepare: the same owner token acquiring again gets a new fence.
    const { store } = adapters();
    const shard = shardId();
    await store.topology.compareAndSet(shard, undefined, aTopology(shard, 1, "n1"));
    const lease = await store.locks.acquire(shard, "holder", 60_000);
    if (!lease) throw new Error("acquire failed");
    await store.locks.release(shard, "holder");

    // Act + Assess
    await expect(
      store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "x"), { lease }),
    ).rejects.toBeInstanceOf(LockLost);
    const again = await store.locks.acquire(shard, "holder", 60_000);
    await expect(
      store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "x"), { lease }),
    ).rejects.toBeInstanceOf(LockLost);
    expect(again).toMatchObject({ fence: lease.fence + 1 });
    expect(await store.topology.read(shard)).toMatchObject({ epoch: 1 });
  });

  it("keeps the epoch compare-and-set and the idempotent history under a held lease", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();
    await store.topology.compareAndSet(shard, undefined, aTopology(shard, 1, "n1"));
    const lease = await store.locks.acquire(shard, "holder", 60_000);
    if (!lease) throw new Error("acquire failed");

    // Act
    const wrongEpoch = await store.topology.compareAndSet(shard, 5, aTopology(shard, 6, "x"), { lease });
    const bumped = await store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "n2"), { lease });
    await store.history.append(aHistoryRecord(shard, 2, { reason: "first" }), { lease });
    await store.history.append(aHistoryRecord(shard, 2, { reason: "second" }), { lease });

    // Assess
    expect([wrongEpoch, bumped]).toEqual([false, true]);
    expect((await store.history.list(shard)).map((record) => record.reason)).toEqual(["first"]);
  });

  it("aborts an epoch bump when the old primary's replica set changed since the decision", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();
    await store.topology.compareAndSet(shard, undefined, aTopology(shard, 1, "n1"));
    await store.replicaSets.add(shard, "n1", ["n2", "n3"]);
    const decided = (await store.heartbeats.snapshot(shard)).replicaSetVersions.n1;
    const lease = await store.locks.acquire(shard, "holder", 60_000);
    if (!lease) throw new Error("acquire failed");
    await store.replicaSets.remove(shard, "n1", ["n3"]);
    const now = (await store.heartbeats.snapshot(shard)).replicaSetVersions.n1;

    // Act
    const stale = await store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "n2"), {
      lease,
      replicaSet: { primary: "n1", version: decided },
    });
    const absent = await store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "n2"), {
      lease,
      replicaSet: { primary: "n1", version: undefined },
    });
    const current = await store.topology.compareAndSet(shard, 1, aTopology(shard, 2, "n2"), {
      lease,
      replicaSet: { primary: "n1", version: now },
    });
    const neverSet = await store.topology.compareAndSet(shard, 2, aTopology(shard, 3, "n3"), {
      lease,
      replicaSet: { primary: "n9", version: undefined },
    });

    // Assess
    expect(decided).toBeDefined();
    expect(now).not.toBe(decided);
    expect([stale, absent, current, neverSet]).toEqual([false, false, true, true]);
    expect(await store.topology.read(shard)).toMatchObject({ epoch: 3 });
  });
});

describe("heartbeats and the shard snapshot", () => {
  it("returns typed heartbeats, replica sets, topology and lock from strongly consistent queries: members and the controller's partition, then each member's own partition", async () => {
    // Prepare
    const built = adapters();
    const { store } = built;
    const shard = shardId();
    await store.heartbeats.put(aHeartbeat(shard, "n1", { role: "primary", primary_node_id: undefined }));
    await store.heartbeats.put(aHeartbeat(shard, "n2", { last_txn_id: 90, primary_link: "up" }));
    await store.replicaSets.add(shard, "n1", ["n2", "n3"]);
    await store.topology.compareAndSet(shard, undefined, aTopology(shard, 3, "n1"));
    await store.locks.acquire(shard, "owner", 60_000);
    await store.history.append(aHistoryRecord(shard, 3));
    built.counter.reset();

    // Act
    const snapshot = await store.heartbeats.snapshot(shard);

    // Assess
    // The membership and the controller's partition, then n1's and n2's partitions.
    expect(built.counter.snapshot()).toEqual({ "DynamoDB.Query": { calls: 4, requests: 4, errors: 0 } });
    expect(snapshot.nodes.map((node) => [node.node_id, node.role, node.last_txn_id])).toEqual([
      ["n1", "primary", 100],
      ["n2", "replica", 90],
    ]);
    expect(snapshot.nodes[1]).toMatchObject({ primary_link: "up", epoch: 0, priority: 100, db_status: "up" });
    expect(snapshot.replicaSets).toEqual({ n1: ["n2", "n3"] });
    expect(snapshot.topology?.epoch).toBe(3);
    expect(snapshot.lock?.owner).toBe("owner");
    expect(snapshot.malformed).toEqual([]);
  });

  it("leaves a malformed heartbeat out of the snapshot with its field and reason, and logs it", async () => {
    // Prepare
    const warnings: Array<Record<string, unknown>> = [];
    const logger: Logger = {
      ...silentLogger,
      warn: (message, attributes) => warnings.push({ message, ...attributes }),
    };
    const built = adapters();
    const store = storeWithClock(built.clock, logger);
    const shard = shardId();
    await store.heartbeats.put(aHeartbeat(shard, "good"));
    await built.clients.documents.send(
      new PutCommand({
        TableName: tableName(),
        Item: {
          ...aHeartbeat(shard, "bad"),
          pk: keys.nodePk(shard, "bad"),
          sk: keys.node("bad"),
          last_updated: "yesterday",
        },
      }),
    );
    await built.clients.documents.send(
      new PutCommand({ TableName: tableName(), Item: { pk: keys.shardPk(shard), sk: keys.member("bad") } }),
    );

    // Act
    const snapshot = await store.heartbeats.snapshot(shard);

    // Assess
    expect(snapshot.nodes.map((node) => node.node_id)).toEqual(["good"]);
    expect(snapshot.malformed).toHaveLength(1);
    expect(snapshot.malformed[0]).toMatchObject({ sk: "NODE#bad", field: "last_updated" });
    expect(snapshot.malformed[0]?.reason).toMatch(/last_updated: .*number/);
    expect(warnings).toEqual([expect.objectContaining({ shard, sk: "NODE#bad", field: "last_updated" })]);
  });

  it("reads back the heartbeat that was written, with the TTL set for garbage collection only", async () => {
    // Prepare
    const { store, clock } = adapters();
    const shard = shardId();
    const heartbeat = aHeartbeat(shard, "n1", {
      last_updated: clock.nowMicros(),
      repl_id: "abc",
      priority: 0,
    });

    // Act
    await store.heartbeats.put(heartbeat);
    const [stored] = (await store.heartbeats.snapshot(shard)).nodes;

    // Assess
    expect(stored).toMatchObject({ ...heartbeat });
    expect(stored?.ttl).toBeGreaterThan(Date.now() / 1000 + 86_400);
  });

  it("takes from a node's partition only that node's own heartbeat and replica set, never a peer's it holds", async () => {
    // Prepare: n3's partition holds copies of n1's heartbeat and replica set (what n3's credentials can write).
    const built = adapters();
    const { store } = built;
    const shard = shardId();
    await store.heartbeats.put(aHeartbeat(shard, "n1", { role: "primary", last_txn_id: 100 }));
    await store.heartbeats.put(aHeartbeat(shard, "n3", { last_txn_id: 50 }));
    await store.replicaSets.add(shard, "n1", ["n2", "n3"]);
    for (const item of [
      { ...aHeartbeat(shard, "n1", { last_txn_id: 999, last_updated: 1 }), sk: keys.node("n1") },
      { sk: keys.replicas("n1"), replicas: new Set(["n3"]), version: 99 },
    ]) {
      await built.clients.documents.send(
        new PutCommand({ TableName: tableName(), Item: { ...item, pk: keys.nodePk(shard, "n3") } }),
      );
    }

    // Act
    const snapshot = await store.heartbeats.snapshot(shard);

    // Assess
    expect(snapshot.nodes.map((node) => [node.node_id, node.last_txn_id])).toEqual([
      ["n1", 100],
      ["n3", 50],
    ]);
    expect(snapshot.replicaSets).toEqual({ n1: ["n2", "n3"] });
    expect(snapshot.malformed.map((bad) => bad.sk).sort()).toEqual(["NODE#n1", "REPLICAS#n1"]);
  });

  it("ignores heartbeats and replica sets in the shard partition once the shard is laid out by node partitions", async () => {
    // Prepare: a forged old-layout heartbeat of n1 (any agent of the shard may write the shard partition).
    const built = adapters();
    const { store } = built;
    const shard = shardId();
    await store.heartbeats.put(aHeartbeat(shard, "n1", { role: "primary", last_txn_id: 100 }));
    await store.topology.compareAndSet(shard, undefined, aTopology(shard, 1, "n1"));
    for (const item of [
      {
        ...aHeartbeat(shard, "n1", { last_txn_id: 999 }),
        sk: keys.node("n1"),
        written_at: Number.MAX_SAFE_INTEGER,
      },
      { ...aHeartbeat(shard, "n9"), sk: keys.node("n9") },
      { sk: keys.replicas("n1"), replicas: new Set(["n9"]) },
    ]) {
      await built.clients.documents.send(
        new PutCommand({ TableName: tableName(), Item: { ...item, pk: keys.shardPk(shard) } }),
      );
    }

    // Act
    const snapshot = await store.heartbeats.snapshot(shard);

    // Assess
    expect(snapshot.legacyTopology).toBeUndefined();
    expect(snapshot.nodes.map((node) => [node.node_id, node.last_txn_id])).toEqual([["n1", 100]]);
    expect(snapshot.replicaSets).toEqual({});
    expect(snapshot.malformed).toEqual([]);
  });

  it("deletes a node's heartbeat, replica set and member item, leaving the other nodes", async () => {
    // Prepare
    const built = adapters();
    const { store } = built;
    const shard = shardId();
    await store.heartbeats.put(aHeartbeat(shard, "n1", { role: "primary" }));
    await store.heartbeats.put(aHeartbeat(shard, "n2"));
    await store.replicaSets.add(shard, "n1", ["n2"]);

    // Act
    await store.heartbeats.deleteNode(shard, "n1");
    await store.heartbeats.deleteNode(shard, "n1");

    // Assess
    const snapshot = await store.heartbeats.snapshot(shard);
    expect(snapshot.nodes.map((node) => node.node_id)).toEqual(["n2"]);
    expect(snapshot.replicaSets).toEqual({});
    const { Items } = await built.clients.documents.send(
      new QueryCommand({
        TableName: tableName(),
        KeyConditionExpression: "pk = :pk",
        ExpressionAttributeValues: { ":pk": keys.shardPk(shard) },
        ConsistentRead: true,
      }),
    );
    expect(Items?.map((item) => item.sk)).toEqual([keys.member("n2")]);
  });
});

describe("replica set", () => {
  it("keeps every id added by concurrent writers and removes only the given ones", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();
    const ids = Array.from({ length: 12 }, (_, index) => `r${index}`);

    // Act
    await Promise.all(ids.map((id) => store.replicaSets.add(shard, "p", [id])));
    await Promise.all([
      store.replicaSets.remove(shard, "p", ["r0", "r1"]),
      store.replicaSets.remove(shard, "p", ["r2"]),
    ]);
    await store.replicaSets.remove(shard, "p", []);

    // Assess
    const { replicaSets } = await store.heartbeats.snapshot(shard);
    expect(replicaSets.p).toEqual(ids.slice(3).sort());
  });

  it("reports an emptied replica set as empty", async () => {
    const { store } = adapters();
    const shard = shardId();
    await store.replicaSets.add(shard, "p", ["a"]);
    await store.replicaSets.remove(shard, "p", ["a"]);
    expect((await store.heartbeats.snapshot(shard)).replicaSets).toEqual({ p: [] });
  });
});

describe("history", () => {
  it("keeps one record per epoch and lists the newest first", async () => {
    // Prepare
    const { store } = adapters();
    const shard = shardId();

    // Act
    for (const epoch of [1, 2, 10, 3]) {
      await store.history.append(aHistoryRecord(shard, epoch));
    }
    await store.history.append(
      aHistoryRecord(shard, 2, { kind: "switchover", reason: "a resumed duplicate" }),
    );

    // Assess
    const records = await store.history.list(shard);
    expect(records.map((record) => [record.epoch, record.reason])).toEqual([
      [10, "epoch 10"],
      [3, "epoch 3"],
      [2, "epoch 2"],
      [1, "epoch 1"],
    ]);
    expect((await store.history.list(shard, 2)).map((record) => record.epoch)).toEqual([10, 3]);
  });

  it("stays out of the shard snapshot", async () => {
    const { store } = adapters();
    const shard = shardId();
    await store.history.append(aHistoryRecord(shard, 1, { kind: "offline" }));
    expect((await store.heartbeats.snapshot(shard)).malformed).toEqual([]);
  });
});

describe("shard index", () => {
  it("lists every registered shard once across pages", async () => {
    // Prepare
    const { store } = adapters();
    const mine = Array.from({ length: 7 }, () => shardId());
    for (const shard of mine) await store.shards.register(shard);
    await store.shards.register(mine[0] ?? "");

    // Act
    const seen: string[] = [];
    const pageSizes: number[] = [];
    let token: string | undefined;
    do {
      const page = await store.shards.list(token, 3);
      seen.push(...page.shards);
      pageSizes.push(page.shards.length);
      token = page.nextPageToken;
    } while (token);

    // Assess
    expect(mine.map((shard) => seen.filter((seenShard) => seenShard === shard).length)).toEqual(
      mine.map(() => 1),
    );
    expect(Math.max(...pageSizes)).toBeLessThanOrEqual(3);
  });

  it("lists the legacy index partition too, and skips the rest of a shard's entries after the page it was met on", async () => {
    // Prepare: a table of its own, so that the pages hold only this test's shards.
    const table = uniqueName("idx").slice(0, 40);
    const client = dynamoClient();
    await ensureTable(client, table);
    client.destroy();
    const { store, clients } = adapters({ tableName: table });
    for (const shard of ["a1", "b2", "c3"]) await store.shards.register(shard);
    // A release before issue 38 registered `old` (and `a1`) in the partition every agent wrote.
    for (const shard of ["old", "a1"]) {
      await clients.documents.send(
        new PutCommand({
          TableName: table,
          Item: { pk: keys.shardIndexPk, sk: keys.shardIndexSk(shard), shard },
        }),
      );
    }
    // b2's credentials flood its own partition with 30 items carrying the index key.
    for (let index = 0; index < 30; index++) {
      await clients.documents.send(
        new PutCommand({
          TableName: table,
          Item: {
            pk: keys.shardPk("b2"),
            sk: `FLOOD#${index}`,
            [SHARD_INDEX.partitionKey]: SHARD_INDEX.value,
          },
        }),
      );
    }

    // Act
    const pages: string[][] = [];
    let token: string | undefined;
    do {
      const page = await store.shards.list(token, 3);
      pages.push(page.shards);
      token = page.nextPageToken;
    } while (token);

    // Assess: the index in two pages (a1 b2 | c3: b2's other 30 entries skipped unread, not 11
    // pages), then the legacy partition; each id once after the callers' dedup.
    expect(pages).toEqual([["a1", "b2"], ["c3"], ["a1", "old"]]);
    expect(await listAllShards(store)).toEqual(["a1", "b2", "c3", "old"]);
  });
});

describe("when the store cannot be used", () => {
  it("throws CoordinationUnavailable, not false, when nothing listens on the endpoint", async () => {
    // Prepare
    const port = await freePort();
    const { store } = adapters({
      env: { ...awsEnv(), AWS_ENDPOINT_URL_DYNAMODB: `http://127.0.0.1:${port}` },
      maxAttempts: 2,
    });
    const shard = shardId();

    // Act
    const outcomes = await Promise.allSettled([
      store.locks.acquire(shard, "o", 1000),
      store.locks.release(shard, "o"),
      store.topology.compareAndSet(shard, 0, aTopology(shard, 1, "n1")),
      store.heartbeats.snapshot(shard),
      store.heartbeats.put(aHeartbeat(shard, "n1")),
    ]);

    // Assess
    for (const outcome of outcomes) {
      expect(outcome.status).toBe("rejected");
      expect(outcome.status === "rejected" && outcome.reason).toBeInstanceOf(CoordinationUnavailable);
    }
  });

  it("says how to create the table when it does not exist", async () => {
    const { store } = adapters({ tableName: uniqueName("missing") });
    const attempt = store.locks.acquire(shardId(), "o", 1000);
    await expect(attempt).rejects.toBeInstanceOf(CoordinationUnavailable);
    await expect(attempt).rejects.toThrow(/shardguard local-stack/);
  });
});

describe("AWS-aligned clock", () => {
  it("pulls a host clock that is 10 minutes fast back to AWS time after one response", async () => {
    // Prepare
    const skewMs = 10 * 60_000;
    const clock = new AwsClock({
      source: { wallNow: () => Date.now() + skewMs, monotonicNow: () => performance.now() },
    });
    const built = adapters();
    built.clients.dynamo.middlewareStack.use(clock.plugin());

    // Act
    const before = clock.now() - Date.now();
    await built.store.topology.read(shardId());
    const after = clock.now() - Date.now();

    // Assess: the emulator runs on this host, whose real clock is right.
    expect(before).toBe(skewMs);
    expect(Math.abs(after)).toBeLessThan(1500);
  });
});
