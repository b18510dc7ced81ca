import { DEPOSE_CATCH_UP_MS, DEPOSE_TIMEOUT_MS, deposedAddresses } from "../core/depose.ts";
import { errorMessage, ShardguardError } from "../core/errors.ts";
import type { Topology } from "../core/model.ts";
import { FENCED_MIN_REPLICAS, GUARD_MAX_LAG_S } from "../core/write-guard.ts";
import { sleep } from "./backoff.ts";
import type { AgentContext } from "./context.ts";
import { askOnce } from "./database.ts";
import { topologyPrimary } from "./fencing.ts";
import { PARKED_ADDRESS } from "./primary-probe.ts";
import { type ReplicationInfo, replicatingFrom, syncedReplicaAddresses } from "./redis-info.ts";

/**
 * Before a promotion opens writes, the promoted node sets the write fence on the old primary's
 * database itself (src/core/depose.ts): Redis's guard there counts any replica that acknowledges,
 * so with the old primary's agent dead nothing else keeps it from taking writes again once some
 * replica re-attaches. One that does not answer (hung, cut off) is tried again every cycle while
 * this node stays the primary of that epoch: a hung database answers the first connection after
 * it wakes. Past that epoch the next promotion fences it: the topology keeps every replaced
 * primary not known to have stood down (\`topology.deposed\`, src/core/depose.ts \`deposedAfter\`;
 * nemesis seed 6811). The old primary's agent, when it runs, lifts the fence as its topology says
 * (it becomes a replica of the new primary, or sets its guard again at a newer epoch).
 */

/**
 * Fences each database `deposedAddresses` names, in parallel, each within DEPOSE_TIMEOUT_MS; the
 * ones that did not answer stay pending for `retryDeposed`. Never throws; the promotion does not
 * wait for it (its own fence window holds its writes meanwhile).
 */
export async function fenceDeposed(
  ctx: AgentContext,
  topology: Topology | undefined,
  before: ReplicationInfo,
): Promise<void> {
  const addresses = deposedAddresses({
    selfId: ctx.nodeId,
    selfAddress: ctx.address,
    topology,
    followed: before.role === "replica" ? replicatingFrom(before) : undefined,
    ignore: [PARKED_ADDRESS],
  });
  if (addresses.length === 0) return;
  ctx.deposeInFlight = true;
  try {
    const failed = await attempt(ctx, addresses, true);
    ctx.deposePending =
      failed.length > 0 && topology !== undefined ? { epoch: topology.epoch, addresses: failed } : undefined;
  } finally {
    ctx.deposeInFlight = false;
  }
}

/**
 * Tries the pending old primaries again (a primary's cycle calls it, with its INFO, without
 * waiting); drops one that replicates from this node now (its database follows the new primary:
 * a replica takes no writes), and all of them once the topology no longer names this node primary
 * at the epoch it was promoted at.
 */
export async function retryDeposed(ctx: AgentContext, info: ReplicationInfo): Promise<void> {
  const pending = ctx.deposePending;
  if (pending === undefined || ctx.deposeInFlight) return;
  const following = new Set(syncedReplicaAddresses(info));
  pending.addresses = pending.addresses.filter((address) => !following.has(address));
  if (pending.addresses.length === 0) {
    ctx.deposePending = undefined;
    return;
  }
  const topology = ctx.lastTopology;
  if (topology?.epoch !== pending.epoch || topologyPrimary(topology)?.node_id !== ctx.nodeId) {
    if (topology !== undefined && topology.epoch !== pending.epoch) ctx.deposePending = undefined;
    return;
  }
  ctx.deposeInFlight = true;
  try {
    const failed = await attempt(ctx, pending.addresses, false);
    if (ctx.deposePending === pending) pending.addresses = failed;
    if (pending.addresses.length === 0 && ctx.deposePending === pending) ctx.deposePending = undefined;
  } finally {
    ctx.deposeInFlight = false;
  }
}

/** The addresses whose fence could not be set. */
async function attempt(ctx: AgentContext, addresses: readonly string[], first: boolean): Promise<string[]> {
  const results = await Promise.all(addresses.map((address) => fenceOne(ctx, address, first)));
  return addresses.filter((_, index) => !results[index]);
}

