import type { Heartbeat } from "../model.ts";
import type { Decision } from "./decision.ts";
import { firstGate, type Gate } from "./gate.ts";
import { lineageOf, type ShardView } from "./view.ts";

/** A shard without a topology as its gates see it. */
export interface UninitializedView extends ShardView {
  /** The nodes that report themselves primary with a fresh heartbeat and their database up. */
  readonly primaries: readonly Heartbeat[];
}

/** The wait and refusal rules of a shard without a topology, in order (docs/safety.md). */
export const UNINITIALIZED_GATES: readonly Gate<UninitializedView>[] = [
  {
    name: "no_primary_reported",
    code: "no_topology",
    invariant: [5],
    primaryStale: false,
    test: (v) =>
      v.primaries.length === 0
        ? "no topology yet and no node reports itself primary with a fresh heartbeat"
        : undefined,
  },
  {
    name: "several_primaries",
    code: "ambiguous_primary",
    // Adopting one of several would leave the others writable.
    invariant: [2],
    primaryStale: false,
    test: (v) =>
      v.primaries.length > 1
        ? `no topology yet and several nodes report themselves primary: ${v.primaries.map((node) => node.node_id).join(", ")}`
        : undefined,
  },
  {
    name: "lock_held_uninitialized",
    code: "locked",
    invariant: [4],
    primaryStale: false,
    test: (v) => (v.locked ? "no topology yet; another controller holds the shard's lock" : undefined),
  },
];

/** No topology yet: adopt the one node that reports itself primary. */
export function decideUninitialized(view: ShardView): Decision {
  const primaries = view.nodes
    .filter(({ heartbeat, fresh }) => heartbeat.role === "primary" && heartbeat.db_status === "up" && fresh)
    .map((node) => node.heartbeat);
  const stopped = firstGate(UNINITIALIZED_GATES, { ...view, primaries });
  if (stopped !== undefined) return stopped;
  const [primary] = primaries as [Heartbeat];
  // The topology epoch must not start below an epoch an agent has already applied.
  const epoch = Math.max(0, ...view.snapshot.nodes.map((node) => node.epoch));
  return {
    kind: "initialize",
    primary: { node_id: primary.node_id, node_address: primary.node_address },
    epoch,
    lineage: lineageOf(primary),
    reason: `no topology yet; adopting ${primary.node_id}, the only node reporting itself primary`,
  };
}
