import { describe, expect, it } from "vitest";
import { AgentContext, type AgentDeps } from "../../src/agent/context.ts";
import type { Database } from "../../src/agent/database.ts";
import { judgeAgainstOwnReport, readInfo, rejudgeRestart } from "../../src/agent/db-identity.ts";
import { parseAgentOptions } from "../../src/agent/options.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import type { Topology } from "../../src/core/model.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { memoryState, RecordingLogger } from "../support/agent-harness.ts";
import { aHeartbeat } from "../support/builders.ts";

/**
 * Simulator seed 420283 (`--faults all --overlap`, 5 min, 25 w/s; guarantee 1, 2,281
 * replica-acknowledged writes lost): n2, the topology's primary, holding every write with n3 (a
 * member of its replica set, parked when n2's database died),
 * - restarted from an RDB behind them: fenced as restarted without its data;
 * - restarted empty: fenced again;
 * - restarted from the RDB the empty process had saved: Redis 7 gives a master loaded from its RDB
 *   a new id and keeps the RDB's as `master_replid2`, here the empty process's id at offset 0.
 * Judged against the process before it (the empty one), the last one "continued its lineage": held
 * until the peers reported since, then opened; n3 left the set (not attached), the write guard
 * fell to 0 and the shard served a primary holding none of the acknowledged writes to the end.
 */

const A: ReplicationInfo = {
  role: "primary",
  offset: 109_344,
  replId: "A",
  prior: { replId: "P", offset: 94_512 },
  runId: "run-1",
  primary: undefined,
  replicas: [],
};
/** From an older RDB of A's node: a new id, P's lineage to 94,512 (behind A's 109,344). */
const OLD_RDB: ReplicationInfo = { ...A, replId: "B", offset: 94_512, runId: "run-2" };
/** Empty. */
const EMPTY: ReplicationInfo = { ...A, replId: "C", offset: 0, prior: undefined, runId: "run-3" };
/** From the RDB the empty process saved: a new id, the empty process's kept as its replid2 at 0. */
const EMPTY_RDB: ReplicationInfo = {
  ...A,
  replId: "D",
  offset: 0,
  prior: { replId: "C", offset: 0 },
  runId: "run-4",
};
/** From an RDB as new as A's data (a healthy restart: it continues A). */
const FULL_RDB: ReplicationInfo = {
  ...A,
  replId: "E",
  offset: 109_344,
  prior: { replId: "A", offset: 109_344 },
  runId: "run-5",
};

/** n2's agent, its topology naming n2 primary with n3 in its replica set (n3 parked on A). */
function n2Agent() {
  let now = 1_800_000_000_000;
  let answer = A;
  const db = { replicationInfo: async () => answer } as Partial<Database> as Database;
  const logger = new RecordingLogger();
  const ctx = new AgentContext({
    options: parseAgentOptions({ shard: "s1", redis: "127.0.0.1:6379", address: "n2:6379" }),
    nodeId: "n2",
    deps: { clock: { now: () => now } } as Partial<AgentDeps> as AgentDeps,
    db,
    state: memoryState({ highest_epoch: 1 }),
    logger,
  });
  ctx.lastTopology = {
    shard: "s1",
    epoch: 1,
    status: "online",
    primary_node_id: "n2",
    primary_address: "n2:6379",
    updated_at: 0,
  } as Partial<Topology> as Topology;
  ctx.guardMembers = ["n3"];
  ctx.othersHold = [{ replId: "A", offset: 109_488, answering: true }];
  return {
    ctx,
    logger,
    /** The database answers as `info` (a new process when its run id is new); one cycle's read. */
    async read(info: ReplicationInfo) {
      now += 1000;
      answer = info;
      await readInfo(ctx);
    },
    /** A snapshot read now, every member having written since: the pending restart is judged again. */
    peersReport() {
      now += 1000;
      ctx.othersRead = { from: now, writtenMs: new Map([["n3", now]]) };
      rejudgeRestart(ctx);
    },
  };
}

describe("a primary's database restarted again while fenced as restarted without its data (simulator seed 420283)", () => {
  it("stays fenced when the new process continues only the fenced process (the empty process's RDB)", async () => {
    // Arrange
    const agent = n2Agent();
    await agent.read(A);
    await agent.read(OLD_RDB);
    expect(agent.ctx.dbRestarted).toBe(true);
    await agent.read(EMPTY);
    expect(agent.ctx.dbRestarted).toBe(true);

    // Act
    await agent.read(EMPTY_RDB);
    agent.peersReport();

    // Assess
    expect(agent.ctx.dbRestarted).toBe(true);
    expect(agent.ctx.dbRecord.pendingRestart).toBeUndefined();
    expect(agent.logger.lines.map((line) => line.message)).not.toContain(
      "database restart judged on the other nodes' reports written since: it continues its lineage",
    );
  });

  it("still opens a healthy primary's restart that continues its lineage once the peers reported since", async () => {
    // Arrange
    const agent = n2Agent();
    agent.ctx.othersHold = [{ replId: "A", offset: 109_344, answering: true }];
    await agent.read(A);

    // Act
    await agent.read(FULL_RDB);
    const held = agent.ctx.dbRestarted;
    agent.peersReport();

    // Assess
    expect(held).toBe(true);
    expect(agent.ctx.dbRestarted).toBe(false);
  });

  it("judges a restart after the node followed a primary as any other (the fence ended with the follow)", async () => {
    // Arrange
    const agent = n2Agent();
    await agent.read(A);
    await agent.read(EMPTY);
    expect(agent.ctx.dbRestarted).toBe(true);
    await agent.read({
      ...EMPTY,
      role: "replica",
      replId: "A",
      offset: 109_488,
      prior: undefined,
      primary: { host: "n3", port: 6379, link: "up", lastIoSecondsAgo: 0, syncInProgress: false },
    });
    expect(agent.ctx.dbRestarted).toBe(false);

    // Act: restarted from an RDB of what it synced, as the named primary again
    await agent.read({
      ...FULL_RDB,
      offset: 109_488,
      prior: { replId: "A", offset: 109_488 },
      runId: "run-6",
    });
    agent.peersReport();

    // Assess
    expect(agent.ctx.dbRestarted).toBe(false);
  });
});

