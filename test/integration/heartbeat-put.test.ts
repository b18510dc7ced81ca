import { DynamoDBDocumentClient, GetCommand, PutCommand } from "@aws-sdk/lib-dynamodb";
import { afterAll, describe, expect, it } from "vitest";
import { AwsClock } from "../../src/adapters/clock.ts";
import { DynamoHeartbeatStore } from "../../src/adapters/dynamo-coordination-store.ts";
import { MAX_CLOCK_SKEW_MS } from "../../src/core/decide.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { keys } from "../../src/core/table.ts";
import { dynamoClient, tableName, uniqueName } from "../support/aws.ts";

/**
 * Heartbeat puts against DynamoDB Local: conditional on the write time, so an older put that lands
 * after a newer one (an SDK retry of a timed-out put) never overwrites it and resolves
 * `superseded`, while no writer (a restarted agent, a clock that was far ahead) is ever stuck.
 */

const clients: DynamoDBDocumentClient[] = [];
afterAll(() => {
  for (const client of clients) client.destroy();
});

/** What happens on the wire to a store's PutItems. */
interface PutHooks {
  /** Awaited before each PutItem request is sent. */
  readonly beforePut?: () => Promise<void>;
  /** Sends each PutItem request twice, as an SDK retry after a lost response does. */
  readonly sendPutTwice?: boolean;
  /** Called with each PutItem's request body once DynamoDB answered; may throw to lose the answer. */
  readonly afterPut?: (body: string) => void;
}

/** A heartbeat store on its own client (an agent process). */
function aStore(hooks: PutHooks = {}): { store: DynamoHeartbeatStore; documents: DynamoDBDocumentClient } {
  const documents = DynamoDBDocumentClient.from(dynamoClient());
  clients.push(documents);
  documents.middlewareStack.add(
    (next) => async (args) => {
      if (isPutItem(args)) {
        await hooks.beforePut?.();
        if (hooks.sendPutTwice) await next(args);
        const out = await next(args);
        const body = (args as { request?: { body?: unknown } }).request?.body;
        hooks.afterPut?.(body instanceof Uint8Array ? new TextDecoder().decode(body) : String(body ?? ""));
        return out;
      }
      return next(args);
    },
    { step: "build", name: "testPutHooks" },
  );
  return {
    store: new DynamoHeartbeatStore({ documents, tableName: tableName(), clock: new AwsClock() }),
    documents,
  };
}

function aHeartbeat(
  shard: string,
  atMicros: number,
  overrides: Partial<HeartbeatInput> = {},
): HeartbeatInput {
  return {
    shard,
    node_id: "n1",
    node_address: "10.0.0.1:6379",
    role: "replica",
    last_updated: atMicros,
    agent_updated: atMicros,
    last_txn_id: 100,
    primary_node_id: "n0",
    ...overrides,
  };
}

async function stored(
  documents: DynamoDBDocumentClient,
  shard: string,
): Promise<Record<string, unknown> | undefined> {
  const { Item } = await documents.send(
    new GetCommand({
      TableName: tableName(),
      Key: { pk: keys.nodePk(shard, "n1"), sk: keys.node("n1") },
      ConsistentRead: true,
    }),
  );
  return Item;
}

function isPutItem(args: unknown): boolean {
  const headers = (args as { request?: { headers?: Record<string, string> } }).request?.headers;
  return headers?.["x-amz-target"] === "DynamoDB_20120810.PutItem";
}

const MS = 1000;

