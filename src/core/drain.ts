import type { FailoverConfig } from "./config.ts";
import { isAlive, isReportCurrent } from "./decide/view.ts";
import type { Topology } from "./model.ts";
import type { ShardSnapshot } from "./ports.ts";

/**
 * Node maintenance, pure: which nodes an operator drained (`shardguard drain`), what a drain or
 * an undrain request does, and how the decision core sees a drained node.
 *
 * A drained node keeps replicating and stays a member of the primary's replica set (the write
 * guard counts it like any replica: it acknowledges, so it could stand in for a member), but it is
 * never promoted: every ranking sees it at priority 0. That keeps priority 0's safety too: a
 * failover waits rather than promote a node behind a drained one that alone holds acknowledged
 * writes (gate `priority_zero_ahead`), the rule that guards every write `WAIT 1` confirmed.
 */

/** The nodes drained in `topology`, sorted (none when absent). */
export function drainedOf(topology: Topology | undefined): readonly string[] {
  return topology?.drained ?? [];
}

/**
 * The snapshot as the decision core ranks it: each drained node's heartbeat at priority 0. The same
 * object when nothing is drained.
 */
export function withDrainedNeverPromoted(snapshot: ShardSnapshot): ShardSnapshot {
  const drained = drainedOf(snapshot.topology);
  if (drained.length === 0) return snapshot;
  return {
    ...snapshot,
    nodes: snapshot.nodes.map((node) =>
      drained.includes(node.node_id) && node.priority !== 0 ? { ...node, priority: 0 } : node,
    ),
  };
}

export type DrainPlan =
  | { readonly kind: "refused"; readonly reason: string }
  /** Already drained: nothing to change. */
  | { readonly kind: "unchanged"; readonly reason: string }
  /** The node is the primary: a switchover away from it first, to `to` (undefined: the best eligible). */
  | { readonly kind: "switchover_first"; readonly reason: string }
  | { readonly kind: "drain"; readonly drained: readonly string[]; readonly reason: string };

/**
 * Plans `shardguard drain` of `node`: refused for a node the shard does not know, a shard with no
 * topology, not online or paused (a failover or bring-online under way, offline), or when no
 * other node could be promoted afterwards (it would leave the shard without a failover target).
 * A primary is switched away from first (zero-loss switchover), then drained.
 */
export function planDrain(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  node: string,
): DrainPlan {
  const topology = snapshot.topology;
  if (topology === undefined) return { kind: "refused", reason: "the shard has no topology yet" };
  const known = snapshot.nodes.some((heartbeat) => heartbeat.node_id === node);
  if (!known) {
    const ids = snapshot.nodes.map((heartbeat) => heartbeat.node_id).sort();
    return {
      kind: "refused",
      reason: `unknown node ${node}: shard ${topology.shard} has ${ids.length === 0 ? "no nodes" : ids.join(", ")}`,
    };
  }
  if (topology.status !== "online" && topology.status !== "paused") {
    return {
      kind: "refused",
      reason: `the shard is ${topology.status}${topology.status === "failing_over" ? ` (epoch ${topology.epoch}, phase ${topology.phase ?? "unknown"})` : ""}; drain after it is online`,
    };
  }
  const drained = drainedOf(topology);
  if (drained.includes(node)) return { kind: "unchanged", reason: `${node} is already drained` };
  const primary = topology.primary_node_id;
  const left = snapshot.nodes.filter(
    (heartbeat) =>
      heartbeat.node_id !== node &&
      heartbeat.node_id !== primary &&
      !drained.includes(heartbeat.node_id) &&
      heartbeat.priority > 0 &&
      heartbeat.db_status === "up" &&
      // A quiet replica (written at its keepalive) counts while its report stands: a failover
      // would ask it to report, as a switchover does.
      (isAlive(heartbeat, config, now) || isReportCurrent(heartbeat, config, now)),
  );
  // A primary being drained hands over to one of `left`, which then leaves one fewer.
  const needed = node === primary ? 2 : 1;
  if (left.length < needed) {
    const others = left.map((heartbeat) => heartbeat.node_id);
    return {
      kind: "refused",
      reason:
        `draining ${node} would leave ${node === primary ? "no replica to fail over to after the switchover away from it" : "no node to fail over to"}` +
        ` (eligible besides ${node === primary ? "it" : `the primary ${primary ?? "(none)"}`}: ${others.length === 0 ? "none" : others.join(", ")}` +
        `${drained.length > 0 ? `; drained: ${drained.join(", ")}` : ""})`,
    };
  }
  if (node === primary) {
    return { kind: "switchover_first", reason: `${node} is the primary: switching over away from it first` };
  }
  return {
    kind: "drain",
    drained: [...drained, node].sort(),
    reason: `${node} drained: never promoted until shardguard undrain (it keeps replicating)`,
  };
}

/** Plans `shardguard undrain` of `node`: always allowed on a drained node; a no-op otherwise. */
export function planUndrain(topology: Topology | undefined, node: string): DrainPlan {
  if (topology === undefined) return { kind: "refused", reason: "the shard has no topology yet" };
  const drained = drainedOf(topology);
  if (!drained.includes(node)) return { kind: "unchanged", reason: `${node} is not drained` };
  return {
    kind: "drain",
    drained: drained.filter((id) => id !== node),
    reason: `${node} undrained: eligible for promotion again`,
  };
}
