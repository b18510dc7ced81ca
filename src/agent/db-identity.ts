import { errorMessage } from "../core/errors.ts";
import { type DatabaseIdentity, judgeRestart, reportedPointOf } from "../core/identity.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import type { AgentContext } from "./context.ts";
import { topologyPrimary } from "./fencing.ts";
import { type ReplicationInfo, syncedReplicaAddresses } from "./redis-info.ts";
import { fence, tryEnforceWriteGuard } from "./write-guard.ts";

/**
 * The database as the heartbeat cycle reads it: INFO, whether what answers is the process this
 * node served (its identity, kept in the state dir), and what the agent does when it is not.
 */

/**
 * Reads INFO. `answeredFrom` (AWS-aligned ms) is taken before the request: the database was alive
 * at least then, and a crash the watch observes after it is never dated before `last_updated`.
 */
export async function readInfo(
  ctx: AgentContext,
): Promise<{ info: ReplicationInfo; answeredFrom: number } | undefined> {
  const answeredFrom = ctx.deps.clock.now();
  try {
    const info = await ctx.db.replicationInfo();
    if (!ctx.dbUp) ctx.logger.info("database answers", { redis: ctx.options.redis, role: info.role });
    ctx.dbUp = true;
    ctx.lastInfo = info;
    ctx.lastInfoGeneration = ctx.roleGeneration;
    if (ctx.dbRecord.roleSeen?.role !== info.role)
      ctx.dbRecord.roleSeen = { role: info.role, since: answeredFrom };
    // A restarted primary is harmless once it follows a primary (a command or a step-down did it).
    if (info.role === "replica") {
      ctx.dbRecord.restarted = false;
      ctx.dbRecord.pendingRestart = undefined;
    }
    // While connected, the replica acknowledges every second: the primary counts it until then.
    if (info.role === "replica" && info.primary?.link === "up") ctx.primaryContactAt = ctx.monotonicNow();
    const previousRunId = ctx.dbRecord.identity?.runId;
    checkIdentity(ctx, info);
    persistRestarted(ctx);
    if (ctx.dbRestarted) {
      // The process this node served as primary is gone; what answers is fenced and reported down.
      // Every read is another observation of that, so the report is confirmed and stays current
      // (src/core/crash.ts): an agent restarted after its database died sees the new process
      // once per cycle, and never sees the old one go (the crash watch only reports deaths it saw).
      // An agent restarted with its state dir after the restart knows only the process answering
      // now: that one is not the process that died (nemesis seed 7311).
      recordRestart(ctx, previousRunId === info.runId ? undefined : previousRunId);
    } else if (ctx.crash !== undefined) {
      ctx.logger.info("database answers again", {
        ...ctx.epochContext,
        runId: info.runId,
        crash: ctx.crash.state,
      });
      ctx.crash = undefined;
    }
    return { info, answeredFrom };
  } catch (error) {
    if (ctx.dbUp || ctx.lastInfo === undefined) {
      ctx.logger.warn("database does not answer; heartbeats report db_status down", {
        redis: ctx.options.redis,
        error: errorMessage(error),
      });
    }
    ctx.dbUp = false;
    return undefined;
  }
}

function recordRestart(ctx: AgentContext, previousRunId: string | undefined): void {
  const now = Math.floor(ctx.deps.clock.now() * 1000);
  ctx.crash = {
    state: "restarted",
    run_id: ctx.crash?.run_id ?? previousRunId ?? "",
    first_seen: ctx.crash?.first_seen ?? now,
    last_seen: now,
  };
}

/**
 * A database whose run_id changed is a new process. If it was this shard's primary and its
 * replication lineage does not continue the old one (the same replid, or for the named primary
 * the old one as its replid2 after a restart from its RDB; its offset not behind, and no other
 * node reporting more of it), it restarted empty or from an old
 * snapshot: while another node may hold the data, it must not serve, nor feed its replicas, before
 * the controller replaced it (guarantee 5, docs/agent.md#database-identity).
 */
