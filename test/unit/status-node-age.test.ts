import { describe, expect, it } from "vitest";
import type { Topology } from "../../src/core/model.ts";
import { comparableLag, describeAge, reportState, topologyRole } from "../../src/core/node-age.ts";
import { aConfig, aHealthyShard, aHeartbeat, NOW } from "../support/builders.ts";

/**
 * What a report says now (src/core/node-age.ts): the clock predicates are decide()'s; these rows
 * pin what the views make of them. Failure timeout 3 s.
 */
const CONFIG = aConfig({ failureTimeoutMs: 3000 });
const µs = (ageMs: number) => (NOW - ageMs) * 1000;

describe("comparableLag: a lag only between reports that compare", () => {
  const primary = aHeartbeat({ node_id: "p1", role: "primary", last_txn_id: 51_842, ageMs: 900 });
  it.each([
    [
      "an in-sync replica read after the primary: the difference",
      aHeartbeat({ node_id: "r1", last_txn_id: 51_842, ageMs: 100 }),
      { known: true, bytes: 0 },
    ],
    [
      "a lagging replica read after the primary",
      aHeartbeat({ node_id: "r1", last_txn_id: 41_842, ageMs: 100 }),
      { known: true, bytes: 10_000 },
    ],
    [
      "a replica read in the same millisecond as the primary",
      aHeartbeat({ node_id: "r1", last_txn_id: 51_000, ageMs: 900 }),
      { known: true, bytes: 842 },
    ],
    [
      "a replica ahead of the primary's older report: no negative lag",
      aHeartbeat({ node_id: "r1", last_txn_id: 52_000, ageMs: 100 }),
      { known: true, bytes: 0 },
    ],
    [
      "a replica read 1.1 s before the primary (the issue's 2.9 s heartbeat): unknown, not 50 KB",
      aHeartbeat({ node_id: "r1", last_txn_id: 1_190, ageMs: 2_000 }),
      { known: false, code: "read_before_primary" },
    ],
    [
      "a quiet replica (19 s old, within its keepalive): unknown",
      aHeartbeat({ node_id: "r1", last_txn_id: 1_190, ageMs: 19_000, keepalive_ms: 20_000 }),
      { known: false, code: "not_recent" },
    ],
    [
      "a replica of another lineage",
      aHeartbeat({ node_id: "r1", repl_id: "lineage-b", ageMs: 100 }),
      { known: false, code: "other_lineage" },
    ],
    [
      "a replica whose database is down",
      aHeartbeat({ node_id: "r1", db_status: "down", ageMs: 100 }),
      { known: false, code: "not_recent" },
    ],
  ] as const)("%s", (_name, replica, expected) => {
    // Act
    const lag = comparableLag(primary, replica, CONFIG, NOW);
    // Assess
    expect(lag).toMatchObject(expected);
  });

  it.each([
    ["no primary report", undefined, "no_primary"],
    [
      "a primary whose database stopped answering",
      aHeartbeat({ node_id: "p1", role: "primary", ageMs: 5_000 }),
      "primary_not_recent",
    ],
    [
      "a primary whose agent reports its database down",
      aHeartbeat({ node_id: "p1", role: "primary", db_status: "down", ageMs: 100 }),
      "primary_not_recent",
    ],
  ] as const)("unknown against %s", (_name, reference, code) => {
    expect(comparableLag(reference, aHeartbeat({ node_id: "r1", ageMs: 50 }), CONFIG, NOW)).toMatchObject({
      known: false,
      code,
    });
  });
});

