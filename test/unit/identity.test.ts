import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  type DatabaseIdentity,
  holdsAllOf,
  judgeRestart,
  type ReplicationPoint,
  type RestartContext,
} from "../../src/core/identity.ts";

const before: DatabaseIdentity = {
  runId: "run-a",
  replId: "lineage-1",
  offset: 5000,
  role: "primary",
  synced: 2,
};
const emptyRestart: DatabaseIdentity = {
  runId: "run-b",
  replId: "lineage-2",
  offset: 0,
  role: "primary",
  synced: 0,
};
const shard: RestartContext = { named: true, guardMembers: ["r1", "r2"] };

describe("database identity: judging a restarted database", () => {
  it.each([
    ["the first read", undefined, emptyRestart, shard, "same"],
    ["the same process", before, { ...before, offset: 6000 }, shard, "same"],
    [
      "a restart that continues the lineage (an RDB as new as the data)",
      before,
      { ...before, runId: "run-b" },
      shard,
      "harmless",
    ],
    ["an empty restart of the shard's primary with a replica set", before, emptyRestart, shard, "lost-data"],
    [
      "a restart from an older snapshot (same lineage, offset behind)",
      before,
      { ...before, runId: "run-b", offset: 4000 },
      shard,
      "lost-data",
    ],
    [
      "an empty restart that came back as a replica",
      before,
      { ...emptyRestart, role: "replica" },
      shard,
      "harmless",
    ],
    [
      "an empty restart of a replica not named by the topology",
      { ...before, role: "replica" },
      emptyRestart,
      { ...shard, named: false },
      "harmless",
    ],
    [
      "an empty restart of the named primary that was demoted meanwhile",
      { ...before, role: "replica" },
      emptyRestart,
      shard,
      "lost-data",
    ],
    [
      "a single-node shard: no replica holds the data",
      { ...before, synced: 0 },
      emptyRestart,
      { ...shard, guardMembers: [] },
      "harmless",
    ],
    [
      "a new shard whose replicas synced before the set was stored",
      before,
      emptyRestart,
      { ...shard, guardMembers: [] },
      "lost-data",
    ],
    [
      "a replica that left the set while hung is still attached and holds the data",
      { ...before, synced: 1 },
      emptyRestart,
      { ...shard, guardMembers: [] },
      "lost-data",
    ],
  ] as const)("%s", (_name, previous, current, context, expected) => {
    expect(judgeRestart(previous, current, context).kind).toBe(expected);
  });

  it("never fences a database whose new process continues the old lineage", () => {
    const identity = fc.record({
      runId: fc.constantFrom("a", "b"),
      replId: fc.constantFrom("x", "y"),
      offset: fc.nat(10_000),
      role: fc.constantFrom("primary" as const, "replica" as const),
      synced: fc.nat(3),
    });
    const context = fc.record({
      named: fc.boolean(),
      guardMembers: fc.subarray(["r1", "r2"]),
    });
    fc.assert(
      fc.property(identity, identity, context, (previous, current, ctx) => {
        const verdict = judgeRestart(previous, current, ctx);
        if (current.replId === previous.replId && current.offset >= previous.offset) {
          expect(verdict.kind).not.toBe("lost-data");
        }
        if (verdict.kind === "lost-data") expect(current.role).toBe("primary");
      }),
    );
  });
});

describe("replication points: does one database hold every write of another", () => {
  const onA = (offset: number): ReplicationPoint => ({ replId: "a", offset });
  /** A database that continues lineage `a` up to `upTo` under a new id (restarted from its RDB, or promoted). */
  const continuingA = (upTo: number, offset = upTo, replId = "b"): ReplicationPoint => ({
    replId,
    offset,
    prior: { replId: "a", offset: upTo },
  });
  it.each([
    { name: "same lineage, as far", holder: onA(100), data: onA(100), holds: true },
    { name: "same lineage, further", holder: onA(120), data: onA(100), holds: true },
    { name: "same lineage, behind", holder: onA(90), data: onA(100), holds: false },
    { name: "another lineage", holder: { replId: "z", offset: 900 }, data: onA(100), holds: false },
    {
      name: "holder continues the data's lineage far enough",
      holder: continuingA(100, 400),
      data: onA(100),
      holds: true,
    },
    {
      name: "holder's earlier lineage ends before the data's",
      holder: continuingA(80, 400),
      data: onA(100),
      holds: false,
    },
    {
      name: "data restarted from an RDB the holder's lineage covers",
      holder: onA(150),
      data: continuingA(100),
      holds: true,
    },
    {
      name: "data took writes under its new id since",
      holder: onA(150),
      data: continuingA(100, 130),
      holds: false,
    },
    {
      name: "both continue the same earlier lineage, holder further",
      holder: continuingA(120, 500, "c"),
      data: continuingA(100),
      holds: true,
    },
    {
      name: "both continue the same earlier lineage, holder behind",
      holder: continuingA(90, 500, "c"),
      data: continuingA(100),
      holds: false,
    },
    {
      name: "an empty database (offset 0, no earlier lineage) is held by any other",
      holder: { replId: "z", offset: 900 },
      data: { replId: "fresh", offset: 0 },
      holds: true,
    },
    {
      name: "an empty database holds nothing of one with data",
      holder: { replId: "fresh", offset: 0 },
      data: onA(100),
      holds: false,
    },
    {
      name: "an unknown lineage holds nothing",
      holder: { replId: "", offset: 5 },
      data: { replId: "", offset: 0 },
      holds: false,
    },
  ])("$name: $holds", ({ holder, data, holds }) => {
    expect(holdsAllOf(holder, data)).toBe(holds);
  });

  it("holds is transitive along one lineage and reflexive (property)", () => {
    const point = fc.record({ replId: fc.constantFrom("a", "b"), offset: fc.nat(1000) });
    fc.assert(
      fc.property(point, point, point, (x, y, z) => {
        expect(holdsAllOf(x, x)).toBe(true);
        if (holdsAllOf(x, y) && holdsAllOf(y, z)) expect(holdsAllOf(x, z)).toBe(true);
      }),
    );
  });
});