describe("heartbeat put ordering", () => {
  it("an older put that lands after a newer one leaves the newer item and resolves superseded", async () => {
    // Prepare: the first PutItem is held on the wire until the second one has landed.
    let release: () => void = () => {};
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    let first = true;
    const { store, documents } = aStore({
      beforePut: async () => {
        if (!first) return;
        first = false;
        await held;
      },
    });
    const shard = uniqueName("hb").slice(0, 24);
    const t = Date.now() * MS;

    // Act
    const older = store.putIfNewer(
      aHeartbeat(shard, t, { last_txn_id: 1, role: "primary", primary_node_id: undefined }),
    );
    const newer = await store.putIfNewer(aHeartbeat(shard, t + 1000 * MS, { last_txn_id: 2 }));
    release();

    // Assess
    expect(newer).toBe("written");
    await expect(older).resolves.toBe("superseded");
    expect(await stored(documents, shard)).toMatchObject({
      last_txn_id: 2,
      role: "replica",
      agent_updated: t + 1000 * MS,
    });
    // The port's put resolves normally for a superseded write: nothing for the agent to back off on.
    await expect(store.put(aHeartbeat(shard, t + 500 * MS, { last_txn_id: 3 }))).resolves.toBeUndefined();
    expect(await stored(documents, shard)).toMatchObject({ last_txn_id: 2 });
  });

  it("orders two puts of the same instant by call order, and re-applies a retried request that had landed", async () => {
    // Prepare: every PutItem is sent twice, as an SDK retry after a lost response would.
    const { store, documents } = aStore({ sendPutTwice: true });
    const shard = uniqueName("hb").slice(0, 24);
    const t = Date.now() * MS;

    // Act
    const a = await store.putIfNewer(aHeartbeat(shard, t, { last_txn_id: 1 }));
    const b = await store.putIfNewer(aHeartbeat(shard, t, { last_txn_id: 2 }));

    // Assess
    expect([a, b]).toEqual(["written", "written"]);
    expect(await stored(documents, shard)).toMatchObject({ last_txn_id: 2 });
  });

  it("a restarted agent whose clock reads a few ms earlier is superseded only until its clock passes the last write", async () => {
    // Prepare: the previous process wrote at t.
    const previous = aStore();
    const shard = uniqueName("hb").slice(0, 24);
    const t = Date.now() * MS;
    await previous.store.putIfNewer(aHeartbeat(shard, t, { last_txn_id: 1 }));
    const restarted = aStore();

    // Act
    const early = await restarted.store.putIfNewer(aHeartbeat(shard, t - 5 * MS, { last_txn_id: 2 }));
    const next = await restarted.store.putIfNewer(aHeartbeat(shard, t + 1 * MS, { last_txn_id: 4 }));

    // Assess
    expect([early, next]).toEqual(["superseded", "written"]);
    expect(await stored(restarted.documents, shard)).toMatchObject({ last_txn_id: 4 });
  });

  it("registers the node as a member again after a put whose answer was lost re-created its deleted heartbeat", async () => {
    // Prepare: the node is a member; the controller's cleanup after a failover deletes it
    // (heartbeat and member item); the next heartbeat put lands but its answer is lost.
    let loseNextAnswer = false;
    const { store } = aStore({
      afterPut: (body) => {
        if (!loseNextAnswer || !body.includes("written_at")) return;
        loseNextAnswer = false;
        throw Object.assign(new Error("the answer did not arrive in time"), { name: "TimeoutError" });
      },
    });
    const shard = uniqueName("hb").slice(0, 24);
    const t = Date.now() * MS;
    const members = async () => (await store.snapshot(shard)).nodes.map((node) => node.node_id);
    await store.putIfNewer(aHeartbeat(shard, t));
    expect(await members()).toEqual(["n1"]);
    await store.deleteNode(shard, "n1");
    expect(await members()).toEqual([]);

    // Act
    loseNextAnswer = true;
    await expect(store.putIfNewer(aHeartbeat(shard, t + 1000 * MS))).rejects.toThrow();
    const next = await store.putIfNewer(aHeartbeat(shard, t + 2000 * MS, { last_txn_id: 9 }));

    // Assess: the heartbeat the lost put created is refreshed, and the node is a member again
    // (before: out of every snapshot for half the heartbeat TTL, simulator seed 44216).
    expect(next).toBe("written");
    expect(await members()).toEqual(["n1"]);
  });

  it("replaces a stored heartbeat dated beyond the clock bound, but not one within it", async () => {
    // Prepare
    const { store, documents } = aStore();
    const t = Date.now() * MS;
    const within = uniqueName("hb").slice(0, 24);
    const beyond = uniqueName("hb").slice(0, 24);
    await store.putIfNewer(aHeartbeat(within, t + MAX_CLOCK_SKEW_MS * MS, { last_txn_id: 1 }));
    await store.putIfNewer(aHeartbeat(beyond, t + (MAX_CLOCK_SKEW_MS + 1) * MS, { last_txn_id: 1 }));

    // Act
    const intoWithin = await store.putIfNewer(aHeartbeat(within, t, { last_txn_id: 2 }));
    const intoBeyond = await store.putIfNewer(aHeartbeat(beyond, t, { last_txn_id: 2 }));

    // Assess
    expect(intoWithin).toBe("superseded");
    expect(intoBeyond).toBe("written");
    expect(await stored(documents, within)).toMatchObject({ last_txn_id: 1 });
    expect(await stored(documents, beyond)).toMatchObject({ last_txn_id: 2 });
  });

  it("replaces a heartbeat written before the ordering existed, and reads back only the heartbeat's fields", async () => {
    // Prepare: an item as the unconditional put wrote it, without `written_at`.
    const { store, documents } = aStore();
    const shard = uniqueName("hb").slice(0, 24);
    const t = Date.now() * MS;
    await documents.send(
      new PutCommand({
        TableName: tableName(),
        Item: { ...aHeartbeat(shard, t + 60_000 * MS), pk: keys.nodePk(shard, "n1"), sk: keys.node("n1") },
      }),
    );
    const heartbeat = aHeartbeat(shard, t, { last_txn_id: 7 });

    // Act
    const outcome = await store.putIfNewer(heartbeat);
    const [node] = (await store.snapshot(shard)).nodes;

    // Assess
    expect(outcome).toBe("written");
    expect(node).toMatchObject(heartbeat);
    expect(node).not.toHaveProperty("written_at");
    expect(node).not.toHaveProperty("write_seq");
  });
});