describe("reportState", () => {
  it.each([
    ["a replica heard 1 s ago", { role: "replica", ageMs: 1_000 }, "heard"],
    [
      "a replica silent 19 s within a 20 s keepalive",
      { role: "replica", ageMs: 19_000, keepalive_ms: 20_000 },
      "quiet",
    ],
    [
      "a replica silent past keepalive + failure timeout",
      { role: "replica", ageMs: 24_000, keepalive_ms: 20_000 },
      "stale",
    ],
    [
      "a primary silent 4 s (judged by the failure timeout alone)",
      { role: "primary", ageMs: 4_000, keepalive_ms: 2_000 },
      "stale",
    ],
    ["a report dated 60 s ahead of the reader", { role: "replica", ageMs: -60_000 }, "stale"],
  ] as const)("%s: %s", (_name, fields, expected) => {
    expect(reportState(aHeartbeat({ node_id: "n1", ...fields }), CONFIG, NOW)).toBe(expected);
  });
});

describe("topologyRole: the role the topology gives a node", () => {
  const topologyOf = (builder: ReturnType<typeof aHealthyShard>): Topology => {
    const topology = builder.build().topology;
    if (topology === undefined) throw new Error("the builder has a topology");
    return topology;
  };
  const online = topologyOf(aHealthyShard());
  const failingOver = topologyOf(aHealthyShard().failingOver("confirm", "r1"));
  const offline = topologyOf(aHealthyShard().offline());
  const movedToR1 = topologyOf(
    aHealthyShard().withTopology({ epoch: 4, primary_node_id: "r1", primary_address: "r1.local:6379" }),
  );
  it.each([
    [
      "the named primary, answering as primary",
      online,
      { node_id: "p1", role: "primary" },
      "primary",
      undefined,
    ],
    [
      "the old primary after a kill: its agent reports the database down",
      movedToR1,
      { node_id: "p1", role: "primary", db_status: "down", ageMs: 1_700, agent_updated: µs(100) },
      "failed",
      "last seen as primary 1.7 s ago",
    ],
    [
      "the named primary whose database died before the failover",
      online,
      { node_id: "p1", role: "primary", db_status: "down", ageMs: 1_700, agent_updated: µs(100) },
      "failed",
      "last seen as primary 1.7 s ago",
    ],
    [
      "a primary whose agent fell silent",
      online,
      { node_id: "p1", role: "primary", ageMs: 10_000 },
      "unknown",
      "agent silent; last seen as primary 10 s ago",
    ],
    [
      "an old primary back and still answering as primary",
      movedToR1,
      { node_id: "p1", role: "primary" },
      "unconfirmed",
      "answers as primary; the topology names r1 (its agent fences it)",
    ],
    [
      "the named primary answering as a replica",
      online,
      { node_id: "p1", role: "replica" },
      "unconfirmed",
      "the topology names it primary; it answers as replica",
    ],
    [
      "a failover's target answering as primary before the failover completes",
      failingOver,
      { node_id: "r1", role: "primary" },
      "promoting",
      "answers as primary; the failover is not complete",
    ],
    [
      "a node answering as primary while the shard is offline",
      offline,
      { node_id: "r2", role: "primary" },
      "unconfirmed",
      "answers as primary; the shard is offline",
    ],
    ["a quiet replica", online, { node_id: "r1", ageMs: 19_000, keepalive_ms: 20_000 }, "replica", undefined],
    [
      "a replica silent past its keepalive",
      online,
      { node_id: "r1", ageMs: 30_000, keepalive_ms: 20_000 },
      "unknown",
      "agent silent; last seen as replica 30 s ago",
    ],
  ] as const)("%s: %s", (_name, topology, fields, role, note) => {
    // Act
    const reading = topologyRole(aHeartbeat(fields), topology, CONFIG, NOW);
    // Assess
    expect(reading).toEqual({ role, note });
  });
});

describe("describeAge", () => {
  it.each([
    [200, "0.2 s ago"],
    [9_949, "9.9 s ago"],
    [19_000, "19 s ago"],
    [180_000, "3 min ago"],
    [-1_200, "1.2 s ahead"],
  ])("%d ms: %s", (ms, text) => {
    expect(describeAge(ms)).toBe(text);
  });
});
