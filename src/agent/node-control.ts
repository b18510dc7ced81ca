import { parseAddress } from "../core/address.ts";
import { type PromotionWindow, promotionWindow } from "../core/crash.ts";
import { errorMessage, ShardguardError } from "../core/errors.ts";
import { type FollowVerdict, judgeFollow, recordedLineages } from "../core/identity.ts";
import type { Topology } from "../core/model.ts";
import { PROMOTION_FENCE_WINDOW_MS } from "../core/write-guard.ts";
import { sleep } from "./backoff.ts";
import type { AgentContext } from "./context.ts";
import { askOnce } from "./database.ts";
import { deposeFirst, fenceDeposed } from "./depose.ts";
import { type PrimaryRef, topologyPrimary } from "./fencing.ts";
import { isParked, PARKED_HOST, PARKED_PORT } from "./primary-probe.ts";
import type { ReplicationInfo } from "./redis-info.ts";
import { withStoreTimeout } from "./scheduling.ts";
import { fence, restoreOperatorSettings, tryEnforceWriteGuard } from "./write-guard.ts";

/** A role change that the database did not confirm. Retryable: the command stays queued. */
export class RoleChangeNotConfirmed extends ShardguardError {
  override name = "RoleChangeNotConfirmed";
  override readonly retryable = true;
}

/** A role change that would make the database replicate from itself. Never retried. */
export class SelfReplicationRefused extends ShardguardError {
  override name = "SelfReplicationRefused";
  override readonly retryable = false;
}

/**
 * A PROMOTE whose database no longer holds the offset the plan ranked this node on: not promoted
 * (only fenced, as a promotion starts; a replica's agent lifts that fence). The PROMOTE stays
 * queued: the controller retargets once it is overdue, or once this node reports its database
 * restarted, under a newer epoch that drops it.
 */
export class PromotionRefused extends ShardguardError {
  override name = "PromotionRefused";
  override readonly retryable = true;
}

/**
 * Why this node's database must not be promoted on the plan `topology` stores, or undefined: the
 * plan ranked it on `last_txn_id` (its candidate row, what its report held of the lineage), and a
 * process whose `master_repl_offset` is below that lost data since (restarted empty or from an
 * older RDB, or resynced from elsewhere) between the decision and this command. Redis offsets only
 * grow within a lineage and its continuations, so a database that still holds what it was ranked
 * on is never refused. Simulator seeds 220263 and 220883: a controller frozen for 40-51 s right
 * after the plan (controller-overlap) sent PROMOTE to n2, whose database had restarted empty in
 * between (its agent had fenced it: "database restarted without its data"); the empty database was
 * promoted and the replicas that held the 373 acknowledged writes full-synced from it.
 */
export function rankedShortfall(
  ctx: AgentContext,
  topology: Topology | undefined,
  info: ReplicationInfo,
): string | undefined {
  const failover = topology?.failover;
  if (failover === undefined || failover.new_primary_node_id !== ctx.nodeId) return undefined;
  const ranked = failover.candidates.find((candidate) => candidate.node_id === ctx.nodeId);
  if (ranked === undefined || info.offset >= ranked.last_txn_id) return undefined;
  const why = `the plan at epoch ${topology?.epoch} ranked ${ctx.nodeId} on offset ${ranked.last_txn_id}, its database holds ${info.offset} (replication id ${info.replId}): it lost data since the decision`;
  ctx.logger.warn("not promoted: the database no longer holds what the failover ranked it on", {
    ...ctx.epochContext,
    rankedOffset: ranked.last_txn_id,
    offset: info.offset,
    replId: info.replId,
    runId: info.runId,
    why,
  });
  return why;
}

/** Role changes and write fences. Callers hold `ctx.roleLock`. */

const VERIFY_ATTEMPTS = 20;
const VERIFY_INTERVAL_MS = 50;

/** Reads INFO until `accept` holds; observes the new role instead of trusting the reply. */
async function verify(
  ctx: AgentContext,
  accept: (info: ReplicationInfo) => boolean,
  what: string,
): Promise<ReplicationInfo> {
  let info: ReplicationInfo | undefined;
  for (let attempt = 0; attempt < VERIFY_ATTEMPTS; attempt++) {
    info = await ctx.db.replicationInfo();
    if (accept(info)) {
      ctx.lastInfo = info;
      return info;
    }
    await sleep(VERIFY_INTERVAL_MS);
  }
  throw new RoleChangeNotConfirmed(
    `${what} not confirmed by INFO replication (role ${info?.role}, primary ${info?.primary?.host}:${info?.primary?.port})`,
  );
}

export function followsPrimary(info: ReplicationInfo, address: string): boolean {
  const { host, port } = parseAddress(address);
  return info.role === "replica" && info.primary?.host === host && info.primary.port === port;
}

/**
 * Whether the old primary's process is known dead (src/core/crash.ts `promotionWindow`): its
 * agent's crash report, read strongly consistent from the store now, names the process this node
 * last replicated from, and this node's own link is down. Any doubt (store unreachable, no
 * report, another process) keeps the window.
 */
