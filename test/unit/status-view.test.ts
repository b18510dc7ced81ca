import { stripVTControlCharacters } from "node:util";
import { describe, expect, it } from "vitest";
import { renderShardStatus, shardStatus } from "../../src/cli/status-view.ts";
import { aConfig, aHealthyShard, aShardWithStalePrimary, NOW } from "../support/builders.ts";

const CONFIG = aConfig({ failureTimeoutMs: 3000 });

function statusOf(builder: ReturnType<typeof aHealthyShard>, reportsAskedAt?: Record<string, number>) {
  return shardStatus(builder.build(), NOW, CONFIG, { reportsAskedAt });
}

const plain = (text: string) => stripVTControlCharacters(text);

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
    expect(r1).toMatchObject({ offset_age_ms: -60_000, report: "stale", role: "unknown" });
    expect(plain(renderShardStatus(status))).toMatch(/^r1 +unknown .* 990 as of 60 s ahead /m);
    const near = statusOf(aHealthyShard().withNode({ node_id: "r1", ageMs: -500 }));
    expect(near.nodes.find((node) => node.node_id === "r1")?.report).toBe("heard");
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
      report: "quiet",
      role: "replica",
      lag: undefined,
      keepalive_ms: 20_000,
    });
    expect(status.nodes.find((node) => node.node_id === "r2")).toMatchObject({
      report: "stale",
      role: "unknown",
    });
    expect(text).toMatch(/^r1 +replica .* 10 as of 12 s ago, quiet +\? +12 s ago \(quiet\)/m);
  });
});

describe("shard status: what is known and how old it is (issue 35)", () => {
  it("shows quiet in-sync replicas with their offset's age and no lag, not 50 KB behind", () => {
    // Prepare: the demo's table before the kill: the primary heard 0.2 s ago, both replicas quiet.
    const builder = aHealthyShard()
      .withNode({ node_id: "p1", last_txn_id: 51_842, ageMs: 200 })
      .withNode({ node_id: "r1", last_txn_id: 1_190, ageMs: 19_000, keepalive_ms: 20_000 })
      .withNode({ node_id: "r2", last_txn_id: 1_358, ageMs: 2_900, keepalive_ms: 20_000 });
    // Act
    const status = statusOf(builder);
    const text = plain(renderShardStatus(status));
    // Assess
    expect(status.nodes.map((node) => [node.node_id, node.lag])).toEqual([
      ["p1", undefined],
      ["r1", undefined],
      ["r2", undefined],
    ]);
    expect(text).toMatch(/^p1 +primary .* 51,842, 0\.2 s ago +- /m);
    expect(text).toMatch(/^r1 +replica .* 1,190 as of 19 s ago, quiet +\? /m);
    expect(text).toMatch(/^r2 +replica .* 1,358, 2\.9 s ago +\? /m);
    expect(text).toMatch(
      /lag \?: r1: its offset was read 19 s ago; r2: its offset was read 2\.7 s before the primary's/,
    );
    expect(text).toMatch(/--fresh asks it to report now/);
  });

  it("shows the lag of replicas read no earlier than the primary", () => {
    // Prepare
    const builder = aHealthyShard()
      .withNode({ node_id: "p1", last_txn_id: 71_648, ageMs: 900 })
      .withNode({ node_id: "r1", last_txn_id: 71_648, ageMs: 200 })
      .withNode({ node_id: "r2", last_txn_id: 61_648, ageMs: 400 });
    // Act
    const status = statusOf(builder);
    // Assess
    expect(status.nodes.map((node) => [node.node_id, node.lag, node.lag_note])).toEqual([
      ["p1", undefined, undefined],
      ["r1", 0, undefined],
      ["r2", 10_000, undefined],
    ]);
    expect(plain(renderShardStatus(status))).toMatch(/^r2 +replica .* 61,648, 0\.4 s ago +10,000 /m);
  });

  it.each([
    [
      "after a kill -9 failover: the old primary is failed, one primary row",
      aHealthyShard()
        .withTopology({ epoch: 4, primary_node_id: "r1", primary_address: "r1.local:6379" })
        .withNode({ node_id: "p1", db_status: "down", ageMs: 1_700, agent_updated: (NOW - 100) * 1000 })
        .withNode({ node_id: "r1", role: "primary", primary_node_id: undefined, primary_link: undefined }),
      "r1",
      /^p1 +failed \(last seen as primary 1\.7 s ago\) /m,
    ],
    [
      "during the failover: the old primary failed, the target promoting, no primary row",
      aHealthyShard()
        .failingOver("confirm", "r1")
        .withNode({ node_id: "p1", db_status: "down", ageMs: 1_700, agent_updated: (NOW - 100) * 1000 })
        .withNode({ node_id: "r1", role: "primary", primary_node_id: undefined, primary_link: undefined }),
      undefined,
      /^r1 +promoting \(answers as primary; the failover is not complete\) /m,
    ],
    [
      "the old primary back and answering as primary before its agent fenced it",
      aHealthyShard()
        .withTopology({ epoch: 4, primary_node_id: "r1", primary_address: "r1.local:6379" })
        .withNode({ node_id: "r1", role: "primary", primary_node_id: undefined, primary_link: undefined }),
      "r1",
      /^p1 +unconfirmed \(answers as primary; the topology names r1 \(its agent fences it\)\) /m,
    ],
  ] as const)("never two primary rows: %s", (_name, builder, primary, row) => {
    // Act
    const status = statusOf(builder);
    // Assess
    expect(status.nodes.filter((node) => node.role === "primary").map((node) => node.node_id)).toEqual(
      primary === undefined ? [] : [primary],
    );
    expect(plain(renderShardStatus(status))).toMatch(row);
  });
});

