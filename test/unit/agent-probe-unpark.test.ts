import { describe, expect, it, vi } from "vitest";
import type { Database, DatabaseLink } from "../../src/agent/database.ts";
import { parseAgentOptions } from "../../src/agent/options.ts";
import { PARKED_HOST, PARKED_PORT, PrimaryProbe, type ProbeContext } from "../../src/agent/primary-probe.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import { Mutex } from "../../src/agent/scheduling.ts";
import type { LineageLink } from "../../src/core/identity.ts";
import type { Topology } from "../../src/core/model.ts";
import { memoryState, RecordingLogger } from "../support/agent-harness.ts";

/**
 * A parked replica whose primary answers on the lineage the shard's history records as taking over
 * from the replica's (simulator seeds 281090, 280962, 281137): n1, the deposed primary, woke from a
 * hang with writes past the offset its successor n2 was promoted at (lineage L to 33,888, n2's L to
 * 33,600), stepped down to n2, and a partition parked it before its first sync. At the heal its
 * probe found n2 "restarted" (not the process it linked to, not holding its tail), and the
 * topology's epoch was the one it parked at: it stayed parked to the end of the run.
 */

const LINKS: LineageLink[] = [{ repl_id: "L", until: 33_600, by: "M" }];

/** n1's own INFO: parked, on the old primary's lineage past the promotion point. */
const PARKED: ReplicationInfo = {
  role: "replica",
  offset: 33_888,
  replId: "L",
  runId: "run-n1",
  primary: {
    host: PARKED_HOST,
    port: PARKED_PORT,
    link: "down",
    lastIoSecondsAgo: undefined,
    syncInProgress: false,
  },
  replicas: [],
};

/** n2 as its probe reads it: promoted at 33,600 of L, serving M since. */
const PROMOTED: ReplicationInfo = {
  role: "primary",
  offset: 56_736,
  replId: "M",
  prior: { replId: "L", offset: 33_600 },
  runId: "run-n2",
  primary: undefined,
  replicas: [],
};

function fakeLink(answer: ReplicationInfo): DatabaseLink {
  return {
    ready: true,
    connect: async () => {},
    replicationInfo: async () => answer,
    configGet: async () => "0",
    configSet: async () => {},
    setName: async () => {},
    on: () => {},
    off: () => {},
    disconnect: () => {},
  };
}

/**
 * A link whose \`close\` listeners \`closeNow\` runs: the process that answered dies while the
 * probe still holds its answer.
 */
function closingLink(answer: ReplicationInfo, closes: number) {
  const onClose: (() => void)[] = [];
  let left = closes;
  const link: DatabaseLink = {
    ...fakeLink(answer),
    configGet: async () => {
      if (left-- > 0) for (const listener of onClose) listener();
      return "0";
    },
    on: (event: string, listener: () => void) => {
      if (event === "close") onClose.push(listener);
    },
  } as DatabaseLink;
  return link;
}

/** \`watching\`: the address the probe tracks (null: a park this agent does not know yet). */
function probeOf(
  primary: ReplicationInfo,
  links: LineageLink[],
  topology: Partial<Topology> = { epoch: 1, ancestry: links },
  watching: string | null = "n2:6379",
  link: DatabaseLink = fakeLink(primary),
) {
  const logger = new RecordingLogger();
  const replicaOf = vi.fn(async (_host: string, _port: number) => {});
  const db = {
    dial: () => link,
    replicationInfo: async () => PARKED,
    replicaOf,
  } as Partial<Database> as Database;
  const ctx: ProbeContext = {
    options: parseAgentOptions({ shard: "s1", redis: "127.0.0.1:6379" }),
    nodeId: "n1",
    db,
    logger,
    roleLock: new Mutex(),
    roleGeneration: 0,
    lastInfo: PARKED,
    lastInfoGeneration: 0,
    heartbeatsWritten: 0,
    lastTopology: topology as Topology,
    highestEpoch: 1,
    epochContext: {},
    wakeHeartbeat: () => {},
    monotonicNow: () => 0,
    // The state dir's in-memory part: what the park persists (\`parked\`).
    state: memoryState(),
  };
  const probe = new PrimaryProbe(ctx, 500);
  if (watching !== null) probe.track(watching);
  return { probe, replicaOf, state: ctx.state, logger };
}

