import { setTimeout as sleep } from "node:timers/promises";
import type { Redis } from "ioredis";
import { parseReplicationInfo } from "../../agent/redis-info.ts";
import { errorMessage, ShardguardError } from "../../core/errors.ts";

/** The few `INFO replication` fields the workload needs to tell that replicas caught up. */
export interface ReplicationState {
  readonly role: "master" | "slave";
  /** `master_repl_offset`: on a replica, how far of its primary's stream it has processed. */
  readonly offset: number;
  /** `host:port` of the primary, on a replica. */
  readonly primaryAddress: string | undefined;
  readonly linkUp: boolean;
}

/** The workload's view of `INFO replication`, read with the agent's parser (one parser of that text). */
export function parseReplicationState(text: string): ReplicationState {
  const info = parseReplicationInfo(text);
  return {
    role: info.role === "primary" ? "master" : "slave",
    offset: info.offset,
    primaryAddress: info.primary ? `${info.primary.host}:${info.primary.port}` : undefined,
    linkUp: info.primary?.link === "up",
  };
}

export async function replicationState(client: Redis): Promise<ReplicationState> {
  return parseReplicationState(await client.info("replication"));
}

/** The replicas did not catch up with the primary in time; says which and how far behind. */
export class ReplicasNotInSync extends ShardguardError {
  override name = "ReplicasNotInSync";
}

/**
 * Waits until every replica has its link up to `primaryAddress` and has processed at least the
 * primary's offset as it was when this call started. A writer may keep writing meanwhile: the
 * offsets then never stay equal, but everything written before the call is on every replica.
 */
export async function waitForReplicasInSync(
  primary: Redis,
  primaryAddress: string,
  replicas: readonly Redis[],
  options: { timeoutMs?: number; pollMs?: number } = {},
): Promise<void> {
  const timeoutMs = options.timeoutMs ?? 15_000;
  const deadline = performance.now() + timeoutMs;
  const target = await replicationState(primary);
  if (target.role !== "master") throw new ReplicasNotInSync(`${primaryAddress} is not a primary`);
  let behind = "";
  while (performance.now() < deadline) {
    const states = await Promise.all(
      replicas.map((replica) => replicationState(replica).catch((error: unknown) => errorMessage(error))),
    );
    const lagging = states.flatMap((state, index) => {
      const name = `replica ${index + 1}`;
      if (typeof state === "string") return [`${name}: ${state}`];
      if (state.role !== "slave" || state.primaryAddress !== primaryAddress) {
        return [`${name}: replicates ${state.primaryAddress ?? "nothing"}`];
      }
      if (!state.linkUp) return [`${name}: link down`];
      if (state.offset < target.offset) return [`${name}: offset ${state.offset} < ${target.offset}`];
      return [];
    });
    if (lagging.length === 0) return;
    behind = lagging.join("; ");
    await sleep(options.pollMs ?? 50);
  }
  throw new ReplicasNotInSync(`replicas of ${primaryAddress} not in sync after ${timeoutMs} ms: ${behind}`);
}