async function judgeWindow(ctx: AgentContext, before: ReplicationInfo): Promise<PromotionWindow> {
  try {
    const snapshot = await withStoreTimeout(
      ctx.deps.heartbeats.snapshot(ctx.shard),
      ctx.storeTimeoutMs,
      `snapshot of shard ${ctx.shard}`,
    );
    const oldId = snapshot.topology?.failover?.old_primary_node_id;
    return promotionWindow({
      oldPrimary: oldId === undefined ? undefined : snapshot.nodes.find((node) => node.node_id === oldId),
      lastPrimaryRunId: ctx.probe.lastPrimaryRunId,
      linkDown: before.role === "replica" && (isParked(before) || before.primary?.link !== "up"),
      topology: snapshot.topology,
    });
  } catch (error) {
    return { kind: "wait", reason: `could not read the old primary's report: ${errorMessage(error)}` };
  }
}

/**
 * `REPLICAOF NO ONE`, fenced, then waits until INFO shows the node primary. The fence stays for
 * the rest of the promotion window: the old primary counts this node as an acknowledging replica
 * until GUARD_MAX_LAG_S after their last contact, so until then both could take writes. The
 * window is counted from the last contact, so a primary that died long ago costs nothing, and it
 * is skipped when the old primary's process is known dead (its agent saw it crash: docs/agent.md#
 * the-crash-fast-path) or fenced by a switchover's PAUSE_WRITES (docs/agent.md#switchover).
 *
 * `topology` is the one the PROMOTE was screened against: when it names this node and the window
 * is skipped, the write guard opens here, before the heartbeat that confirms the promotion goes
 * out, so a switchover that returns "completed" returns with the new primary taking writes.
 */
export async function becomePrimary(ctx: AgentContext, topology?: Topology): Promise<ReplicationInfo> {
  // A deposing promotion fences the old primary and catches up with it first, or changes nothing.
  const failover = topology?.failover;
  if (failover?.depose !== undefined && failover.new_primary_node_id === ctx.nodeId) {
    await deposeFirst(ctx, failover.depose, await ctx.db.replicationInfo());
  }
  await fence(ctx, "promotion: writes wait for the old primary's guard to drop this node");
  const before = await ctx.db.replicationInfo();
  // A database that no longer holds what the plan ranked this node on is not promoted (guarantee 1).
  const shortfall = rankedShortfall(ctx, topology, before);
  if (shortfall !== undefined) throw new PromotionRefused(shortfall);
  const window = judgeWindow(ctx, before);
  void fenceDeposed(ctx, topology, before);
  await ctx.db.promote();
  ctx.roleGeneration++;
  ctx.probe.parkedFrom = undefined;
  const info = await verify(ctx, (candidate) => candidate.role === "primary", "REPLICAOF NO ONE");
  const lastContact = ctx.primaryContactAt ?? ctx.monotonicNow();
  const judged = await window;
  ctx.promotionFenceUntil =
    judged.kind === "skip" ? Number.NEGATIVE_INFINITY : lastContact + PROMOTION_FENCE_WINDOW_MS;
  ctx.dbRecord.restarted = false;
  const waitMs = Math.max(0, ctx.promotionFenceUntil - ctx.monotonicNow());
  ctx.logger.info("promoted; writes open when the fence window ends", {
    ...ctx.epochContext,
    waitMs,
    window: judged.kind,
    why: judged.reason,
  });
  if (waitMs === 0 && topology !== undefined && topologyPrimary(topology)?.node_id === ctx.nodeId) {
    ctx.confirmed = true;
    ctx.unconfirmedReason = undefined;
    await tryEnforceWriteGuard(ctx, info);
    return info;
  }
  const timer = setTimeout(() => {
    void ctx.roleLock.run(async () => {
      const current = await ctx.db.replicationInfo().catch(() => undefined);
      if (current) await tryEnforceWriteGuard(ctx, current);
    });
  }, waitMs + 1);
  timer.unref();
  return info;
}

/** Longest the agent waits for a target's INFO before it points its database there (\`judgeFollow\`). */
export const TARGET_READ_TIMEOUT_MS = 1_000;

/**
 * INFO of the database at \`address\` (a primary this node is about to follow), read on a one-off
 * connection within TARGET_READ_TIMEOUT_MS; undefined when it does not answer (a hung database
 * accepts the connection and never answers, which no socket timeout covers).
 */
export async function readTarget(ctx: AgentContext, address: string): Promise<ReplicationInfo | undefined> {
  return await askOnce(
    ctx.db,
    address,
    { name: `shardguard-target.${ctx.nodeId}`, timeoutMs: TARGET_READ_TIMEOUT_MS },
    (link) => link.replicationInfo(),
  ).catch(() => undefined);
}