describe("a parked replica whose primary took over from its lineage by a recorded promotion", () => {
  it("follows it: its tail past the promotion is the branch the shard left (simulator seed 281090)", async () => {
    // Arrange
    const { probe, replicaOf } = probeOf(PROMOTED, LINKS);

    // Act
    const result = await probe.probe(PARKED);

    // Assess
    expect(result).toBe("ok");
    expect(replicaOf).toHaveBeenCalledWith("n2", 6379);
    expect(probe.lacksMyData).toBe(false);
  });

  it.each([
    { name: "without the recorded link", primary: PROMOTED, links: [] },
    {
      name: "a process restarted from an older RDB of that lineage (a new id, the links name none)",
      primary: {
        ...PROMOTED,
        replId: "R",
        offset: 40_000,
        prior: { replId: "M", offset: 40_000 },
        runId: "run-r",
      },
      links: LINKS,
    },
    {
      name: "a process restarted empty",
      primary: { ...PROMOTED, replId: "E", offset: 0, prior: undefined, runId: "run-e" },
      links: LINKS,
    },
    {
      name: "a process on the replica's own lineage, behind it (an RDB of L restarted as L's primary)",
      primary: {
        ...PROMOTED,
        replId: "N",
        offset: 33_000,
        prior: { replId: "L", offset: 33_000 },
        runId: "run-n",
      },
      links: LINKS,
    },
  ])("stays parked: $name", async ({ primary, links }) => {
    // Arrange
    const { probe, replicaOf } = probeOf(primary, links);

    // Act
    const result = await probe.probe(PARKED);

    // Assess
    expect(result).toBe("restarted");
    expect(replicaOf).not.toHaveBeenCalled();
    expect(probe.lacksMyData).toBe(true);
  });
});

/**
 * Simulator seed 250903: n2 parked from n1 when n1's database died; the failover to n2 reached its
 * PROMOTE phase, but the PROMOTE itself was late (a frozen controller). n1's database came back
 * from its RDB under a new replication id, holding n2's data as its \`master_replid2\`; n2's probe
 * unparked it to follow n1, n2 and n3 (behind n2) took n1's new id, which the shard's history does
 * not record, and after n2's PROMOTE no node held the lineage the offline shard waited for.
 * Here this node (n1) is the target and n2:6379 the deposed primary it was parked from.
 */
describe("a parked replica whose old primary comes back continuing its lineage", () => {
  /** n2 restarted from its RDB: a new id, n1's lineage kept to where n1 stands. */
  const RESTARTED_FROM_RDB: ReplicationInfo = {
    ...PROMOTED,
    replId: "R",
    offset: 33_888,
    prior: { replId: "L", offset: 33_888 },
    runId: "run-r",
  };
  const topologyAt = (topology: Partial<Topology>): Partial<Topology> => ({
    shard: "s1",
    epoch: 1,
    updated_at: 0,
    primary_node_id: "n2",
    primary_address: "n2:6379",
    ...topology,
  });

  it("stays parked while the topology names another primary: itself, the target past its PROMOTE phase (simulator seed 250903)", async () => {
    // Arrange
    const topology = topologyAt({
      status: "failing_over",
      phase: "promote",
      failover: {
        kind: "failover",
        old_primary_node_id: "n2",
        new_primary_node_id: "n1",
        new_primary_address: "n1:6379",
        reason: "test",
        started_at: 0,
        candidates: [],
        phase_started: {},
      },
    });
    const { probe, replicaOf } = probeOf(RESTARTED_FROM_RDB, [], topology);

    // Act
    const result = await probe.probe(PARKED);

    // Assess
    expect(result).toBe("ok");
    expect(replicaOf).not.toHaveBeenCalled();
    expect(probe.lacksMyData).toBe(false);
  });

  it.each([
    { name: "the topology names that primary", topology: topologyAt({ status: "online" }) },
    {
      name: "the failover away from it has not reached PROMOTE",
      topology: topologyAt({
        status: "failing_over",
        phase: "epoch_bumped",
        failover: {
          kind: "failover",
          old_primary_node_id: "n2",
          new_primary_node_id: "n1",
          new_primary_address: "n1:6379",
          reason: "test",
          started_at: 0,
          candidates: [],
          phase_started: {},
        },
      }),
    },
    { name: "the shard is offline", topology: { shard: "s1", epoch: 2, updated_at: 0, status: "offline" } },
  ] as Array<{ name: string; topology: Partial<Topology> }>)(
    "follows it when $name",
    async ({ topology }) => {
      // Arrange
      const { probe, replicaOf } = probeOf(RESTARTED_FROM_RDB, [], topology);

      // Act
      const result = await probe.probe(PARKED);

      // Assess
      expect(result).toBe("ok");
      expect(replicaOf).toHaveBeenCalledWith("n2", 6379);
    },
  );
});

