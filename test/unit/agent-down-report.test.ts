import { describe, expect, it } from "vitest";
import { AgentContext, type AgentDeps } from "../../src/agent/context.ts";
import type { Database } from "../../src/agent/database.ts";
import { readInfo } from "../../src/agent/db-identity.ts";
import { buildHeartbeat } from "../../src/agent/heartbeat-report.ts";
import { parseAgentOptions } from "../../src/agent/options.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import type { Topology } from "../../src/core/model.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { memoryState, RecordingLogger } from "../support/agent-harness.ts";
import { aHeartbeat } from "../support/builders.ts";

/**
 * Simulator seed 72080: n1, promoted (a new replication id P continuing the shard's lineage L up to
 * 68,448: Redis's \`master_replid2\` and \`second_repl_offset\` - 1), took writes alone, and its
 * database was killed and restarted empty before the failover completed. Its down report keeps the
 * dead process's \`repl_id\` and offset, and now also the link that lineage continues
 * (\`answered_prior_lineage\`): the controller records it in the shard's history when it takes the
 * shard offline on P, so a replica parked on L at 68,448 is seen to hold P up to there. The
 * report's \`prior_lineage\` stays what the process answering now holds (nothing, when empty).
 */

const PROMOTED: ReplicationInfo = {
  role: "primary",
  offset: 68_832,
  replId: "P",
  prior: { replId: "L", offset: 68_448 },
  runId: "run-1",
  primary: undefined,
  replicas: [],
};
const EMPTY: ReplicationInfo = { ...PROMOTED, replId: "E", offset: 0, prior: undefined, runId: "run-2" };
/** Restarted from an RDB of L older than the promotion: a new id, L kept as its earlier one. */
const OLD_RDB: ReplicationInfo = {
  ...PROMOTED,
  replId: "R",
  offset: 50_000,
  prior: { replId: "L", offset: 50_000 },
  runId: "run-3",
};

function n1Agent() {
  let now = 1_800_000_000_000;
  let answer = PROMOTED;
  const db = { replicationInfo: async () => answer } as Partial<Database> as Database;
  const ctx = new AgentContext({
    options: parseAgentOptions({ shard: "s1", redis: "127.0.0.1:6379", address: "n1:6379" }),
    nodeId: "n1",
    deps: { clock: { now: () => now } } as Partial<AgentDeps> as AgentDeps,
    db,
    state: memoryState({ highest_epoch: 2 }),
    logger: new RecordingLogger(),
  });
  ctx.lastTopology = {
    shard: "s1",
    epoch: 2,
    status: "failing_over",
    primary_node_id: "n2",
    primary_address: "n2:6379",
    updated_at: 0,
  } as Partial<Topology> as Topology;
  return {
    ctx,
    /** One cycle: the database answers as `info` (undefined: it does not answer), then the heartbeat. */
    async cycle(info: ReplicationInfo | undefined, snapshot?: ShardSnapshot) {
      now += 1000;
      if (info !== undefined) {
        answer = info;
        await readInfo(ctx);
      }
      return buildHeartbeat(ctx, info, snapshot, now, undefined, undefined);
    },
  };
}