function checkIdentity(ctx: AgentContext, info: ReplicationInfo): void {
  if (info.runId === undefined) return;
  const previous = ctx.dbRecord.identity;
  const current: DatabaseIdentity = {
    runId: info.runId,
    replId: info.replId,
    offset: info.offset,
    role: info.role,
    synced: syncedReplicaAddresses(info).length,
    prior: info.prior,
  };
  ctx.dbRecord.identity = current;
  // The previous process was fenced as restarted without its data (a verdict, not a restart held
  // pending on the peers' reports) and the node has not followed a primary since (`readInfo` clears
  // the flag for a replica): what continues it continues no more than it held.
  const fenced = ctx.dbRecord.restarted && ctx.dbRecord.pendingRestart === undefined;
  const context = { ...restartContext(ctx), fenced };
  const verdict = judgeRestart(previous, current, context);
  // Back behind the dead process's last answer on its lineage (a replica from an older RDB): what
  // it held past the new offset it may have acknowledged; reported while the new process lacks it.
  if (
    verdict.kind !== "same" &&
    previous !== undefined &&
    previous.replId !== "" &&
    current.replId === previous.replId &&
    current.offset < previous.offset
  ) {
    const answeredAt = ctx.lastAnswered?.last_updated;
    ctx.dbRecord.restartedBehind = {
      repl_id: previous.replId,
      last_txn_id: previous.offset,
      last_updated: answeredAt ?? Math.floor(ctx.deps.clock.now() * 1000),
    };
  }
  if (verdict.kind === "lost-data") ctx.dbRecord.restarted = true;
  if (verdict.kind !== "same") ctx.dbRecord.pendingRestart = undefined;
  // "It continues", and "no other node holds its data", rest on what the other nodes reported.
  // Reports read before this restart may lack what a replica acknowledged since (nemesis seed 5101:
  // a snapshot 25 s old during a store outage showed the replicas behind the RDB; the new process
  // opened, the shard came back on it, and the replicas resynced 67 acknowledged writes away), and
  // an agent that has read no snapshot yet knows of no holder at all (nemesis seed 7335: node-3's
  // agent, started 0.1 s before its database came back from an RDB behind two parked replicas and
  // its first snapshot slowed by the store, judged "no other node holds its data" and opened the
  // fork; 167 acknowledged writes lost). A primary's new process stays fenced until a snapshot read
  // after it, with every member reporting since, judges it again (\`rejudgeRestart\`). Guarantee 5.
  const wasPrimary = previous?.role === "primary" || context.named;
  if (verdict.kind === "harmless" && verdict.onReports === true && wasPrimary && current.role === "primary") {
    const seenAt = ctx.deps.clock.now();
    if (!peersReportedSince(ctx, seenAt) && previous !== undefined) {
      ctx.dbRecord.restarted = true;
      ctx.dbRecord.pendingRestart = { previous, seenAt };
      ctx.appliedGuard = undefined;
      // Every cycle reads the shard until the restart is judged.
      ctx.schedule.request();
      persistIdentity(ctx, current);
      ctx.logger.warn(
        "database restarted: fenced until the other nodes' reports written since confirm it continues its lineage",
        {
          ...ctx.epochContext,
          runId: info.runId,
          replId: info.replId,
          offset: info.offset,
          prior: info.prior,
          previousOffset: previous.offset,
          members: ctx.guardMembers,
          why: verdict.reason,
        },
      );
      return;
    }
  }
  // The new identity and the verdict on it are written together, in one atomic update: an agent
  // killed between the two would leave its successor judging the empty process "the same" and
  // opening it (data-safety's seed-3102 test caught it under load).
  persistIdentity(ctx, current);
  if (verdict.kind === "same") return;
  // The guard's settings died with the old process.
  ctx.appliedGuard = undefined;
  if (verdict.kind === "harmless") {
    ctx.logger.warn("database restarted", {
      ...ctx.epochContext,
      runId: info.runId,
      continues: verdict.continues,
      why: verdict.reason,
      replId: info.replId,
      offset: info.offset,
      prior: info.prior,
      previousOffset: previous?.offset,
    });
    return;
  }
  ctx.logger.error("database restarted without its data: fenced until it follows the shard's primary", {
    ...ctx.epochContext,
    runId: info.runId,
    previousRunId: previous?.runId,
    replId: info.replId,
    previousReplId: previous?.replId,
    offset: info.offset,
    previousOffset: previous?.offset,
    prior: info.prior,
    previousPrior: previous?.prior,
    why: verdict.reason,
  });
}

/**
 * An agent whose state dir held no identity of its database (a machine rebuilt from its image, the
 * dir deleted: \`ownReportPending\`) judges the process that answers once, on its first snapshot,
 * against this node's own last stored report: the dead process's lineage and offset (its report
 * keeps them when its database went down), by the rule any restart is judged by (\`judgeRestart\`).
 * A primary's process that does not continue them restarted without its data: fenced and reported
 * down, as the agent before it had it, until it follows the shard's primary (guarantee 5).
 * Simulator seed 7003 (2,810 acknowledged writes lost): the primary's database restarted empty, its
 * agent fenced it and died; the agent restarted without its state judged the empty process "the
 * same", opened it while the topology still named it, dropped the parked member that held every
 * write from the replica set, and the shard's data was replaced by the empty lineage. A healthy
 * database continues its own report (same lineage, offset not behind) and opens as before.
 */