/**
 * Simulator seed 343143: n2, restarted empty, full-synced from n1, itself restarted from its RDB
 * under a new replication id D that continues the shard's lineage L up to 157,488 (n1's
 * \`master_replid2\`). A full sync clears the replica's own earlier lineage: n2 stood on D with
 * none. Parked later from n3 (promoted on lineage A, which took over from L at 170,256 by a
 * recorded promotion), it found n3 neither continuing its data nor superseding it, although n3
 * holds all of it, and stayed parked to the end ("slave of none, link down").
 */
describe("a parked replica that full-synced from a primary continuing an earlier lineage", () => {
  const LINKED_ON_D: ReplicationInfo = {
    role: "replica",
    offset: 157_488,
    replId: "D",
    runId: "run-n2",
    primary: { host: "n1", port: 6379, link: "up", lastIoSecondsAgo: 0, syncInProgress: false },
    replicas: [],
  };
  const PARKED_ON_D: ReplicationInfo = {
    ...LINKED_ON_D,
    primary: {
      host: PARKED_HOST,
      port: PARKED_PORT,
      link: "down",
      lastIoSecondsAgo: undefined,
      syncInProgress: false,
    },
  };
  const N1: ReplicationInfo = {
    role: "primary",
    offset: 157_488,
    replId: "D",
    prior: { replId: "L", offset: 157_488 },
    runId: "run-n1",
    primary: undefined,
    replicas: [],
  };
  const N3: ReplicationInfo = {
    role: "primary",
    offset: 260_000,
    replId: "N3",
    prior: { replId: "A", offset: 252_000 },
    runId: "run-n3",
    primary: undefined,
    replicas: [],
  };
  const ancestry: LineageLink[] = [{ repl_id: "L", until: 170_256, by: "A" }];

  function setup() {
    const replicaOf = vi.fn(async (_host: string, _port: number) => {});
    const db = {
      dial: (address: string) => fakeLink(address === "n1:6379" ? N1 : N3),
      replicationInfo: async () => PARKED_ON_D,
      replicaOf,
    } as Partial<Database> as Database;
    const topology = {
      shard: "s1",
      epoch: 3,
      updated_at: 0,
      status: "online",
      primary_node_id: "n3",
      primary_address: "n3:6379",
      ancestry,
    } as Partial<Topology> as Topology;
    const ctx: ProbeContext = {
      options: parseAgentOptions({ shard: "s1", redis: "127.0.0.1:6379" }),
      nodeId: "n2",
      db,
      logger: new RecordingLogger(),
      roleLock: new Mutex(),
      roleGeneration: 0,
      lastInfo: PARKED_ON_D,
      lastInfoGeneration: 0,
      heartbeatsWritten: 0,
      lastTopology: topology,
      highestEpoch: 3,
      epochContext: {},
      wakeHeartbeat: () => {},
      monotonicNow: () => 0,
      state: memoryState(),
    };
    return { probe: new PrimaryProbe(ctx, 500), replicaOf };
  }

  it.each([
    {
      name: "remembered from n1's report while linked on D: it follows n3",
      learnt: true,
      result: "ok",
      follows: true,
    },
    {
      name: "never linked on D (nothing remembered): it stays parked",
      learnt: false,
      result: "restarted",
      follows: false,
    },
  ])("$name", async ({ learnt, result, follows }) => {
    // Arrange
    const { probe, replicaOf } = setup();
    if (learnt) {
      probe.track("n1:6379");
      await probe.probe(LINKED_ON_D);
    }
    probe.track("n3:6379");

    // Act
    const probed = await probe.probe(PARKED_ON_D);

    // Assess
    expect(probed).toBe(result);
    if (follows) expect(replicaOf).toHaveBeenCalledWith("n3", 6379);
    else expect(replicaOf).not.toHaveBeenCalled();
    expect(probe.withPrior(PARKED_ON_D).prior).toEqual(learnt ? { replId: "L", offset: 157_488 } : undefined);
  });

  it("forgets the remembered earlier lineage once its database left that replication id", async () => {
    // Arrange
    const { probe } = setup();
    probe.track("n1:6379");
    await probe.probe(LINKED_ON_D);
    // Its database restarted empty (a new id), still pointed at n1.
    const resynced: ReplicationInfo = { ...LINKED_ON_D, replId: "E", offset: 0, runId: "run-n2b" };

    // Act
    await probe.probe(resynced);

    // Assess
    expect(probe.withPrior(resynced).prior).toBeUndefined();
    expect(probe.withPrior(LINKED_ON_D).prior).toBeUndefined();
  });
});

