import type { FailoverConfig } from "../config.ts";
import { drainedOf } from "../drain.ts";
import type { Heartbeat, Lineage, Topology } from "../model.ts";
import type { ShardSnapshot } from "../ports.ts";
import { firstGate, type Gate } from "./gate.ts";
import { unfencedOldPrimaryOf } from "./offline-view.ts";
import { dataLineageOf, describeHeartbeatAge, isAlive, type ShardView, shardView } from "./view.ts";

/**
 * \`shardguard recover --to NODE\`: the operator's way out of an offline shard no node will bring
 * back by itself. The operator chooses whose data to keep; the controller still refuses a choice
 * that would make two writable primaries (guarantee 2), whatever the reason given.
 */

/** An offline shard as the recover gates see it, with the node the operator named. */
export interface RecoverView extends ShardView {
  readonly topology: Topology;
  readonly node: Heartbeat;
}

export type RecoverPlan =
  | { readonly kind: "refused"; readonly reason: string }
  | { readonly kind: "recover"; readonly epoch: number; readonly lineage: Lineage; readonly reason: string };

/** The refusal rules of \`shardguard recover\`, in order (docs/safety.md). */
export const RECOVER_GATES: readonly Gate<RecoverView>[] = [
  {
    name: "recover_unfenced_old_primary",
    code: "offline_no_candidate",
    // Recover sets the shard's lineage to the node's: the offline gate would then compare the
    // node with itself. The old primary may still serve: a member's detaching fences it against
    // the members only (its guard counts any replica that attaches), so the node brought online
    // also fences it directly (\`topology.deposed\`, src/core/depose.ts; nemesis seed 6303).
    invariant: [2],
    primaryStale: false,
    test: (v) => {
      const old = unfencedOldPrimaryOf(v, v.topology.lineage?.node_id, v.node.node_id);
      if (old === undefined) return undefined;
      return (
        `${v.node.node_id} is not in ${old.node_id}'s replica set, and ${old.node_id}'s agent is not heard ` +
        `(${describeHeartbeatAge(old, v.now, "ago")}) nor reported a crash: its database may still take writes ` +
        `unfenced, and bringing the shard online on ${v.node.node_id} would make two writable primaries; ` +
        `stop ${old.node_id}'s database (its agent then reports the crash), bring its agent back, or recover on a member of its set`
      );
    },
  },
];

/**
 * Plans \`shardguard recover\`: refused unless the shard is offline, the node alive and allowed to
 * be promoted, and no gate of RECOVER_GATES fires. The shard's lineage becomes the node's data
 * (\`dataLineageOf\`: a database restarted from its RDB holds its earlier one), still naming the old
 * primary, so that the offline gates keep judging membership against it.
 */
export function planRecover(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  request: { readonly to: string },
): RecoverPlan {
  const topology = snapshot.topology;
  if (topology === undefined) return { kind: "refused", reason: "the shard has no topology yet" };
  if (topology.status !== "offline") {
    return {
      kind: "refused",
      reason: `the shard is ${topology.status}; only an offline shard is recovered (use switchover)`,
    };
  }
  const node = snapshot.nodes.find((heartbeat) => heartbeat.node_id === request.to);
  if (node === undefined) return { kind: "refused", reason: `${request.to} has no heartbeat` };
  if (!isAlive(node, config, now)) {
    return {
      kind: "refused",
      reason: `${request.to} is not alive (heartbeat ${describeHeartbeatAge(node, now)}, database ${node.db_status})`,
    };
  }
  if (node.priority === 0) return { kind: "refused", reason: `${request.to} has priority 0 (never promote)` };
  // A drained node ranks as priority 0: the shard would go on refusing it after the recover
  // (nemesis seed 5102: "recover --to" a drained sole holder accepted, then never brought online).
  if (drainedOf(topology).includes(request.to)) {
    return {
      kind: "refused",
      reason: `${request.to} is drained (never promoted until undrained): run \`shardguard undrain --shard ${topology.shard} --node ${request.to}\` first`,
    };
  }
  const stopped = firstGate(RECOVER_GATES, { ...shardView(snapshot, config, now), topology, node });
  if (stopped !== undefined) return { kind: "refused", reason: stopped.reason };
  const data = dataLineageOf(node);
  const lineage = { ...data, node_id: topology.lineage?.node_id ?? node.node_id };
  return {
    kind: "recover",
    epoch: topology.epoch,
    lineage,
    reason: `lineage set to ${node.node_id}'s (${data.repl_id} at ${data.last_txn_id})`,
  };
}