export function judgeAgainstOwnReport(ctx: AgentContext, snapshot: ShardSnapshot): void {
  if (!ctx.dbRecord.ownReportPending) return;
  const current = ctx.dbRecord.identity;
  if (current === undefined) return;
  ctx.dbRecord.ownReportPending = false;
  const mine = snapshot.nodes.find((node) => node.node_id === ctx.nodeId);
  if (mine === undefined) return;
  // The epoch this node's agent had applied is in its report too: without it a parked replica takes
  // every stored topology for a newer decision than the one it was parked under, and follows a
  // primary restarted without its data (simulator seed 7046: n1, parked from n3's empty restart at
  // epoch 10, repointed to it when its agent restarted without state, was wiped, promoted, and
  // wiped n2: 7,731 acknowledged writes lost). Guarantee 1.
  if (mine.epoch > ctx.highestEpoch) ctx.state.update({ highest_epoch: mine.epoch });
  if (mine.repl_id === "") return;
  // A restart the report recorded names the dead process, unless it names the one answering now:
  // an agent restarted with its state after the restart took the live process for the dead one, and
  // "the same process" would open an empty database (nemesis seed 7311, guarantee 5: 264
  // acknowledged writes lost). Then the lineage and offset judge it.
  const deadRunId = mine.db_crash?.run_id === current.runId ? undefined : mine.db_crash?.run_id;
  const previous: DatabaseIdentity = {
    ...reportedPointOf(mine),
    // The report names no process; a restart it recorded names the dead one.
    runId: deadRunId || "(this node's last report)",
    role: mine.role,
    synced: 0,
  };
  const verdict = judgeRestart(previous, current, {
    ...restartContext(ctx),
    guardMembers: snapshot.replicaSets[ctx.nodeId] ?? [],
  });
  if (verdict.kind !== "lost-data") return;
  ctx.dbRecord.restarted = true;
  ctx.dbRecord.pendingRestart = undefined;
  ctx.appliedGuard = undefined;
  // The down report keeps the dead process's lineage and offset (\`downHeartbeat\`), and this agent
  // never read that process: what it answered before this first snapshot (cycles while the store
  // did not answer) is the new process's, on another replication id. The node's own stored report
  // is the dead process's last. Nemesis seed 7301 (guarantee 1, 36 acknowledged writes lost): the
  // down report named the new process's id, the controller stored it as the shard's lineage, the
  // two replicas holding every write were "foreign" to it, and the shard came back on a node
  // holding only the restarted process's data.
  ctx.schedule.lastAnswered = mine;
  persistRestarted(ctx);
  recordRestart(ctx, deadRunId);
  ctx.logger.error(
    "database does not continue this node's last report: restarted without its data while this agent was down; fenced until it follows the shard's primary",
    {
      ...ctx.epochContext,
      runId: current.runId,
      replId: current.replId,
      offset: current.offset,
      reportedReplId: previous.replId,
      reportedOffset: previous.offset,
      why: verdict.reason,
    },
  );
}

function restartContext(ctx: AgentContext) {
  return {
    named: ctx.lastTopology ? topologyPrimary(ctx.lastTopology)?.node_id === ctx.nodeId : false,
    guardMembers: ctx.guardMembers,
    others: ctx.othersHold,
  };
}

/**
 * The last snapshot was read after \`seenAt\` (AWS-aligned ms) and every member of this node's
 * replica set had written a report since: what they hold is known as of after the restart.
 */
function peersReportedSince(ctx: AgentContext, seenAt: number): boolean {
  const read = ctx.othersRead;
  if (read === undefined || read.from < seenAt) return false;
  return ctx.guardMembers.every((id) => (read.writtenMs.get(id) ?? Number.NEGATIVE_INFINITY) >= seenAt);
}

/**
 * A restart held pending (\`pendingRestart\`), judged again once the peers have reported since it: the
 * new process opens (the guard then set as for any primary) if it continues its lineage by those
 * reports, and stays fenced and reported down if another node holds writes it lacks.
 */
export function rejudgeRestart(ctx: AgentContext): void {
  const pending = ctx.dbRecord.pendingRestart;
  const current = ctx.dbRecord.identity;
  if (pending === undefined || current === undefined) return;
  if (!peersReportedSince(ctx, pending.seenAt)) {
    ctx.schedule.request();
    return;
  }
  ctx.dbRecord.pendingRestart = undefined;
  const verdict = judgeRestart(pending.previous, current, restartContext(ctx));
  ctx.appliedGuard = undefined;
  if (verdict.kind === "lost-data") {
    ctx.logger.error("database restarted without its data: fenced until it follows the shard's primary", {
      ...ctx.epochContext,
      runId: current.runId,
      replId: current.replId,
      offset: current.offset,
      previousOffset: pending.previous.offset,
      prior: current.prior,
      why: `${verdict.reason} (judged on the other nodes' reports written since the restart)`,
    });
    return;
  }
  ctx.dbRecord.restarted = false;
  persistRestarted(ctx);
  ctx.logger.warn(
    "database restart judged on the other nodes' reports written since: it continues its lineage",
    {
      ...ctx.epochContext,
      runId: current.runId,
      offset: current.offset,
      why: verdict.kind === "harmless" ? verdict.reason : "the same process",
    },
  );
}