/**
 * Simulator seed 420081: n3, parked from n2 by a silence, lost its agent's state; the new agent
 * found its database parked from a primary it did not know, and waited for a newer epoch than the
 * online topology's, for ever while n2, the topology's primary, was healthy and ahead on n3's
 * lineage (guarantee 3). Now such a park is taken as one from the topology's primary: the probe
 * watches it and follows it once it is known to hold the replica's data, never before.
 */
describe("a parked replica whose agent does not know where it was parked from", () => {
  const online = (topology: Partial<Topology> = {}): Partial<Topology> => ({
    shard: "s1",
    epoch: 3,
    updated_at: 0,
    status: "online",
    primary_node_id: "n2",
    primary_address: "n2:6379",
    ...topology,
  });
  /** n2 ahead on n1's lineage L. */
  const AHEAD: ReplicationInfo = { ...PROMOTED, replId: "L", offset: 40_000, prior: undefined };

  const unknownPark = (primary: ReplicationInfo, topology: Partial<Topology>) =>
    probeOf(primary, [], topology, null);

  it("follows the online topology's primary once the probe finds it holding the replica's data (simulator seed 420081)", async () => {
    // Arrange
    const { probe, replicaOf, state } = unknownPark(AHEAD, online());

    // Act
    probe.resumeParkedWatch();
    const result = await probe.probe(PARKED);

    // Assess
    expect(probe.parkedAtEpoch).toBe(3);
    expect(state.state.parked).toBeUndefined();
    expect(result).toBe("ok");
    expect(replicaOf).toHaveBeenCalledWith("n2", 6379);
  });

  it("stays parked, and says the primary lacks its data, when that primary does not hold it", async () => {
    // Arrange: n2 restarted empty under a new id.
    const empty: ReplicationInfo = { ...PROMOTED, replId: "E", offset: 0, prior: undefined, runId: "run-e" };
    const { probe, replicaOf, state } = unknownPark(empty, online());

    // Act
    probe.resumeParkedWatch();
    const result = await probe.probe(PARKED);

    // Assess
    expect(result).toBe("restarted");
    expect(replicaOf).not.toHaveBeenCalled();
    expect(probe.lacksMyData).toBe(true);
    expect(probe.parkedFrom).toBe("n2:6379");
    expect(state.state.parked).toEqual({ from: "n2:6379", at_epoch: 3 });
  });

  it.each([
    {
      name: "a failover is under way",
      topology: online({ status: "failing_over", phase: "epoch_bumped" }),
    },
    { name: "the shard is offline", topology: { shard: "s1", epoch: 3, updated_at: 0, status: "offline" } },
    {
      name: "the topology names this node",
      topology: online({ primary_node_id: "n1", primary_address: "n1:6379" }),
    },
  ] as Array<{ name: string; topology: Partial<Topology> }>)("watches nothing when $name", ({ topology }) => {
    // Arrange
    const { probe } = unknownPark(AHEAD, topology);

    // Act
    probe.resumeParkedWatch();

    // Assess
    expect(probe.address).toBeUndefined();
    expect(probe.parkedFrom).toBeUndefined();
  });
});

/**
 * The process that answered the probe dies before the agent points the parked replica at it: its
 * connection's close came while the replica was still parked (the park on close had nothing to
 * do), and a process restarted empty at that address would full-sync the replica's data away
 * (seen with real processes and \`repl-diskless-sync-delay 0\`; guarantee 1).
 */
describe("a parked replica whose primary's connection closes after the answer it would follow", () => {
  /** \`closes\`: how many of the probes see the connection close right after their INFO. */
  function probeClosing(closes: number) {
    return probeOf(PROMOTED, LINKS, undefined, "n2:6379", closingLink(PROMOTED, closes));
  }

  it.each([
    { name: "closed after the answer: stays parked, and says why", closes: 1, follows: false },
    { name: "no close: follows", closes: 0, follows: true },
  ])("$name", async ({ closes, follows }) => {
    // Arrange
    const { probe, replicaOf, logger } = probeClosing(closes);

    // Act
    await probe.probe(PARKED);

    // Assess
    expect(replicaOf.mock.calls.length > 0).toBe(follows);
    expect(logger.find(/^replica stays parked: its primary's connection closed/) !== undefined).toBe(
      !follows,
    );
  });

  it("follows on the next answer, asked after the close, when that process continues its lineage too", async () => {
    // Arrange
    const { probe, replicaOf } = probeClosing(1);
    await probe.probe(PARKED);
    expect(replicaOf).not.toHaveBeenCalled();

    // Act
    await probe.probe(PARKED);

    // Assess
    expect(replicaOf).toHaveBeenCalledWith("n2", 6379);
  });
});
