import { describe, expect, it } from "vitest";
import { answerSentinel, type SentinelReply, type SentinelView } from "../../src/core/sentinel.ts";
import { aHeartbeat, NOW } from "../support/builders.ts";
import { aTopology } from "../support/sentinel-builders.ts";

/**
 * The Sentinel endpoint's replica answers say how old what they give is (issue 35): a quiet
 * replica's `slave-repl-offset` is the offset of its last report, and `info-refresh` (Sentinel's
 * "ms since the last INFO") is that report's age.
 */

function aView(replica: Parameters<typeof aHeartbeat>[0]): SentinelView {
  return {
    shard: "s1",
    topology: aTopology(),
    nodes: [
      aHeartbeat({
        node_id: "p1",
        role: "primary",
        node_address: "10.0.0.1:6379",
        primary_node_id: undefined,
      }),
      aHeartbeat({ node_address: "10.0.0.2:6379", ...replica }),
    ],
    selfNodeId: "p1",
    nowMs: NOW,
    failureTimeoutMs: 3000,
  };
}

function replicaFields(view: SentinelView): Record<string, string> {
  const reply = answerSentinel("sentinel", ["replicas", "s1"], view);
  const item: SentinelReply | undefined = reply.type === "array" ? reply.items[0] : undefined;
  if (item?.type !== "map") throw new Error(`not a replica entry: ${JSON.stringify(reply)}`);
  return Object.fromEntries(
    item.entries.map(([key, value]) => [key, value.type === "bulk" ? value.value : "?"]),
  );
}

describe("SENTINEL REPLICAS: what is known and how old it is", () => {
  it.each([
    [
      "a replica heard 0.2 s ago",
      { node_id: "r1", last_txn_id: 71_648, ageMs: 200 },
      { flags: "slave", "slave-repl-offset": "71648", "info-refresh": "200", "master-link-down-time": "0" },
    ],
    [
      "a quiet replica: its report stands, its offset is 19 s old",
      { node_id: "r1", last_txn_id: 1_190, ageMs: 19_000, keepalive_ms: 20_000 },
      { flags: "slave", "slave-repl-offset": "1190", "info-refresh": "19000", "master-link-down-time": "0" },
    ],
    [
      "a replica silent past its keepalive",
      { node_id: "r1", last_txn_id: 1_190, ageMs: 40_000, keepalive_ms: 20_000 },
      { flags: "slave,s_down,disconnected", "info-refresh": "40000" },
    ],
  ] as const)("%s", (_name, replica, expected) => {
    // Act
    const fields = replicaFields(aView(replica));
    // Assess
    expect(fields).toMatchObject(expected);
  });

  it("gives no link-down time it does not know: a replica whose link is down", () => {
    // Act
    const fields = replicaFields(aView({ node_id: "r1", primary_link: "down" }));
    // Assess
    expect(fields).toMatchObject({ "master-link-status": "err", "info-refresh": "200" });
    expect(fields).not.toHaveProperty("master-link-down-time");
  });
});