/**
 * Dials `address`, sets the write fence there and returns the database's INFO read after it, all
 * within DEPOSE_TIMEOUT_MS: a hung database accepts the TCP connection and never answers the
 * client's ready check, which no socket timeout covers.
 */
async function fenceAt(ctx: AgentContext, address: string): Promise<ReplicationInfo> {
  return await askOnce(
    ctx.db,
    address,
    { name: `shardguard-depose.${ctx.nodeId}`, timeoutMs: DEPOSE_TIMEOUT_MS },
    async (link) => {
      // The guard is off while the lag is 0: the fence needs both.
      const lag = Number(await link.configGet("min-replicas-max-lag"));
      if (!(Number.isInteger(lag) && lag > 0))
        await link.configSet("min-replicas-max-lag", String(GUARD_MAX_LAG_S));
      await link.configSet("min-replicas-to-write", String(FENCED_MIN_REPLICAS));
      return await link.replicationInfo();
    },
  );
}

async function fenceOne(ctx: AgentContext, address: string, first: boolean): Promise<boolean> {
  const node = ctx.knownNodes.get(address);
  try {
    await fenceAt(ctx, address);
    ctx.logger.warn(
      "old primary fenced by its successor: it refuses writes until its agent follows the new primary",
      {
        ...ctx.epochContext,
        oldPrimary: node,
        oldPrimaryAddress: address,
        retried: !first,
      },
    );
    return true;
  } catch (error) {
    // Dead, hung or cut off: the promotion's own window stands meanwhile, and the next cycles try
    // again. Said once per promotion, not every cycle.
    if (first) {
      ctx.logger.warn(
        "could not fence the old primary directly: trying again every cycle while this node is its successor",
        {
          ...ctx.epochContext,
          oldPrimary: node,
          oldPrimaryAddress: address,
          error: errorMessage(error),
        },
      );
    }
    return false;
  }
}

/** A deposing promotion that could not fence the old primary or catch up with it: not promoted; the PROMOTE stays queued. */
export class DeposeFailed extends ShardguardError {
  override name = "DeposeFailed";
  override readonly retryable = true;
}

/**
 * A deposing promotion (the topology's `failover.depose`, src/core/depose.ts): before this node
 * detaches, the old primary it replicates from is fenced, and this node catches up with the offset
 * the fenced primary reports (a primary that refuses writes sends nothing past it). Throws
 * DeposeFailed, with nothing changed on this node, when it does not replicate from that address,
 * the old primary does not answer within DEPOSE_TIMEOUT_MS, or this node does not reach its offset
 * within DEPOSE_CATCH_UP_MS.
 */
export async function deposeFirst(
  ctx: AgentContext,
  depose: { readonly node_id: string; readonly address: string },
  before: ReplicationInfo,
): Promise<void> {
  const followed = before.role === "replica" ? replicatingFrom(before) : undefined;
  const why = `deposing promotion over ${depose.node_id} (${depose.address})`;
  if (followed !== depose.address || before.primary?.link !== "up") {
    throw new DeposeFailed(
      `${why}: this node replicates from ${followed ?? "nobody"} (link ${before.primary?.link ?? "none"}), not from it with the link up`,
    );
  }
  let old: ReplicationInfo;
  try {
    old = await fenceAt(ctx, depose.address);
  } catch (error) {
    throw new DeposeFailed(`${why}: could not fence it: ${errorMessage(error)}`);
  }
  const deadline = ctx.monotonicNow() + DEPOSE_CATCH_UP_MS;
  let own = before.offset;
  for (;;) {
    const info = await ctx.db.replicationInfo();
    own = info.offset;
    if (info.replId === old.replId && own >= old.offset) break;
    if (ctx.monotonicNow() >= deadline) {
      throw new DeposeFailed(
        `${why}: fenced it, but this node reached offset ${own} of ${old.offset} (lineage ${info.replId}, its ${old.replId}) within ${DEPOSE_CATCH_UP_MS} ms`,
      );
    }
    await sleep(DEPOSE_POLL_MS);
  }
  ctx.logger.warn(
    "old primary deposed: fenced by this node, which holds its final offset, before promoting",
    {
      ...ctx.epochContext,
      oldPrimary: depose.node_id,
      oldPrimaryAddress: depose.address,
      offset: old.offset,
    },
  );
}

const DEPOSE_POLL_MS = 50;
