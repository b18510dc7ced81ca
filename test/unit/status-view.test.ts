import { stripVTControlCharacters } from "node:util";
import { describe, expect, it } from "vitest";
import { renderShardStatus, shardStatus } from "../../src/cli/status-view.ts";
import { aHealthyShard, aShardWithStalePrimary, NOW } from "../support/builders.ts";

const FAILURE_TIMEOUT_MS = 3000;

function statusOf(builder: ReturnType<typeof aHealthyShard>) {
  return shardStatus(builder.build(), NOW, FAILURE_TIMEOUT_MS);
}

describe("shard status: what the replicas see of a stale primary", () => {
  it.each([
    ["a healthy shard says nothing", aHealthyShard(), undefined],
    [
      "failsafe: the primary's agent is silent while its replicas see the database serving",
      aHealthyShard()
        .withNode({ node_id: "p1", ageMs: 20_000 })
        .withNode({ node_id: "r1", primary_link: "up", primary_probe: "ok" })
        .withNode({ node_id: "r2", primary_link: "up", primary_probe: "ok" }),
      /^failsafe: p1 serves without its agent's heartbeats .* r1, r2 see it serving/,
    ],
    [
      "fenced: the replicas find the primary refusing every write",
      aHealthyShard()
        .withNode({ node_id: "p1", ageMs: 20_000 })
        .withNode({ node_id: "r1", primary_link: "up", primary_probe: "fenced" })
        .withNode({ node_id: "r2", primary_link: "up", primary_probe: "fenced" }),
      /^fenced: r1, r2 find p1 refusing every write/,
    ],
    ["down: the replicas lost the primary", aShardWithStalePrimary(), /^down: r1, r2 report p1/],
  ] as const)("%s", (_name, builder, expected) => {
    const status = statusOf(builder);
    if (expected === undefined) expect(status.primary_seen_by_replicas).toBeUndefined();
    else expect(status.primary_seen_by_replicas).toMatch(expected);
  });

  it("renders the replicas' view and each replica's probe", () => {
    const text = stripVTControlCharacters(
      renderShardStatus(
        statusOf(
          aHealthyShard()
            .withNode({ node_id: "p1", ageMs: 20_000 })
            .withNode({ node_id: "r1", primary_link: "up", primary_probe: "fenced" })
            .withNode({ node_id: "r2", primary_link: "up", primary_probe: "fenced" }),
        ),
      ),
    );
    expect(text).toMatch(/PROBE/);
    expect(text).toMatch(/^r1 .* fenced /m);
    expect(text).toMatch(/fenced: r1, r2 find p1 refusing every write/);
  });

  it("shows a heartbeat dated ahead of the clock as ahead, and stale beyond the clock bound", () => {
    const status = statusOf(aHealthyShard().withNode({ node_id: "r1", ageMs: -60_000 }));
    const r1 = status.nodes.find((node) => node.node_id === "r1");
    expect(r1).toMatchObject({ heartbeat_age_ms: -60_000, stale: true });
    expect(stripVTControlCharacters(renderShardStatus(status))).toMatch(/\+60\.0s ahead/);
    const near = statusOf(aHealthyShard().withNode({ node_id: "r1", ageMs: -500 }));
    expect(near.nodes.find((node) => node.node_id === "r1")?.stale).toBe(false);
  });
});

describe("shard status: quiet replicas", () => {
  it("shows a replica silent within its keepalive as quiet, without a lag from its old offset", () => {
    // Prepare
    const builder = aHealthyShard()
      .withNode({ node_id: "r1", ageMs: 12_000, keepalive_ms: 20_000, last_txn_id: 10 })
      .withNode({ node_id: "r2", ageMs: 24_000, keepalive_ms: 20_000 });
    // Act
    const status = statusOf(builder);
    const text = stripVTControlCharacters(renderShardStatus(status));
    // Assess
    expect(status.nodes.find((node) => node.node_id === "r1")).toMatchObject({
      quiet: true,
      stale: false,
      lag: undefined,
      keepalive_ms: 20_000,
    });
    expect(status.nodes.find((node) => node.node_id === "r2")).toMatchObject({ quiet: false, stale: true });
    expect(text).toMatch(/^r1 .* 12\.0s \(quiet\)/m);
  });
});
