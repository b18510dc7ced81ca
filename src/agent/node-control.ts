import { errorMessage, ShardguardError } from "../core/errors.ts";
import { sleep } from "./backoff.ts";
import type { AgentContext } from "./context.ts";
import { splitAddress } from "./database.ts";
import { FENCING_CONFIG_KEYS, fencingConfig, type PrimaryRef } from "./fencing.ts";
import type { ReplicationInfo } from "./redis-info.ts";

/** A role change that the database did not confirm. Retryable: the command stays queued. */
export class RoleChangeNotConfirmed extends ShardguardError {
  override name = "RoleChangeNotConfirmed";
  override readonly retryable = true;
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
  const [host, port] = splitAddress(address);
  return info.role === "replica" && info.primary?.host === host && info.primary.port === port;
}

/** `REPLICAOF NO ONE`, then waits until INFO shows the node primary. */
export async function becomePrimary(ctx: AgentContext): Promise<ReplicationInfo> {
  await ctx.db.promote();
  ctx.roleGeneration++;
  const info = await verify(ctx, (candidate) => candidate.role === "primary", "REPLICAOF NO ONE");
  await liftFence(ctx, "promoted");
  return info;
}

/** `REPLICAOF host port` (skipped when already following it, to spare a resync), then verifies. */
export async function becomeReplicaOf(ctx: AgentContext, target: PrimaryRef): Promise<ReplicationInfo> {
  ctx.knownNodes.set(target.address, target.node_id);
  const current = await ctx.db.replicationInfo();
  if (!followsPrimary(current, target.address)) {
    const [host, port] = splitAddress(target.address);
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
  await liftFence(ctx, `replica of ${target.node_id}`);
  return info;
}

/**
 * Makes the primary refuse writes (NOREPLICAS) by demanding more good replicas than exist. The
 * operator's values are saved in the state dir before they are changed, so that a crash in
 * between still knows what to restore.
 */
export async function fenceWrites(ctx: AgentContext, reason: string): Promise<void> {
  const existing = ctx.state.state.fence;
  const saved = existing?.saved ?? (await ctx.db.configGet(FENCING_CONFIG_KEYS));
  if (!existing) ctx.state.update({ fence: { saved, since: ctx.deps.clock.now() } });
  await ctx.db.configSet(fencingConfig(saved));
  ctx.logger.error("writes fenced: this primary refuses writes until the topology confirms it again", {
    ...ctx.epochContext,
    reason,
    policy: ctx.options.fencePolicy,
  });
}

/** Restores the settings saved by `fenceWrites`; a no-op when not fenced. */
export async function liftFence(ctx: AgentContext, reason: string): Promise<void> {
  const fence = ctx.state.state.fence;
  if (!fence) return;
  const saved = { ...fence.saved };
  // Restore the lag first: with min-replicas-to-write still high, the order keeps writes refused until the end.
  const ordered = Object.fromEntries(
    [...FENCING_CONFIG_KEYS]
      .reverse()
      .flatMap((key) => (saved[key] === undefined ? [] : [[key, saved[key]]])),
  );
  await ctx.db.configSet(ordered);
  ctx.state.update({ fence: undefined });
  ctx.logger.warn("write fence lifted", { ...ctx.epochContext, reason, fencedSince: fence.since });
}