describe("shard status: the controller's line (decide())", () => {
  it.each([
    ["a healthy shard", aHealthyShard(), undefined, /^controller: nothing to do: /],
    [
      "a stale primary and a quiet replica the reader asked to report",
      aShardWithStalePrimary().withNode({ node_id: "r2", ageMs: 19_000, keepalive_ms: 20_000 }),
      { r2: NOW - 400 },
      /^controller: awaiting reports from r2 \(quiet, heard 19 s ago, REPORT sent 0\.4 s ago\)$/,
    ],
    [
      "a stale primary and a quiet replica nobody asked yet",
      aShardWithStalePrimary().withNode({ node_id: "r2", ageMs: 19_000, keepalive_ms: 20_000 }),
      undefined,
      /^controller: awaiting reports from r2 \(quiet, heard 19 s ago\)$/,
    ],
    [
      "a stale primary with fresh replicas",
      aShardWithStalePrimary(),
      undefined,
      /^controller: next: failover: /,
    ],
    [
      "a paused shard",
      aHealthyShard().paused("kernel upgrade"),
      undefined,
      /^controller: waiting \(paused\): /,
    ],
  ] as const)("%s", (_name, builder, asked, line) => {
    // Act
    const status = statusOf(builder, asked);
    const text = plain(renderShardStatus(status, { controllerLine: true }));
    // Assess
    expect(status.controller.line).toMatch(line);
    expect(text.split("\n").at(-1)?.trim()).toBe(status.controller.line);
    expect(plain(renderShardStatus(status))).not.toContain("controller:");
  });
});

describe("shard status: the assumptions of guarantee 1 that are broken now (issue 30)", () => {
  it.each([
    { name: "a healthy shard breaks none", builder: aHealthyShard().guardedBy(["r1", "r2"]), expected: [] },
    {
      name: "a member whose agent is silent past its report window may hold acknowledged writes",
      builder: aHealthyShard().guardedBy(["r1", "r2"]).withNode({ node_id: "r1", ageMs: 300_000 }),
      expected: [
        /^member r1 last heard 5 min ago: it may hold acknowledged writes; no failover promotes past it/,
      ],
    },
    {
      name: "a member with no heartbeat at all",
      builder: aHealthyShard().guardedBy(["r1", "r2", "r3"]),
      expected: [/^member r3 has no heartbeat: it may hold acknowledged writes/],
    },
    {
      name: "a replica the primary lists that no agent names",
      builder: aHealthyShard().withNode({ node_id: "p1", outsiders: ["10.0.0.9:6379", "r1.local:6379"] }),
      expected: [/^replica 10\.0\.0\.9:6379 acknowledges writes and no agent names it/],
    },
    {
      name: "a node outside the replica set, silent, breaks nothing",
      builder: aHealthyShard().guardedBy(["r2"]).withNode({ node_id: "r1", ageMs: 300_000 }),
      expected: [],
    },
  ])("$name", ({ builder, expected }) => {
    // Act
    const status = statusOf(builder);

    // Assess
    expect(status.assumptions).toHaveLength(expected.length);
    expected.forEach((pattern, index) => {
      expect(status.assumptions[index]).toMatch(pattern);
    });
  });

  it("prints each broken assumption under the table", () => {
    // Act
    const text = plain(
      renderShardStatus(
        statusOf(aHealthyShard().guardedBy(["r1", "r2"]).withNode({ node_id: "r1", ageMs: 300_000 })),
      ),
    );

    // Assess
    expect(text).toMatch(/\n {2}assumption broken: member r1 last heard 5 min ago: /);
  });
});

describe("shard status: the old primaries not known fenced (nemesis seeds 6303, 6811)", () => {
  it("lists the old primaries the node brought online fences first, in the headline", () => {
    // Prepare
    const builder = aShardWithStalePrimary()
      .offline()
      .withTopology({ deposed: [{ node_id: "p1", address: "p1.local:6379" }] });
    // Act
    const status = statusOf(builder);
    const text = plain(renderShardStatus(status));
    // Assess
    expect(status.deposed).toEqual([{ node_id: "p1", address: "p1.local:6379" }]);
    expect(text).toMatch(
      /old primaries not known fenced \(the next promotion fences them\): p1 \(p1\.local:6379\)/,
    );
  });

  it("lists an online shard's, which its next promotion fences first", () => {
    // Prepare
    const builder = aHealthyShard().withTopology({
      deposed: [{ node_id: "p0", address: "p0.local:6379", epoch: 3 }],
    });
    // Act
    const status = statusOf(builder);
    const text = plain(renderShardStatus(status));
    // Assess
    expect(status.status).toBe("online");
    expect(text).toMatch(
      /old primaries not known fenced \(the next promotion fences them\): p0 \(p0\.local:6379\)/,
    );
  });

  it("lists none for an online shard that keeps none", () => {
    expect(statusOf(aHealthyShard()).deposed).toEqual([]);
  });
});
