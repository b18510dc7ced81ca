import type { Topology } from "../core/model.ts";
import type { TopologyStore } from "../core/ports.ts";

export interface PrimaryEndpoint {
  readonly shard: string;
  readonly epoch: number;
  readonly nodeId: string;
  readonly address: string;
}

export interface PrimaryResolverOptions {
  /** How long a resolved primary is served from cache before the topology is read again. @default 1000 */
  readonly cacheMs?: number;
  /** @default Date.now */
  readonly now?: () => number;
}

/**
 * Resolves a shard's current primary for applications, after Sequins' monotonic reads (seed 003):
 * the view only moves forward. A topology read that returns an older epoch than one already seen
 * (a lagging replica of the table, a stale cache elsewhere) is ignored, so a client never switches
 * back to a demoted primary.
 *
 * While the shard is failing over (until its new primary is confirmed) or offline there is no
 * primary to write to: `resolve` returns undefined instead of the old address.
 */
export class PrimaryResolver {
  private readonly store: Pick<TopologyStore, "read">;
  private readonly cacheMs: number;
  private readonly now: () => number;
  private readonly views = new Map<string, { topology: Topology; readAt: number }>();

  constructor(store: Pick<TopologyStore, "read">, options: PrimaryResolverOptions = {}) {
    this.store = store;
    this.cacheMs = options.cacheMs ?? 1000;
    this.now = options.now ?? Date.now;
  }

  /** The writable primary of `shard`, or undefined while there is none. */
  async resolve(shard: string): Promise<PrimaryEndpoint | undefined> {
    const cached = this.views.get(shard);
    const topology =
      cached && this.now() - cached.readAt < this.cacheMs ? cached.topology : await this.refresh(shard);
    return topology ? endpointOf(topology) : undefined;
  }

  /** Drops the cache age for `shard` (e.g. after a write failed with READONLY) and reads again. */
  async refresh(shard: string): Promise<Topology | undefined> {
    const read = await this.store.read(shard);
    const seen = this.views.get(shard)?.topology;
    const next = seen && read && read.epoch < seen.epoch ? seen : (read ?? seen);
    if (next) this.views.set(shard, { topology: next, readAt: this.now() });
    return next;
  }

  /** Highest epoch seen for `shard` (monotonic). */
  epochOf(shard: string): number | undefined {
    return this.views.get(shard)?.topology.epoch;
  }
}

/**
 * The primary a topology names, when the shard is serving (online or paused for maintenance), or
 * when a change has confirmed its target (phase `repoint` or `cleanup`: PROMOTE applied and the
 * target's own heartbeat observed as primary at the change's epoch): from then on the change is
 * only tidied up, and clients need not wait for that to take writes to the new primary.
 */
export function endpointOf(topology: Topology): PrimaryEndpoint | undefined {
  const failover = topology.failover;
  if (
    topology.status === "failing_over" &&
    failover !== undefined &&
    (topology.phase === "repoint" || topology.phase === "cleanup")
  ) {
    return {
      shard: topology.shard,
      epoch: topology.epoch,
      nodeId: failover.new_primary_node_id,
      address: failover.new_primary_address,
    };
  }
  if (topology.status !== "online" && topology.status !== "paused") return undefined;
  if (!topology.primary_node_id || !topology.primary_address) return undefined;
  return {
    shard: topology.shard,
    epoch: topology.epoch,
    nodeId: topology.primary_node_id,
    address: topology.primary_address,
  };
}