/**
 * Parks the database (\`REPLICAOF 127.0.0.1 1\`: it refuses every sync) instead of following
 * \`target\` (\`judgeFollow\` refused it, or it did not answer), as the probe parks a replica whose
 * primary went away or fell silent: parked from \`target\` at \`epoch\` (the decision's), its probe
 * watching it, \`lacksMyData\` set on a refusal. The probe follows it once the process there holds
 * this database's data or took over from it by a recorded promotion; a newer decision naming
 * another node is judged again (\`staysParked\`); a parked node can be promoted. A primary stepping
 * down is parked so too: it takes no writes.
 */
async function parkInsteadOf(
  ctx: AgentContext,
  target: PrimaryRef,
  epoch: number,
  current: ReplicationInfo,
  verdict: Exclude<FollowVerdict, { kind: "follow" }>,
): Promise<ReplicationInfo> {
  if (!isParked(current)) {
    await ctx.db.replicaOf(PARKED_HOST, PARKED_PORT);
    ctx.roleGeneration++;
  }
  const info = await verify(ctx, isParked, `REPLICAOF ${PARKED_HOST} ${PARKED_PORT}`);
  ctx.probe.track(target.address);
  ctx.probe.parkedAtEpoch = epoch;
  ctx.probe.parkedFrom = target.address;
  ctx.probe.lacksMyData = verdict.kind === "refuse";
  try {
    await ctx.db.resumeWrites();
  } catch (error) {
    ctx.logger.warn("could not end a write pause after parking", { error: errorMessage(error) });
  }
  await restoreOperatorSettings(ctx, `parked instead of following ${target.node_id}`);
  ctx.appliedGuard = "replica";
  // The controller learns of the park (link down, the probe's vote) now, not at the next tick.
  ctx.wakeHeartbeat();
  ctx.logger.warn(
    verdict.kind === "refuse"
      ? "not following the named primary: its database holds none of this one's data; parked until a primary known to hold it"
      : "not following the named primary yet: its database did not answer; parked until it answers holding this one's data",
    {
      ...ctx.epochContext,
      primary: target.node_id,
      primaryAddress: target.address,
      topologyEpoch: epoch,
      wasRole: current.role,
      why: verdict.reason,
    },
  );
  return info;
}

/** What \`becomeReplicaOf\` did: the database's INFO after it, and the verdict on the target. */
export interface ReplicaOfResult {
  readonly info: ReplicationInfo;
  /** \`follow\`: it follows the target; otherwise parked from it instead. */
  readonly verdict: FollowVerdict;
}

/**
 * \`REPLICAOF host port\` (skipped when already following it, to spare a resync), then verifies.
 * Before a new \`REPLICAOF\` it reads the target's INFO and judges it (\`judgeFollow\`,
 * src/core/identity.ts; guarantee 1, simulator seed 7039): a target whose full sync would destroy
 * this database's data by no recorded choice is refused and the database parked instead; so is it
 * from a target that does not answer. \`decision\`: the epoch of the topology or command that
 * names the target (kept with a park) and the topology read with it (whose record the verdict reads).
 */
export async function becomeReplicaOf(
  ctx: AgentContext,
  target: PrimaryRef,
  decision: { readonly epoch: number; readonly topology: Topology | undefined },
): Promise<ReplicaOfResult> {
  if (target.address === ctx.address) {
    throw new SelfReplicationRefused(
      `refusing REPLICAOF ${target.address}: that is this node's own address (node ${target.node_id}, this agent ${ctx.nodeId})`,
    );
  }
  ctx.knownNodes.set(target.address, target.node_id);
  const current = await ctx.db.replicationInfo();
  ctx.pointedRunId = current.runId;
  if (!followsPrimary(current, target.address)) {
    const judged = await readTarget(ctx, target.address);
    const verdict = judgeFollow(
      judged,
      ctx.probe.withPrior(current),
      decision.topology?.ancestry ?? [],
      recordedLineages(decision.topology),
    );
    if (verdict.kind !== "follow")
      return { info: await parkInsteadOf(ctx, target, decision.epoch, current, verdict), verdict };
    const { host, port } = parseAddress(target.address);
    await ctx.db.replicaOf(host, port);
    ctx.roleGeneration++;
  }
  const info = await verify(
    ctx,
    (candidate) => followsPrimary(candidate, target.address),
    `REPLICAOF ${target.address}`,
  );
  // A paused replica does not apply its replication stream either: the pause a switchover put on
  // this old primary must end now, or the node lags until the pause expires and a following
  // switchover cannot catch up. Writes held by the pause now fail with READONLY, unacknowledged.
  try {
    await ctx.db.resumeWrites();
  } catch (error) {
    // Databases without CLIENT UNPAUSE (Redis < 6.2) end the pause at its timeout; the move stands.
    ctx.logger.warn("could not end a write pause after becoming a replica", { error: errorMessage(error) });
  }
  // A replica refuses writes anyway; the operator's settings must be back for its next promotion.
  await restoreOperatorSettings(ctx, `replica of ${target.node_id}`);
  ctx.dbRecord.restarted = false;
  ctx.appliedGuard = "replica";
  return { info, verdict: { kind: "follow" } };
}
