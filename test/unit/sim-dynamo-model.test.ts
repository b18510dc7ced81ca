import type { DynamoDBDocumentClient } from "@aws-sdk/lib-dynamodb";
import { describe, expect, it } from "vitest";
import { createDynamoCoordinationStore } from "../../src/adapters/dynamo-coordination-store.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import type { HeartbeatInput, Topology } from "../../src/core/model.ts";
import { type CoordinationStore, LockLost } from "../../src/core/ports.ts";
import { DynamoTable } from "../../src/dev/sim/dynamo-model.ts";

/**
 * The simulator's DynamoDB model under the REAL coordination-store adapter: the cases of
 * test/integration/coordination-store.test.ts that carry the store's conditions (lock, fence, epoch
 * compare-and-set, replica-set sets, snapshot), so the model honours the expressions the adapter
 * sends as DynamoDB Local does. The adapter's rules stay in the adapter.
 */

function aStore(
  table = new DynamoTable(),
  now = { ms: Date.UTC(2026, 0, 1) },
): { store: CoordinationStore; now: { ms: number } } {
  const documents = {
    send: async (command: { constructor: { name: string }; input: unknown }) =>
      table.execute(command.constructor.name, command.input as Record<string, unknown>),
  } as unknown as DynamoDBDocumentClient;
  const store = createDynamoCoordinationStore({
    documents,
    tableName: "t",
    clock: { now: () => now.ms },
    logger: silentLogger,
  });
  return { store, now };
}

function aTopology(epoch: number, primary: string): Topology {
  return { shard: "s1", epoch, primary_node_id: primary, status: "online", updated_at: 1 };
}

function aHeartbeat(node: string, at: number): HeartbeatInput {
  return {
    shard: "s1",
    node_id: node,
    node_address: `${node}:6379`,
    role: "replica",
    last_updated: at * 1000,
    db_status: "up",
    last_txn_id: 10,
    repl_id: "r".repeat(40),
    epoch: 1,
    priority: 100,
  };
}

describe("the simulator's DynamoDB model under the real store adapter", () => {
  it("gives a lock to one of 20 acquirers, raises the fence on each acquisition and hands over only an expired lease", async () => {
    // Prepare
    const { store, now } = aStore();

    // Act
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => store.locks.acquire("s1", `o${i}`, 1000)),
    );
    const live = await store.locks.acquire("s1", "late", 1000);
    now.ms += 1001;
    const expired = await store.locks.acquire("s1", "late", 1000);

    // Assess
    expect(results.filter((lease) => lease !== false)).toHaveLength(1);
    expect(live).toBe(false);
    expect(expired).toMatchObject({ owner: "late", fence: 2 });
    expect(await store.locks.release("s1", "o0")).toBe(false);
    expect(await store.locks.renew("s1", "late", 1000)).toBe(true);
  });

  it("lets one of ten writers bump the epoch, creates the first topology only once, and refuses a stale lease with LockLost", async () => {
    // Prepare
    const { store, now } = aStore();
    const first = await store.locks.acquire("s1", "first", 1000);
    if (first === false) throw new Error("no lease");

    // Act
    const created = [
      await store.topology.compareAndSet("s1", undefined, aTopology(1, "a")),
      await store.topology.compareAndSet("s1", undefined, aTopology(1, "b")),
    ];
    const bumps = await Promise.all(
      Array.from({ length: 10 }, (_, i) => store.topology.compareAndSet("s1", 1, aTopology(2, `w${i}`))),
    );
    now.ms += 1001;
    const second = await store.locks.acquire("s1", "second", 1000);
    if (second === false) throw new Error("no lease");
    const stale = await store.topology
      .compareAndSet("s1", 2, aTopology(3, "stale"), { lease: first })
      .catch((error: unknown) => error);
    const current = await store.topology.compareAndSet("s1", 2, aTopology(3, "current"), { lease: second });

    // Assess
    expect(created).toEqual([true, false]);
    expect(bumps.filter(Boolean)).toHaveLength(1);
    expect(stale).toBeInstanceOf(LockLost);
    expect(current).toBe(true);
    expect(await store.topology.read("s1")).toMatchObject({ epoch: 3, primary_node_id: "current" });
  });

  it("keeps replica-set ids added and removed as string sets and reads heartbeats back in the snapshot", async () => {
    // Prepare
    const { store, now } = aStore();

    // Act
    await store.heartbeats.put(aHeartbeat("n1", now.ms));
    await store.heartbeats.put(aHeartbeat("n2", now.ms));
    await store.replicaSets.add("s1", "n1", ["n2", "n3"]);
    await store.replicaSets.remove("s1", "n1", ["n3"]);
    const afterRemove = await store.heartbeats.snapshot("s1");
    await store.replicaSets.remove("s1", "n1", ["n2"]);
    const emptied = await store.heartbeats.snapshot("s1");

    // Assess
    expect(afterRemove.nodes.map((node) => node.node_id).sort()).toEqual(["n1", "n2"]);
    expect(afterRemove.replicaSets.n1).toEqual(["n2"]);
    expect(emptied.replicaSets.n1 ?? []).toEqual([]);
    expect(afterRemove.malformed).toEqual([]);
  });
});
