import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  appendLink,
  bridgingLink,
  type DatabaseIdentity,
  heldThroughLinks,
  holdsAllOf,
  holdsSomeOf,
  holdsThroughLinks,
  judgeFollow,
  judgeRestart,
  MAX_LINEAGE_LINKS,
  parkOutgrown,
  peerPointOf,
  type RememberedPrior,
  type ReplicationPoint,
  type RestartContext,
  recordedLineages,
  rememberPrior,
  reportedLink,
  supersededBy,
  syncWouldDestroy,
  withRememberedPrior,
} from "../../src/core/identity.ts";
import { aHeartbeat } from "../support/builders.ts";

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
const shard: RestartContext = { named: true, guardMembers: ["r1", "r2"], others: [] };
/** Sim seed 7011: n1, promoted (a new lineage continuing the old primary's), no replica set yet. */
const promoted: DatabaseIdentity = {
  runId: "run-a",
  replId: "lineage-2",
  offset: 5010,
  role: "primary",
  synced: 0,
  prior: { replId: "lineage-1", offset: 5000 },
};
const alone: RestartContext = { named: true, guardMembers: [], others: [] };
/** A primary with no replica attached at its last read. */
const alone0: DatabaseIdentity = { ...before, synced: 0 };
/** Sim seeds 7002-7013: a Redis 7 master restarted from its RDB takes a new replid, the RDB's as replid2. */
const fromRdb = (upTo: number, offset = upTo + 120): DatabaseIdentity => ({
  runId: "run-b",
  replId: "lineage-3",
  offset,
  role: "primary",
  synced: 0,
  prior: { replId: "lineage-1", offset: upTo },
});

/**
 * Sim seed 420283: a primary restarted from the RDB its empty process saved (Redis 7 keeps the
 * RDB's id as `master_replid2`, here the empty process's, at offset 0).
 */