describe("the down report of a promoted primary keeps the link its lineage continues (simulator seed 72080)", () => {
  it("reports the last answer's prior_lineage as answered_prior_lineage while the database does not answer", async () => {
    // Prepare
    const agent = n1Agent();
    const up = await agent.cycle(PROMOTED);
    expect(up?.prior_lineage).toEqual({ repl_id: "L", last_txn_id: 68_448 });

    // Act
    const down = await agent.cycle(undefined);

    // Assess
    expect(down).toMatchObject({
      db_status: "down",
      repl_id: "P",
      last_txn_id: 68_832,
      answered_prior_lineage: { repl_id: "L", last_txn_id: 68_448 },
    });
    expect(down?.prior_lineage).toBeUndefined();
  });

  it("keeps it once the database restarted empty: prior_lineage is the new process's (none), the link the dead one's", async () => {
    // Prepare
    const agent = n1Agent();
    await agent.cycle(PROMOTED);

    // Act
    const restarted = await agent.cycle(EMPTY);

    // Assess
    expect(agent.ctx.dbRestarted).toBe(true);
    expect(restarted).toMatchObject({
      db_status: "down",
      repl_id: "P",
      answered_prior_lineage: { repl_id: "L", last_txn_id: 68_448 },
    });
    expect(restarted?.prior_lineage).toBeUndefined();
  });

  it("never takes a restarted process's earlier lineage for the link: each goes in its own field", async () => {
    // Prepare
    const agent = n1Agent();
    await agent.cycle(PROMOTED);

    // Act
    const restarted = await agent.cycle(OLD_RDB);

    // Assess
    expect(agent.ctx.dbRestarted).toBe(true);
    expect(restarted).toMatchObject({
      db_status: "down",
      repl_id: "P",
      prior_lineage: { repl_id: "L", last_txn_id: 50_000 },
      answered_prior_lineage: { repl_id: "L", last_txn_id: 68_448 },
    });
  });

  it("carries it on from its own stored down report when the agent restarted without its state", async () => {
    // Prepare: a new agent that has read nothing; the store holds its node's down report.
    const agent = n1Agent();
    const stored = aHeartbeat({
      node_id: "n1",
      role: "primary",
      db_status: "down",
      repl_id: "P",
      last_txn_id: 68_832,
      prior_lineage: { repl_id: "L", last_txn_id: 50_000 },
      answered_prior_lineage: { repl_id: "L", last_txn_id: 68_448 },
    });
    const snapshot = { shard: "s1", nodes: [stored] } as Partial<ShardSnapshot> as ShardSnapshot;

    // Act
    const down = await agent.cycle(undefined, snapshot);

    // Assess: the link goes on; the stored report's prior_lineage (a restarted process's data) does not.
    expect(down).toMatchObject({
      db_status: "down",
      answered_prior_lineage: { repl_id: "L", last_txn_id: 68_448 },
    });
    expect(down?.prior_lineage).toBeUndefined();
  });
});

/**
 * The stale answer of an overlapping cycle (guarantees 1 and 5; the fresh CI run of the
 * twenty-second session, `last-resort-own-lineage.test.ts`): the heartbeat loop's cycle read INFO
 * while n1 was a replica on L, PROMOTE was applied (the role generation moved) and the command's
 * forced cycle reported P; the slow cycle then finished with its pre-PROMOTE answer. Its heartbeat is
 * not written (the role changed), and now its answer does not replace the last one either: the down
 * report, built on the last answer, names P, the lineage the dead process held, not L.
 */
describe("an answer read before a role change never becomes the database's last answer", () => {
  const REPLICA_ON_L: ReplicationInfo = {
    role: "replica",
    offset: 68_448,
    replId: "L",
    prior: undefined,
    runId: "run-1",
    primary: { host: "n2", port: 6379, link: "up", lastIoSecondsAgo: 0, syncInProgress: false },
    replicas: [],
  };

  it("keeps the promoted answer when the slower cycle that read INFO before PROMOTE finishes last", async () => {
    // Prepare: the slow cycle's read, then PROMOTE applied and confirmed by the forced cycle.
    const agent = n1Agent();
    const staleGeneration = agent.ctx.roleGeneration;
    agent.ctx.roleGeneration++;
    const forced = await agent.cycle(PROMOTED);
    expect(forced).toMatchObject({ role: "primary", repl_id: "P" });

    // Act: the slow cycle finishes with its pre-PROMOTE answer, then the database dies.
    buildHeartbeat(
      agent.ctx,
      REPLICA_ON_L,
      undefined,
      1_800_000_010_000,
      undefined,
      undefined,
      staleGeneration,
    );
    const down = await agent.cycle(undefined);

    // Assess
    expect(down).toMatchObject({
      db_status: "down",
      role: "primary",
      repl_id: "P",
      last_txn_id: 68_832,
      answered_prior_lineage: { repl_id: "L", last_txn_id: 68_448 },
    });
  });

  it("still takes an answer read at the current role generation", async () => {
    // Prepare
    const agent = n1Agent();
    await agent.cycle(PROMOTED);

    // Act: a later answer of the same role generation (more writes), then the death.
    buildHeartbeat(
      agent.ctx,
      { ...PROMOTED, offset: 70_000 },
      undefined,
      1_800_000_010_000,
      undefined,
      undefined,
      agent.ctx.roleGeneration,
    );
    const down = await agent.cycle(undefined);

    // Assess
    expect(down).toMatchObject({ db_status: "down", repl_id: "P", last_txn_id: 70_000 });
  });
});