/** Longest the state dir's copy of the database's offset lags behind (it is only written then). */
const IDENTITY_PERSIST_MS = 5_000;

/**
 * Keeps the state dir's copy of the database identity and restart flag: at once when the process,
 * lineage or role changed, every IDENTITY_PERSIST_MS for the offset (an older offset only makes
 * the restarted agent's judgement more lenient, never fence a healthy process).
 */
function persistIdentity(ctx: AgentContext, current: DatabaseIdentity): void {
  const stored = ctx.state.state.db_identity;
  const now = ctx.monotonicNow();
  const changed =
    stored === undefined ||
    stored.run_id !== current.runId ||
    stored.repl_id !== current.replId ||
    stored.prior?.repl_id !== current.prior?.replId ||
    stored.role !== current.role;
  const flagChanged = (ctx.state.state.db_restarted === true) !== ctx.dbRestarted;
  if (changed || flagChanged || now - ctx.dbRecord.persistedAt >= IDENTITY_PERSIST_MS) {
    ctx.state.update({
      db_identity: {
        run_id: current.runId,
        repl_id: current.replId,
        offset: current.offset,
        role: current.role,
        synced: current.synced,
        prior:
          current.prior === undefined
            ? undefined
            : { repl_id: current.prior.replId, offset: current.prior.offset },
      },
      db_restarted: ctx.dbRestarted ? true : undefined,
    });
    ctx.dbRecord.persistedAt = now;
  }
}

/** The restart flag survives an agent restart: a database it fenced stays fenced. */
function persistRestarted(ctx: AgentContext): void {
  if ((ctx.state.state.db_restarted === true) !== ctx.dbRestarted) {
    ctx.state.update({ db_restarted: ctx.dbRestarted ? true : undefined });
  }
}

const CONFLICT_REMINDER_MS = 30_000;

/**
 * This agent's address belongs to another node id in the topology. Acting on it could only make
 * the database follow itself or demote the shard's primary, so the agent touches nothing, writes
 * no heartbeat, and says what to do.
 */
export function reportIdentityConflict(ctx: AgentContext, owner: string): void {
  const now = ctx.monotonicNow();
  if (now - ctx.dbRecord.conflictReportedAt < CONFLICT_REMINDER_MS) return;
  ctx.dbRecord.conflictReportedAt = now;
  ctx.logger.error(
    "identity conflict: the topology names another node at this agent's address; the database is left as it is",
    {
      ...ctx.epochContext,
      address: ctx.address,
      topologyNode: owner,
      agentNode: ctx.nodeId,
      fix: `restart this agent with --node-id ${owner} (or restore its state dir ${ctx.options.stateDir})`,
    },
  );
}

/**
 * A database that answers as a new process (restarted: its write guard died with the old one)
 * gets the guard at once, from what the agent already knows, without waiting for this cycle's
 * store calls (slow or failing during an outage: seconds in which the new process took writes).
 */
export async function guardNewProcess<T extends { info: ReplicationInfo } | undefined>(
  ctx: AgentContext,
  read: T,
): Promise<T> {
  const info = read?.info;
  if (info?.role === "primary" && ctx.appliedGuard === undefined && (ctx.topologyRead || ctx.dbRestarted)) {
    // An agent that never judged this database against the topology (every read since it started
    // found the database down: a hung primary, its agent restarted meanwhile) knows no replica set
    // and no confirmation: the guard from that view is min-replicas-to-write 0, which opened a
    // deposed primary's resumed process beside its successor, and during a store outage would keep
    // it open (simulator seed 7034, guarantee 2). It fences until the cycle's verdict on a
    // topology read with the database answering confirms this primary or steps it down.
    if (ctx.confirmed === undefined && !ctx.dbRestarted) {
      await ctx.roleLock.run(async () => {
        try {
          await fence(
            ctx,
            "the database answers before any topology read judged it: fenced until one confirms this primary",
          );
        } catch (error) {
          ctx.logger.warn("could not fence the database", {
            ...ctx.epochContext,
            error: errorMessage(error),
          });
        }
      });
      return read;
    }
    await ctx.roleLock.run(() => tryEnforceWriteGuard(ctx, info));
  }
  return read;
}