const fromEmptyRdb: DatabaseIdentity = {
  runId: "run-c",
  replId: "lineage-4",
  offset: 0,
  role: "primary",
  synced: 0,
  prior: { replId: "lineage-2", offset: 0 },
};

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
    [
      "a restart from its RDB as new as the data (Redis 7: a new replid, the old one as replid2)",
      before,
      fromRdb(5000),
      shard,
      "harmless",
    ],
    [
      "a restart from its RDB holding more than the last read",
      before,
      fromRdb(5200, 5200),
      shard,
      "harmless",
    ],
    [
      "a restart from an older RDB (replid2 the old lineage, behind)",
      before,
      fromRdb(4000),
      shard,
      "lost-data",
    ],
    [
      "a deposed primary (not named) restarted from its RDB: fenced as before, it steps down either way",
      before,
      fromRdb(5000),
      { ...shard, named: false },
      "lost-data",
    ],
    [
      "a restart from its RDB while the replicas hold as much of the lineage, or less",
      before,
      fromRdb(5100),
      {
        ...shard,
        others: [
          { replId: "lineage-1", offset: 5100, answering: true },
          { replId: "lineage-1", offset: 4800, answering: true },
        ],
      },
      "harmless",
    ],
    [
      "a primary on the id of its node's last report, ahead of it, with a replica reported further on (its report written after the INFO read): one master lifetime, it continues (nemesis seed 7336)",
      before,
      { ...before, runId: "run-b", offset: 5200 },
      { ...shard, others: [{ replId: "lineage-1", offset: 5210, answering: true }] },
      "harmless",
    ],
    [
      "the same with a node on the lineage the primary was promoted from, past the promotion (it took writes after it)",
      promoted,
      { ...promoted, runId: "run-b", offset: 5300 },
      { ...shard, others: [{ replId: "lineage-1", offset: 5040, answering: true }] },
      "harmless",
    ],
    [
      "a primary back on the same id behind its node's last report is no continuation",
      before,
      { ...before, runId: "run-b", offset: 4990 },
      { ...shard, others: [{ replId: "lineage-1", offset: 5210, answering: true }] },
      "lost-data",
    ],
    [
      "a restart from an RDB newer than the last read while a replica reported more since (seed 8049)",
      before,
      fromRdb(5100),
      { ...shard, others: [{ replId: "lineage-1", offset: 5148, answering: true }] },
      "lost-data",
    ],
    [
      "a restart on the same replid while a node that continued the lineage under a new id holds more",
      { ...before, role: "replica" },
      { ...before, runId: "run-b" },
      {
        ...shard,
        others: [
          {
            replId: "lineage-7",
            offset: 5300,
            prior: { replId: "lineage-1", offset: 5200 },
            answering: true,
          },
        ],
      },
      "lost-data",
    ],
    [
      "a promoted primary restarted from its RDB while a node is on the lineage it was promoted from (seed 9034)",
      promoted,
      { ...fromRdb(5010), prior: { replId: "lineage-2", offset: 5010 } },
      { ...alone, others: [{ replId: "lineage-1", offset: 4990, answering: true }] },
      "lost-data",
    ],
    [
      "a promoted primary restarted from its RDB while the old primary is down on the lineage it was promoted from (seed 7013)",
      promoted,
      { ...fromRdb(5010), prior: { replId: "lineage-2", offset: 5010 } },
      { ...alone, others: [{ replId: "lineage-1", offset: 4990, answering: false }] },
      "harmless",
    ],
    [
      "a promoted primary restarted from its RDB while a node down holds more of the lineage it was promoted from",
      promoted,
      { ...fromRdb(5010), prior: { replId: "lineage-2", offset: 5010 } },
      { ...alone, others: [{ replId: "lineage-1", offset: 5004, answering: false }] },
      "lost-data",
    ],
    [
      "a promoted primary restarted from its RDB while its replicas hold its own lineage, or less",
      promoted,
      { ...fromRdb(5010), prior: { replId: "lineage-2", offset: 5010 } },
      {
        ...alone,
        others: [
          {
            replId: "lineage-2",
            offset: 5010,
            prior: { replId: "lineage-1", offset: 5000 },
            answering: true,
          },
        ],
      },
      "harmless",
    ],
    [
      "a restart from an RDB of another lineage",
      before,
      { ...fromRdb(5000), prior: { replId: "lineage-9", offset: 5000 } },
      shard,
      "lost-data",
    ],
    [
      "a promoted primary restarted from an RDB of before its promotion, holding all it was promoted with",
      { ...promoted, offset: 5000 },
      fromRdb(5000),
      alone,
      "harmless",
    ],
    [
      "an empty restart while a parked non-member holds the lineage it was promoted with (seed 7011)",
      promoted,
      emptyRestart,
      { ...alone, others: [{ replId: "lineage-1", offset: 4990, answering: true }] },
      "lost-data",
    ],
    [
      "an empty restart while a stale non-member is on its own lineage",
      alone0,
      emptyRestart,
      { ...alone, others: [{ replId: "lineage-1", offset: 10, answering: true }] },
      "lost-data",
    ],
    [
      "an empty restart while another node continues its lineage under a new replid",
      alone0,
      emptyRestart,
      {
        ...alone,
        others: [
          { replId: "lineage-7", offset: 90, prior: { replId: "lineage-1", offset: 40 }, answering: true },
        ],
      },
      "lost-data",
    ],
    [
      "an empty restart while the other nodes hold other lineages, or nothing of its own",
      alone0,
      emptyRestart,
      {
        ...alone,
        others: [
          { replId: "lineage-9", offset: 9000, answering: true },
          { replId: "lineage-1", offset: 0, answering: true },
          { replId: "", offset: 0, answering: false },
        ],
      },
      "harmless",
    ],
    [
      "an empty restart of a promoted primary whose old lineage nobody else holds",
      promoted,
      emptyRestart,
      { ...alone, others: [{ replId: "lineage-9", offset: 9000, answering: true }] },
      "harmless",
    ],
    [
      "a restart from the RDB an empty process saved, that process not fenced (an empty shard's primary)",
      emptyRestart,
      fromEmptyRdb,
      shard,
      "harmless",
    ],
    [
      "a restart from the RDB an empty process fenced as restarted without its data saved (seed 420283)",
      emptyRestart,
      fromEmptyRdb,
      { ...shard, fenced: true },
      "lost-data",
    ],
    [
      "a restart of a fenced process from its own RDB as new as it (an old RDB's process restarted again)",
      { ...fromRdb(4000), runId: "run-b" },
      { ...fromRdb(4000), runId: "run-c", replId: "lineage-4", prior: { replId: "lineage-3", offset: 4120 } },
      { ...shard, fenced: true },
      "lost-data",
    ],
    [
      "a fenced process restarted again that came back as a replica",
      emptyRestart,
      { ...fromEmptyRdb, role: "replica" },
      { ...shard, fenced: true },
      "harmless",
    ],
  ] as const)("%s", (_name, previous, current, context, expected) => {
    expect(judgeRestart(previous, current, context).kind).toBe(expected);
  });

  it("never fences a database whose new process continues the old lineage and holds what the others report of it", () => {
    const replId = fc.constantFrom("x", "y", "z");
    const prior = fc.option(fc.record({ replId, offset: fc.nat(10_000) }), { nil: undefined });
    const identity = fc.record({
      runId: fc.constantFrom("a", "b"),
      replId,
      offset: fc.nat(10_000),
      role: fc.constantFrom("primary" as const, "replica" as const),
      synced: fc.nat(3),
      prior,
    });
    const context = fc.record({
      named: fc.boolean(),
      guardMembers: fc.subarray(["r1", "r2"]),
      others: fc.array(fc.record({ replId, offset: fc.nat(10_000), prior, answering: fc.boolean() }), {
        maxLength: 3,
      }),
    });
    fc.assert(
      fc.property(identity, identity, context, (previous, current, ctx) => {
        const verdict = judgeRestart(previous, current, ctx);
        const continues =
          (current.replId === previous.replId && current.offset >= previous.offset) ||
          (ctx.named && current.prior?.replId === previous.replId && current.prior.offset >= previous.offset);
        const nobodyHasMore = ctx.others.every(
          (other) =>
            !holdsSomeOf(other, previous) ||
            holdsAllOf(current, other) ||
            (!other.answering && holdsAllOf(previous, other)),
        );
        // A primary on the id its last read was a primary on, at least as far: one master lifetime (seed 7336).
        const sameLifetime =
          previous.role === "primary" &&
          current.role === "primary" &&
          current.replId === previous.replId &&
          current.offset >= previous.offset;
        if (continues && (nobodyHasMore || sameLifetime)) expect(verdict.kind).not.toBe("lost-data");
        if (!nobodyHasMore && !sameLifetime)
          expect(verdict.kind === "harmless" && verdict.continues).toBe(false);
        if (verdict.kind === "lost-data") expect(current.role).toBe("primary");
        // Harmless without continuing only when nobody else may hold the data (a replica's restart aside).
        if (verdict.kind === "harmless" && !verdict.continues && current.role === "primary") {
          const heldElsewhere =
            ctx.guardMembers.length > 0 ||
            previous.synced > 0 ||
            ctx.others.some((other) => holdsSomeOf(other, previous));
          expect(heldElsewhere && (previous.role === "primary" || ctx.named)).toBe(false);
        }
      }),
      { numRuns: 2000 },
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

describe("replication points: may one database hold some write of another", () => {
  const data: ReplicationPoint = { replId: "b", offset: 500, prior: { replId: "a", offset: 400 } };
  it.each([
    { name: "on the data's lineage", other: { replId: "b", offset: 450 }, some: true },
    { name: "on the lineage the data continues", other: { replId: "a", offset: 10 }, some: true },
    {
      name: "continuing the data's lineage under a new id",
      other: { replId: "c", offset: 900, prior: { replId: "b", offset: 420 } },
      some: true,
    },
    {
      name: "continuing the data's earlier lineage under a new id",
      other: { replId: "c", offset: 900, prior: { replId: "a", offset: 300 } },
      some: true,
    },
    { name: "at the start of its lineage (offset 0)", other: { replId: "a", offset: 0 }, some: false },
    { name: "on another lineage", other: { replId: "z", offset: 900 }, some: false },
    {
      name: "continuing another lineage",
      other: { replId: "c", offset: 900, prior: { replId: "z", offset: 800 } },
      some: false,
    },
    { name: "an unknown lineage", other: { replId: "", offset: 900 }, some: false },
  ])("$name: $some", ({ other, some }) => {
    expect(holdsSomeOf(other, data)).toBe(some);
  });

  it("holding all of a database's writes is holding some of them, when it has any", () => {
    const point = fc.record({
      replId: fc.constantFrom("a", "b"),
      offset: fc.integer({ min: 1, max: 1000 }),
      prior: fc.option(fc.record({ replId: fc.constantFrom("a", "c"), offset: fc.nat(1000) }), {
        nil: undefined,
      }),
    });
    fc.assert(
      fc.property(point, point, (holder, held) => {
        if (holdsAllOf(holder, held)) expect(holdsSomeOf(holder, held)).toBe(true);
      }),
    );
  });
});

describe("what a stored heartbeat says its node holds", () => {
  const crash = { state: "restarted" as const, run_id: "run-1", first_seen: 1, last_seen: 2 };
  it.each([
    {
      name: "a replica: its lineage and offset",
      heartbeat: aHeartbeat({ node_id: "r1", repl_id: "a", last_txn_id: 700 }),
      point: { replId: "a", offset: 700, prior: undefined, answering: true },
    },
    {
      name: "a promoted node: with the lineage it continues",
      heartbeat: aHeartbeat({
        node_id: "r1",
        repl_id: "b",
        last_txn_id: 720,
        prior_lineage: { repl_id: "a", last_txn_id: 700 },
      }),
      point: { replId: "b", offset: 720, prior: { replId: "a", offset: 700 }, answering: true },
    },
    {
      name: "a database down, not known restarted: the dead process's data may be on its disk",
      heartbeat: aHeartbeat({ node_id: "p1", repl_id: "a", last_txn_id: 700, db_status: "down" }),
      point: { replId: "a", offset: 700, prior: undefined, answering: false },
    },
    {
      name: "a primary fenced after a restart from its RDB: only what its new process holds",
      heartbeat: aHeartbeat({
        node_id: "p1",
        repl_id: "a",
        last_txn_id: 700,
        db_status: "down",
        db_crash: crash,
        prior_lineage: { repl_id: "a", last_txn_id: 650 },
      }),
      point: { replId: "a", offset: 650, answering: false },
    },
    {
      name: "a primary fenced after an empty restart: nothing",
      heartbeat: aHeartbeat({
        node_id: "p1",
        repl_id: "a",
        last_txn_id: 700,
        db_status: "down",
        db_crash: crash,
      }),
      point: { replId: "", offset: 0, answering: false },
    },
  ])("$name", ({ heartbeat, point }) => {
    expect(peerPointOf(heartbeat)).toEqual(point);
  });
});

describe("holdsThroughLinks: the shard's recorded lineage history (simulator seed 52256)", () => {
  // L0 -> L1 at 600 (node A promoted), L1 -> L2 at 900 (node B promoted); B is the primary now.
  const links = [
    { repl_id: "L0", until: 600, by: "L1" },
    { repl_id: "L1", until: 900, by: "L2" },
  ];
  const primary = { replId: "L2", offset: 950, prior: { replId: "L1", offset: 900 } };

  it.each([
    {
      name: "a replica restarted from an RDB of L0 at 550 is held (two links back)",
      data: { replId: "L0", offset: 550 },
      held: true,
    },
    {
      name: "a master restarted from that RDB (a new id, L0 as its earlier one, nothing since) is held",
      data: { replId: "R9", offset: 550, prior: { replId: "L0", offset: 550 } },
      held: true,
    },
    {
      name: "writes on L0 past where L1 took over are not held (a primary that served on after the promotion)",
      data: { replId: "L0", offset: 650 },
      held: false,
    },
    {
      name: "a lineage no link names is not held",
      data: { replId: "L7", offset: 10 },
      held: false,
    },
    {
      name: "a master that took writes on its new id since the restart is not held",
      data: { replId: "R9", offset: 560, prior: { replId: "L0", offset: 550 } },
      held: false,
    },
  ])("$name", ({ data, held }) => {
    expect(holdsThroughLinks(primary, data, links)).toBe(held);
    // Without the history, Redis's one earlier lineage does not show it.
    if (held) expect(holdsAllOf(primary, data)).toBe(false);
  });

  it("needs the holder to hold each link's continuing lineage at least to where it took over", () => {
    const behind = { replId: "L2", offset: 880 };
    expect(holdsThroughLinks(behind, { replId: "L0", offset: 550 }, links)).toBe(false);
    const unrelated = { replId: "L5", offset: 2000, prior: { replId: "L4", offset: 1500 } };
    expect(holdsThroughLinks(unrelated, { replId: "L0", offset: 550 }, links)).toBe(false);
  });

  it("never finds more than holdsAllOf without links", () => {
    fc.assert(
      fc.property(
        fc.record({ replId: fc.constantFrom("A", "B", "C"), offset: fc.nat(1000) }),
        fc.record({ replId: fc.constantFrom("A", "B", "C"), offset: fc.nat(1000) }),
        (holder, data) => holdsThroughLinks(holder, data, []) === holdsAllOf(holder, data),
      ),
    );
  });
});

/** L0 -> L1 at 600 (A promoted), L1 -> L2 at 900 (B promoted): the main line. */
const MAIN_LINE = [
  { repl_id: "L0", until: 600, by: "L1" },
  { repl_id: "L1", until: 900, by: "L2" },
];

describe("syncWouldDestroy: a restarted replica's first full sync (simulator seed 7032)", () => {
  const links = MAIN_LINE;

  it.each([
    {
      name: "a source on an unrecorded lineage (a node restarted from an old RDB), the replica ahead on the main line",
      source: { replId: "X7", offset: 500, prior: { replId: "L0", offset: 500 } },
      replica: { replId: "L2", offset: 950 },
      destroys: true,
    },
    {
      name: "a source holding every write of the replica",
      source: { replId: "L2", offset: 1000, prior: { replId: "L1", offset: 900 } },
      replica: { replId: "L2", offset: 950 },
      destroys: false,
    },
    {
      name: "a source behind on the replica's own lineage (it would full-sync: offset past the source's)",
      source: { replId: "L2", offset: 920 },
      replica: { replId: "L2", offset: 950 },
      destroys: true,
    },
    {
      name: "a source that took over by a recorded promotion: the replica's tail past it is a branch the shard left",
      source: { replId: "L2", offset: 1000, prior: { replId: "L1", offset: 900 } },
      replica: { replId: "L1", offset: 950 },
      destroys: false,
    },
    {
      name: "two promotions later on the main line",
      source: { replId: "L2", offset: 1000 },
      replica: { replId: "L0", offset: 700 },
      destroys: false,
    },
    {
      name: "an empty replica has nothing to lose",
      source: { replId: "X7", offset: 10 },
      replica: { replId: "E1", offset: 0 },
      destroys: false,
    },
    {
      name: "a source on an earlier lineage than the replica's",
      source: { replId: "L1", offset: 950 },
      replica: { replId: "L2", offset: 950, prior: { replId: "L1", offset: 900 } },
      destroys: true,
    },
  ])("$name: $destroys", ({ source, replica, destroys }) => {
    expect(syncWouldDestroy(source, replica, links)).toBe(destroys);
  });

  it("never destroys what the source holds, and never more than a sync without the history would", () => {
    const point = fc.record({
      replId: fc.constantFrom("L0", "L1", "L2", "X7"),
      offset: fc.nat(1200),
    });
    fc.assert(
      fc.property(point, point, (source, replica) => {
        const destroys = syncWouldDestroy(source, replica, links);
        if (holdsAllOf(source, replica)) expect(destroys).toBe(false);
        if (destroys) expect(syncWouldDestroy(source, replica, [])).toBe(true);
      }),
    );
  });
});

describe("judgeFollow: a REPLICAOF the agent issues on a topology's or a command's decision (simulator seed 7039)", () => {
  const links = MAIN_LINE;
  /** The ids MAIN_LINE records, plus the lineage of a change or an offline mark where a row says so. */
  const onMainLine = new Set(["L0", "L1", "L2"]);

  it.each<{
    name: string;
    target: ReplicationPoint | undefined;
    mine: ReplicationPoint;
    recorded?: ReadonlySet<string>;
    verdict: "follow" | "unanswered" | "refuse";
  }>([
    {
      name: "seed 7039: a parked replica holding the shard's data, repointed to a primary restarted empty",
      target: { replId: "E9", offset: 0 },
      mine: { replId: "L2", offset: 950, prior: { replId: "L1", offset: 900 } },
      verdict: "refuse",
    },
    {
      name: "queued-replicaof-empty.test.ts: a parked replica on the old lineage, its queued REPLICAOF naming the promoted node restarted empty",
      target: { replId: "E9", offset: 0 },
      mine: { replId: "L1", offset: 880 },
      verdict: "refuse",
    },
    {
      name: "seed 7039: the woken old primary stepping down to that empty process, a replica already attached to it",
      target: { replId: "E9", offset: 14 },
      mine: { replId: "L2", offset: 1000 },
      verdict: "refuse",
    },
    {
      name: "a new primary after a failover continues the replica's lineage as its prior",
      target: { replId: "L3", offset: 1100, prior: { replId: "L2", offset: 1000 } },
      mine: { replId: "L2", offset: 980 },
      verdict: "follow",
    },
    {
      name: "the old primary ahead of its successor by an unacknowledged tail, the promotion recorded",
      target: { replId: "L2", offset: 1000, prior: { replId: "L1", offset: 900 } },
      mine: { replId: "L1", offset: 950 },
      verdict: "follow",
    },
    {
      name: "the same, the promotion not recorded yet (the repoint comes before the change completes)",
      target: { replId: "L3", offset: 1100, prior: { replId: "L2", offset: 1000 } },
      mine: { replId: "L2", offset: 1010 },
      verdict: "follow",
    },
    {
      name: "a replica behind on the target's own lineage",
      target: { replId: "L2", offset: 1000 },
      mine: { replId: "L2", offset: 700 },
      verdict: "follow",
    },
    {
      name: "the last resort: a node restarted from its RDB holding the lineage as its earlier one, behind the replica",
      target: { replId: "R5", offset: 800, prior: { replId: "L2", offset: 800 } },
      mine: { replId: "L2", offset: 950 },
      verdict: "follow",
    },
    {
      name: "the last resort on an earlier lineage of the main line, behind a replica on the latest one",
      target: { replId: "L0", offset: 650 },
      mine: { replId: "L2", offset: 1000 },
      verdict: "follow",
    },
    {
      name: "shardguard recover on another lineage: the shard's lineage set to the node's, the repoint under way",
      target: { replId: "X7", offset: 500 },
      mine: { replId: "L2", offset: 950 },
      recorded: new Set([...onMainLine, "X7"]),
      verdict: "follow",
    },
    {
      name: "shardguard recover on a parked replica of another lineage, promoted: its new id continues the recorded one",
      target: { replId: "X8", offset: 520, prior: { replId: "X7", offset: 500 } },
      mine: { replId: "L2", offset: 950 },
      recorded: new Set([...onMainLine, "X7"]),
      verdict: "follow",
    },
    {
      name: "the last resort on a replica of an earlier lineage of the main line, promoted, the change not completed yet",
      target: { replId: "P0", offset: 660, prior: { replId: "L0", offset: 650 } },
      mine: { replId: "L2", offset: 1000 },
      verdict: "follow",
    },
    {
      name: "the same target, no record naming its lineage (a process restarted empty that took some writes)",
      target: { replId: "X7", offset: 500 },
      mine: { replId: "L2", offset: 950 },
      verdict: "refuse",
    },
    {
      name: "hunt seed 7002: a branch the controller did not choose, both continuing one lineage",
      target: { replId: "R6", offset: 900, prior: { replId: "L1", offset: 900 } },
      mine: { replId: "B2", offset: 990, prior: { replId: "L1", offset: 900 } },
      verdict: "follow",
    },
    {
      name: "hunt seed 7001: a target past this database on a lineage the history does not join",
      target: { replId: "Y4", offset: 1240, prior: { replId: "Y3", offset: 1030 } },
      mine: { replId: "X7", offset: 880, prior: { replId: "X6", offset: 880 } },
      verdict: "follow",
    },
    {
      name: "a replica restarted empty follows anything",
      target: { replId: "E9", offset: 0 },
      mine: { replId: "E1", offset: 0 },
      verdict: "follow",
    },
    {
      name: "a target that did not answer, the replica holding data: parked from it",
      target: undefined,
      mine: { replId: "L2", offset: 950 },
      verdict: "unanswered",
    },
    {
      name: "a target that did not answer, the replica holding nothing: it has nothing to lose",
      target: undefined,
      mine: { replId: "E1", offset: 0 },
      verdict: "follow",
    },
  ])("$name: $verdict", ({ target, mine, recorded = onMainLine, verdict }) => {
    // Arrange: the shard's main line L0 -> L1 (600) -> L2 (900), MAIN_LINE

    // Act
    const judged = judgeFollow(target, mine, links, recorded);

    // Assess
    expect(judged.kind).toBe(verdict);
    if (judged.kind === "refuse") expect(judged.reason).toContain(mine.replId);
  });

  it("refuses only a target whose sync destroys data, sharing none, behind, on no recorded lineage; never an unread one", () => {
    const point = fc.record({
      replId: fc.constantFrom("L0", "L1", "L2", "X7", "E9"),
      offset: fc.nat(1200),
    });
    fc.assert(
      fc.property(point, point, fc.subarray(["L0", "L1", "L2", "X7", "E9"]), (target, mine, ids) => {
        // Arrange
        const recorded = new Set(ids);

        // Act
        const judged = judgeFollow(target, mine, links, recorded);

        // Assess
        if (judged.kind === "refuse") {
          expect(syncWouldDestroy(target, mine, links)).toBe(true);
          expect(holdsSomeOf(target, mine)).toBe(false);
          expect(target.offset).toBeLessThan(mine.offset);
          expect(recorded.has(target.replId)).toBe(false);
        }
        expect(judged.kind).not.toBe("unanswered");
        if (holdsAllOf(target, mine)) expect(judged.kind).toBe("follow");
        expect(judgeFollow(undefined, mine, links, recorded).kind).toBe(
          mine.offset > 0 ? "unanswered" : "follow",
        );
      }),
    );
  });
});

describe("recordedLineages: the replication ids the shard's record names", () => {
  it("names both ends of every ancestry link, the offline lineage and a change's lineage and target link", () => {
    // Arrange
    const topology = {
      shard: "s1",
      epoch: 7,
      status: "failing_over" as const,
      updated_at: 0,
      ancestry: [...MAIN_LINE],
      lineage: { repl_id: "OFF", last_txn_id: 10 },
      failover: {
        kind: "bring_online" as const,
        new_primary_node_id: "n2",
        new_primary_address: "n2:6379",
        reason: "test",
        started_at: 0,
        candidates: [],
        phase_started: {},
        lineage: { repl_id: "CHG", last_txn_id: 10 },
        target_link: { repl_id: "TL0", until: 5, by: "TL1" },
      },
    };

    // Act
    const ids = recordedLineages(topology);

    // Assess
    expect([...ids].sort()).toEqual(["CHG", "L0", "L1", "L2", "OFF", "TL0", "TL1"]);
    expect(recordedLineages(undefined).size).toBe(0);
  });
});

describe("supersededBy: a parked replica's primary took over from its lineage (simulator seed 281090)", () => {
  const links = MAIN_LINE;

  it.each([
    {
      name: "the successor's lineage, the replica's tail past the promotion",
      source: { replId: "L2", offset: 1000, prior: { replId: "L1", offset: 900 } },
      replica: { replId: "L1", offset: 950 },
      superseded: true,
    },
    {
      name: "two promotions later on the main line",
      source: { replId: "L2", offset: 1000 },
      replica: { replId: "L0", offset: 700 },
      superseded: true,
    },
    {
      name: "the replica's earlier lineage, while it took nothing since",
      source: { replId: "L2", offset: 1000 },
      replica: { replId: "R1", offset: 950, prior: { replId: "L1", offset: 950 } },
      superseded: true,
    },
    {
      name: "not the replica's earlier lineage once it took writes on its own",
      source: { replId: "L2", offset: 1000 },
      replica: { replId: "R1", offset: 960, prior: { replId: "L1", offset: 950 } },
      superseded: false,
    },
    {
      name: "a source restarted from an older RDB of the later lineage (a new id no link names)",
      source: { replId: "X7", offset: 920, prior: { replId: "L2", offset: 920 } },
      replica: { replId: "L1", offset: 950 },
      superseded: false,
    },
    {
      name: "a source restarted from an RDB of the replica's own lineage",
      source: { replId: "X7", offset: 800, prior: { replId: "L1", offset: 800 } },
      replica: { replId: "L1", offset: 950 },
      superseded: false,
    },
    {
      name: "the replica on the later lineage, its source's earlier one behind it (syncWouldDestroy's prior pairing)",
      source: { replId: "X7", offset: 920, prior: { replId: "L2", offset: 920 } },
      replica: { replId: "L2", offset: 950, prior: { replId: "L1", offset: 900 } },
      superseded: false,
    },
    {
      name: "a source on an earlier lineage than the replica's",
      source: { replId: "L1", offset: 950 },
      replica: { replId: "L2", offset: 950, prior: { replId: "L1", offset: 900 } },
      superseded: false,
    },
    {
      name: "the same lineage (holdsAllOf's question, not this one)",
      source: { replId: "L2", offset: 1000 },
      replica: { replId: "L2", offset: 950 },
      superseded: false,
    },
  ])("$name: $superseded", ({ source, replica, superseded }) => {
    expect(supersededBy(source, replica, links)).toBe(superseded);
  });

  it("never without links, and never where syncWouldDestroy finds a destroying sync from a later lineage", () => {
    const point = fc.record({
      replId: fc.constantFrom("L0", "L1", "L2", "X7"),
      offset: fc.nat(1200),
    });
    fc.assert(
      fc.property(point, point, (source, replica) => {
        expect(supersededBy(source, replica, [])).toBe(false);
        if (supersededBy(source, replica, links) && replica.offset > 0)
          expect(syncWouldDestroy(source, replica, links)).toBe(false);
      }),
    );
  });
});

describe("parkOutgrown: the primary a database was parked from holds its data or took over from it (simulator seed 310493)", () => {
  const links = MAIN_LINE;

  it.each([
    {
      name: "a restarted master's RDB 50 past the successor's recorded promotion (the seed: a deposed tail)",
      primary: { role: "primary", replId: "L2", offset: 1000, prior: { replId: "L1", offset: 900 } },
      mine: { replId: "R9", offset: 950, prior: { replId: "L1", offset: 950 } },
      outgrown: true,
    },
    {
      name: "the same primary, holding everything the database holds",
      primary: { role: "primary", replId: "L2", offset: 1000 },
      mine: { replId: "R9", offset: 980, prior: { replId: "L2", offset: 980 } },
      outgrown: true,
    },
    {
      name: "the same primary, behind the database on its own lineage (a primary restarted from an older RDB)",
      primary: { role: "primary", replId: "X7", offset: 940, prior: { replId: "L2", offset: 940 } },
      mine: { replId: "R9", offset: 980, prior: { replId: "L2", offset: 980 } },
      outgrown: false,
    },
    {
      name: "a replica holding all of it (it serves no sync while its own link is down)",
      primary: { role: "replica", replId: "L2", offset: 1000 },
      mine: { replId: "R9", offset: 980, prior: { replId: "L2", offset: 980 } },
      outgrown: false,
    },
    {
      name: "a database that took writes of its own after its restart",
      primary: { role: "primary", replId: "L2", offset: 1000, prior: { replId: "L1", offset: 900 } },
      mine: { replId: "R9", offset: 990, prior: { replId: "L1", offset: 950 } },
      outgrown: false,
    },
  ])("$name: $outgrown", ({ primary, mine, outgrown }) => {
    expect(parkOutgrown(primary, mine, links)).toBe(outgrown);
  });

  it("is the probe's unpark rule: holdsThroughLinks or supersededBy, from a primary only", () => {
    const point = fc.record({
      replId: fc.constantFrom("L0", "L1", "L2", "X7"),
      offset: fc.nat(1200),
    });
    fc.assert(
      fc.property(fc.constantFrom("primary", "replica"), point, point, (role, primary, mine) => {
        expect(parkOutgrown({ ...primary, role }, mine, links)).toBe(
          role === "primary" &&
            (holdsThroughLinks(primary, mine, links) || supersededBy(primary, mine, links)),
        );
      }),
    );
  });
});

describe("heldThroughLinks: how far a node on another lineage holds the one a failover judges by (nemesis seed 5805)", () => {
  // L0 -> L1 at 600, then L1 -> L2 at 900 (the main line); L0 -> X1 at 500 earlier, a promotion that did not last.
  const links = [
    { repl_id: "L0", until: 500, by: "X1" },
    { repl_id: "L0", until: 600, by: "L1" },
    { repl_id: "L1", until: 900, by: "L2" },
  ];

  it.each([
    {
      name: "a node on a later lineage holds all of the judged one up to the link, and its own offset counts",
      point: { replId: "L2", offset: 1330 },
      lineage: { replId: "L0", offset: 590 },
      ancestors: false,
      held: 1330,
    },
    {
      name: "one link on: the offset runs on across the promotion",
      point: { replId: "L1", offset: 700 },
      lineage: { replId: "L0", offset: 600 },
      ancestors: false,
      held: 700,
    },
    {
      name: "the judged lineage took writes past the link: the later one holds it only to the link",
      point: { replId: "L1", offset: 800 },
      lineage: { replId: "L0", offset: 650 },
      ancestors: false,
      held: 600,
    },
    {
      name: "a branch that is not the main line (a promotion given up later) holds nothing of it",
      point: { replId: "X1", offset: 2000 },
      lineage: { replId: "L0", offset: 400 },
      ancestors: false,
      held: undefined,
    },
    {
      name: "an earlier lineage counts only when asked (the last resort), up to the least link on the way",
      point: { replId: "L0", offset: 550 },
      lineage: { replId: "L2", offset: 950 },
      ancestors: false,
      held: undefined,
    },
    {
      name: "an earlier lineage, asked: up to its own offset when below every link",
      point: { replId: "L0", offset: 550 },
      lineage: { replId: "L2", offset: 950 },
      ancestors: true,
      held: 550,
    },
    {
      name: "an earlier lineage, asked: writes past the link are not the judged lineage's",
      point: { replId: "L0", offset: 650 },
      lineage: { replId: "L2", offset: 950 },
      ancestors: true,
      held: 600,
    },
    {
      name: "a lineage no link names",
      point: { replId: "L7", offset: 5000 },
      lineage: { replId: "L0", offset: 100 },
      ancestors: true,
      held: undefined,
    },
    {
      name: "the judged lineage itself is not this function's to answer",
      point: { replId: "L0", offset: 100 },
      lineage: { replId: "L0", offset: 100 },
      ancestors: true,
      held: undefined,
    },
  ])("$name", ({ point, lineage, ancestors, held }) => {
    expect(heldThroughLinks(point, lineage, links, ancestors)).toBe(held);
  });

  it("finds nothing without links, and follows links only forward in time (a cycle of ids ends)", () => {
    fc.assert(
      fc.property(
        fc.constantFrom("A", "B", "C"),
        fc.constantFrom("A", "B", "C"),
        fc.nat(1000),
        fc.nat(1000),
        fc.boolean(),
        (from, to, offset, lineageOffset, ancestors) =>
          heldThroughLinks({ replId: from, offset }, { replId: to, offset: lineageOffset }, [], ancestors) ===
          undefined,
      ),
    );
    const cycle = [
      { repl_id: "A", until: 10, by: "B" },
      { repl_id: "B", until: 20, by: "A" },
    ];
    expect(
      heldThroughLinks({ replId: "C", offset: 5 }, { replId: "A", offset: 5 }, cycle, true),
    ).toBeUndefined();
    expect(heldThroughLinks({ replId: "B", offset: 30 }, { replId: "A", offset: 5 }, cycle)).toBe(30);
  });
});

describe("appendLink", () => {
  it("appends a new link once, keeps the most recent MAX_LINEAGE_LINKS, and ignores a link to itself", () => {
    const link = { repl_id: "L0", until: 600, by: "L1" };
    expect(appendLink([], link)).toEqual([link]);
    expect(appendLink([link], link)).toBeUndefined();
    expect(appendLink([], { repl_id: "L1", until: 5, by: "L1" })).toBeUndefined();
    const many = Array.from({ length: MAX_LINEAGE_LINKS }, (_, index) => ({
      repl_id: `L${index}`,
      until: index,
      by: `L${index + 1}`,
    }));
    const next = appendLink(many, { repl_id: "X", until: 99, by: "Y" });
    expect(next).toHaveLength(MAX_LINEAGE_LINKS);
    expect(next?.[0]?.repl_id).toBe("L1");
    expect(next?.at(-1)?.by).toBe("Y");
  });
});

describe("bridgingLink: a peer's report of the link from the plan's lineage to the one the promoted database continues (simulator seed 325407)", () => {
  const report = (
    node: string,
    repl_id: string,
    prior?: { repl_id: string; last_txn_id: number },
    up = true,
  ) =>
    aHeartbeat({
      node_id: node,
      repl_id,
      last_txn_id: 1000,
      db_status: up ? "up" : "down",
      ...(prior === undefined ? {} : { prior_lineage: prior }),
    });
  const earlier = { repl_id: "L", last_txn_id: 1000 };

  it.each([
    {
      name: "the earlier target's report as primary",
      reports: [report("r1", "R1", earlier)],
      want: { repl_id: "L", until: 1000, by: "R1" },
    },
    {
      name: "the highest offset shown (a replica that continued partially shows a lower one)",
      reports: [report("r3", "R1", { repl_id: "L", last_txn_id: 900 }), report("r1", "R1", earlier)],
      want: { repl_id: "L", until: 1000, by: "R1" },
    },
    {
      name: "no report shows it",
      reports: [report("r1", "R2", { repl_id: "R1", last_txn_id: 1000 })],
      want: undefined,
    },
    {
      name: "a database that does not answer",
      reports: [report("r1", "R1", earlier, false)],
      want: undefined,
    },
    {
      name: "a link from another lineage than the plan's",
      reports: [report("r1", "R1", { repl_id: "X", last_txn_id: 1000 })],
      want: undefined,
    },
    { name: "a report with no earlier lineage", reports: [report("r1", "R1")], want: undefined },
  ])("$name", ({ reports, want }) => {
    expect(bridgingLink(reports, "L", "R1")).toEqual(want);
  });

  it("bridges nothing when the promoted database continues the plan's lineage itself, or without a plan lineage", () => {
    const reports = [report("r1", "R1", earlier)];
    expect(bridgingLink(reports, "R1", "R1")).toBeUndefined();
    expect(bridgingLink(reports, undefined, "R1")).toBeUndefined();
  });

  it("is a link only a report shows (reportedLink): its id continues its prior_lineage", () => {
    expect(reportedLink(report("r1", "R1", earlier))).toEqual({ repl_id: "L", until: 1000, by: "R1" });
    expect(reportedLink(report("r1", "L", earlier))).toBeUndefined();
    expect(reportedLink(undefined)).toBeUndefined();
  });
});

/**
 * Simulator seeds 343143 and 7046: a replica that full-synced from a primary whose replication id
 * continues an earlier lineage (restarted from its RDB under a new id D, the shard's lineage L kept
 * as its \`master_replid2\` up to 157,488) takes D with no earlier lineage of its own (a full sync
 * clears it). Its data is L up to 157,488 all the same: remembered from its primary's report while
 * linked on D, it is judged by it while it stays on D.
 */
describe("rememberPrior / withRememberedPrior: the earlier lineage a full sync cleared (simulator seeds 343143, 7046)", () => {
  const primaryOnD: ReplicationPoint = {
    replId: "D",
    offset: 157_488,
    prior: { replId: "L", offset: 157_488 },
  };
  const replicaOnD: ReplicationPoint = { replId: "D", offset: 157_488 };
  const onD: RememberedPrior = { on: "D", prior: { replId: "L", offset: 157_488 } };

  it.each([
    {
      name: "linked on the primary's id: its earlier lineage",
      remembered: undefined,
      mine: replicaOnD,
      primary: primaryOnD,
      linked: true,
      expected: onD,
    },
    {
      name: "not linked (parked, link down): nothing learnt",
      remembered: undefined,
      mine: replicaOnD,
      primary: primaryOnD,
      linked: false,
      expected: undefined,
    },
    {
      name: "linked, but on another id than the primary's (a full sync not done yet)",
      remembered: undefined,
      mine: { replId: "A", offset: 200_000 },
      primary: primaryOnD,
      linked: true,
      expected: undefined,
    },
    {
      name: "a primary showing no earlier lineage: nothing to learn",
      remembered: undefined,
      mine: replicaOnD,
      primary: { replId: "D", offset: 160_000 },
      linked: true,
      expected: undefined,
    },
    {
      name: "kept while still on that id, whatever it follows now",
      remembered: onD,
      mine: { replId: "D", offset: 158_000 },
      primary: { replId: "N3", offset: 252_000, prior: { replId: "A", offset: 252_000 } },
      linked: false,
      expected: onD,
    },
    {
      name: "forgotten once on another id",
      remembered: onD,
      mine: { replId: "N3", offset: 252_000 },
      primary: { replId: "N3", offset: 252_000 },
      linked: true,
      expected: undefined,
    },
    {
      name: "forgotten by an empty replication id",
      remembered: onD,
      mine: { replId: "", offset: 0 },
      primary: primaryOnD,
      linked: true,
      expected: undefined,
    },
    {
      name: "a lower offset of the same earlier lineage (a partial continue) does not replace it",
      remembered: onD,
      mine: replicaOnD,
      primary: { replId: "D", offset: 160_000, prior: { replId: "L", offset: 150_000 } },
      linked: true,
      expected: onD,
    },
  ] as Array<{
    name: string;
    remembered: RememberedPrior | undefined;
    mine: ReplicationPoint;
    primary: ReplicationPoint;
    linked: boolean;
    expected: RememberedPrior | undefined;
  }>)("rememberPrior: $name", ({ remembered, mine, primary, linked, expected }) => {
    // Act
    const result = rememberPrior(remembered, mine, primary, linked);

    // Assess
    expect(result).toEqual(expected);
  });

  it.each([
    {
      name: "on the remembered id: the remembered earlier lineage",
      point: replicaOnD,
      expected: { replId: "L", offset: 157_488 },
    },
    {
      name: "past it on that id: still, to where the id started",
      point: { replId: "D", offset: 170_000 },
      expected: { replId: "L", offset: 157_488 },
    },
    {
      name: "no further than its own offset",
      point: { replId: "D", offset: 100 },
      expected: { replId: "L", offset: 100 },
    },
    { name: "on another id: none", point: { replId: "E", offset: 157_488 }, expected: undefined },
    {
      name: "Redis's own earlier lineage wins",
      point: { replId: "D", offset: 157_488, prior: { replId: "K", offset: 10 } },
      expected: { replId: "K", offset: 10 },
    },
  ] as Array<{ name: string; point: ReplicationPoint; expected: ReplicationPoint["prior"] }>)(
    "withRememberedPrior: $name",
    ({ point, expected }) => {
      // Act
      const result = withRememberedPrior(point, onD);

      // Assess
      expect(result.prior).toEqual(expected);
    },
  );

  // n3 promoted from lineage A (which took over from L at 170,256) holds every write of the replica
  // on D; the history knows nothing of D.
  const links = [{ repl_id: "L", until: 170_256, by: "A" }];
  const n3: ReplicationPoint = { replId: "N3", offset: 260_000, prior: { replId: "A", offset: 252_000 } };

  it.each([
    { name: "without the remembered earlier lineage (the code before)", remembered: undefined, holds: false },
    { name: "with it", remembered: onD, holds: true },
    {
      name: "with it, once the replica took writes on D past its start (they are on D alone)",
      remembered: onD,
      replica: { replId: "D", offset: 158_000 },
      holds: false,
    },
  ] as Array<{
    name: string;
    remembered: RememberedPrior | undefined;
    replica?: ReplicationPoint;
    holds: boolean;
  }>)("a later primary holds all of the parked replica's data: $name", ({ remembered, replica, holds }) => {
    // Arrange
    const data = withRememberedPrior(replica ?? replicaOnD, remembered);

    // Act
    const result = holdsThroughLinks(n3, data, links);

    // Assess
    expect(result).toBe(holds);
  });
});
