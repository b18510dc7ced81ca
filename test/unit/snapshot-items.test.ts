import { describe, expect, it } from "vitest";
import {
  decodePageToken,
  encodePageToken,
  snapshotFromItems,
} from "../../src/adapters/dynamo-coordination-store.ts";
import { ConfigurationError } from "../../src/core/errors.ts";

function aHeartbeatItem(node: string, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    pk: "SHARD#s1",
    sk: `NODE#${node}`,
    shard: "s1",
    node_id: node,
    node_address: "10.0.0.1:6379",
    role: "replica",
    last_updated: 1_700_000_000_000_000,
    last_txn_id: 42,
    ...overrides,
  };
}

describe("typing a shard partition's items", () => {
  it("sorts every item type into the snapshot and applies the schema's defaults", () => {
    // Act
    const snapshot = snapshotFromItems("s1", [
      aHeartbeatItem("n2"),
      aHeartbeatItem("n1", { role: "primary" }),
      { pk: "SHARD#s1", sk: "REPLICAS#n1", replicas: new Set(["n3", "n2"]) },
      { pk: "SHARD#s1", sk: "LOCK", owner: "o", expires_at: 5, ttl: 9 },
      {
        pk: "SHARD#s1",
        sk: "TOPOLOGY",
        shard: "s1",
        epoch: 4,
        status: "online",
        updated_at: 1,
        write_id: "w",
      },
    ]);

    // Assess
    expect(snapshot.nodes.map((node) => node.node_id)).toEqual(["n1", "n2"]);
    expect(snapshot.nodes[1]).toMatchObject({ db_status: "up", repl_id: "", epoch: 0, priority: 100 });
    expect(snapshot.replicaSets).toEqual({ n1: ["n2", "n3"] });
    expect(snapshot.lock).toEqual({ owner: "o", expires_at: 5, ttl: 9 });
    expect(snapshot.topology).toEqual({ shard: "s1", epoch: 4, status: "online", updated_at: 1 });
    expect(snapshot.malformed).toEqual([]);
  });

  it.each([
    ["a role outside the enum", aHeartbeatItem("n1", { role: "leader" }), "NODE#n1", "role"],
    ["a missing address", aHeartbeatItem("n1", { node_address: undefined }), "NODE#n1", "node_address"],
    ["a node id that does not match the key", aHeartbeatItem("n1", { node_id: "n9" }), "NODE#n1", "node_id"],
    ["a heartbeat of another shard", aHeartbeatItem("n1", { shard: "s2" }), "NODE#n1", "node_id"],
    ["a replica set of numbers", { sk: "REPLICAS#n1", replicas: new Set([1]) }, "REPLICAS#n1", "replicas"],
    ["a lock without an owner", { sk: "LOCK", expires_at: 1 }, "LOCK", "owner"],
    [
      "a topology with a negative epoch",
      { sk: "TOPOLOGY", shard: "s1", epoch: -1, status: "online", updated_at: 1 },
      "TOPOLOGY",
      "epoch",
    ],
    ["an unknown item", { sk: "SURPRISE" }, "SURPRISE", "sk"],
  ])("leaves out %s and reports its field", (_, item, sk, field) => {
    // Act
    const snapshot = snapshotFromItems("s1", [aHeartbeatItem("ok"), item]);

    // Assess
    expect(snapshot.nodes.map((node) => node.node_id)).toEqual(["ok"]);
    expect(snapshot.malformed).toEqual([{ sk, field, reason: expect.any(String) }]);
    expect(snapshot.lock).toBeUndefined();
    expect(snapshot.topology).toBeUndefined();
  });
});

describe("shard list page tokens", () => {
  it.each([{ after: "SHARD#orders" }, { legacy: {} }, { legacy: { pk: "SHARDS", sk: "SHARD#orders" } }])(
    "round-trips a position in the shard index or the legacy index partition: %j",
    (token) => {
      expect(decodePageToken(encodePageToken(token))).toEqual(token);
    },
  );

  it.each([
    "garbage!",
    encodePageToken({ pk: "SHARD#x", sk: "LOCK" }),
    encodePageToken({ after: "CONTROL#x" }),
    encodePageToken({ legacy: { pk: "SHARD#x", sk: "LOCK" } }),
    "",
  ])("rejects a token it did not issue: %j", (token) => {
    expect(() => decodePageToken(token)).toThrow(ConfigurationError);
  });
});
