import { DEPOSE_TIMEOUT_MS, deposedAddresses } from "../core/depose.ts";
import { errorMessage } from "../core/errors.ts";
import type { Topology } from "../core/model.ts";
import { FENCED_MIN_REPLICAS, GUARD_MAX_LAG_S } from "../core/write-guard.ts";
import type { AgentContext } from "./context.ts";
import { topologyPrimary } from "./fencing.ts";
import { PARKED_ADDRESS } from "./primary-probe.ts";
import type { ReplicationInfo } from "./redis-info.ts";

/**
 * Before a promotion opens writes, the promoted node sets the write fence on the old primary's
 * database itself (src/core/depose.ts): Redis's guard there counts any replica that acknowledges,
 * so with the old primary's agent dead nothing else keeps it from taking writes again once some
 * replica re-attaches. One that does not answer (hung, cut off) is tried again every cycle while
 * this node stays the primary of that epoch: a hung database answers the first connection after
 * it wakes. The old primary's agent, when it runs, lifts the fence as its topology says (it
 * becomes a replica of the new primary, or sets its guard again at a newer epoch).
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
    followed:
      before.role === "replica" && before.primary !== undefined
        ? `${before.primary.host}:${before.primary.port}`
        : undefined,
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
 * Tries the pending old primaries again (a primary's cycle calls it without waiting); drops them
 * once the topology no longer names this node primary at the epoch it was promoted at.
 */
export async function retryDeposed(ctx: AgentContext): Promise<void> {
  const pending = ctx.deposePending;
  if (pending === undefined || ctx.deposeInFlight) return;
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

async function fenceOne(ctx: AgentContext, address: string, first: boolean): Promise<boolean> {
  const link = ctx.db.dial(address, {
    name: `shardguard-depose.${ctx.nodeId}`,
    connectTimeoutMs: DEPOSE_TIMEOUT_MS,
    commandTimeoutMs: DEPOSE_TIMEOUT_MS,
  });
  const node = ctx.knownNodes.get(address);
  let timer: NodeJS.Timeout | undefined;
  try {
    // Bounded as a whole: a hung database accepts the TCP connection and never answers the
    // client's ready check, which no socket timeout covers.
    await Promise.race([
      (async () => {
        await link.connect();
        // The guard is off while the lag is 0: the fence needs both.
        const lag = Number(await link.configGet("min-replicas-max-lag"));
        if (!(Number.isInteger(lag) && lag > 0))
          await link.configSet("min-replicas-max-lag", String(GUARD_MAX_LAG_S));
        await link.configSet("min-replicas-to-write", String(FENCED_MIN_REPLICAS));
      })(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no answer within ${DEPOSE_TIMEOUT_MS} ms`)),
          DEPOSE_TIMEOUT_MS,
        );
      }),
    ]);
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
  } finally {
    clearTimeout(timer);
    link.disconnect();
  }
}