/**
 * Nemesis seed 7335, incident A (guarantee 5, then 1; 167 acknowledged writes lost): node-3's agent,
 * started 0.1 s before, had read no snapshot of the shard (the store slowed by a fault) when its
 * database came back from an RDB behind what two parked replicas held, on a new replication id. It
 * judged the restart "harmless: no other node holds its data" — from knowing of no node at all —
 * stored the new process as the node's identity, and opened it. Now that verdict, like "it
 * continues", waits for a snapshot read after the restart (\`rejudgeRestart\`).
 */
describe("a primary's database restarted before its agent read the shard (nemesis seed 7335)", () => {
  /** n2's agent as above, but with no snapshot read yet: no members, no reports. */
  function unread() {
    const agent = n2Agent();
    agent.ctx.guardMembers = [];
    agent.ctx.othersHold = [];
    return agent;
  }
  /** From an older RDB of A's node, on a new id that continues nothing (its RDB carried none). */
  const FORK: ReplicationInfo = { ...A, replId: "F", offset: 0, prior: undefined, runId: "run-7" };

  it("holds the new process fenced until a snapshot read after the restart, then fences it when a node holds its data", async () => {
    // Arrange
    const agent = unread();
    await agent.read(A);

    // Act
    await agent.read(FORK);
    const held = { fenced: agent.ctx.dbRestarted, pending: agent.ctx.dbRecord.pendingRestart !== undefined };
    agent.ctx.guardMembers = ["n3"];
    agent.ctx.othersHold = [{ replId: "A", offset: 109_488, answering: true }];
    agent.peersReport();

    // Assess
    expect(held).toEqual({ fenced: true, pending: true });
    expect(agent.ctx.dbRestarted).toBe(true);
    expect(agent.ctx.dbRecord.pendingRestart).toBeUndefined();
    expect(
      agent.logger.find("database restarted without its data: fenced until it follows the shard's primary"),
    ).toBeDefined();
  });

  it("opens it once a snapshot read after the restart shows no other node holding its data", async () => {
    // Arrange
    const agent = unread();
    await agent.read(A);

    // Act
    await agent.read(FORK);
    const held = agent.ctx.dbRestarted;
    agent.peersReport();

    // Assess
    expect(held).toBe(true);
    expect(agent.ctx.dbRestarted).toBe(false);
  });
});

/**
 * Nemesis seed 7336 (guarantees 5 then 1, ~236 acknowledged writes lost): node-169a's agent,
 * restarted with a wiped state dir while its primary kept serving, judged the live process against
 * the node's own stored report (same replication id, 21 KB ahead of it) and fenced it as "restarted
 * without its data": a peer's report, written after the agent's INFO read, was further on that id.
 * The controller promoted another node at the report's offset and both replicas resynced from it.
 */
describe("an agent restarted without its state judging the live primary against its node's report (nemesis seed 7336)", () => {
  /** n2's agent with no state: its first read is A; its node's stored report is A's lineage, behind. */
  async function stateless(reportedOffset: number) {
    const agent = n2Agent();
    await agent.read(A);
    const snapshot = {
      shard: "s1",
      nodes: [
        aHeartbeat({ node_id: "n2", role: "primary", repl_id: "A", last_txn_id: reportedOffset, epoch: 1 }),
      ],
      replicaSets: { n2: ["n3"] },
      replicaSetVersions: { n2: 1 },
      topology: agent.ctx.lastTopology,
      lock: undefined,
      malformed: [],
    } as Partial<ShardSnapshot> as ShardSnapshot;
    return { agent, snapshot };
  }

  it("keeps serving a primary on its report's id and ahead of it, though a replica reported further on that id since its read", async () => {
    // Arrange: n3 reported A at 109,488, past the 109,344 n2's database answered a moment before.
    const { agent, snapshot } = await stateless(100_000);

    // Act
    judgeAgainstOwnReport(agent.ctx, snapshot);

    // Assess
    expect(agent.ctx.dbRestarted).toBe(false);
    expect(agent.logger.find("database does not continue this node's last report")).toBeUndefined();
  });

  it("still fences a primary on its report's id behind the report", async () => {
    // Arrange: the report says A at 110,000; the process answers A at 109,344.
    const { agent, snapshot } = await stateless(110_000);

    // Act
    judgeAgainstOwnReport(agent.ctx, snapshot);

    // Assess
    expect(agent.ctx.dbRestarted).toBe(true);
  });
});
