import { ShardguardError } from "../errors.ts";
import type { Topology } from "../model.ts";
import type { Decision } from "./decision.ts";
import { firstGate, type Gate } from "./gate.ts";
import type { ShardView } from "./view.ts";

/** A shard in `failing_over` as its gates see it. */
export interface FailingOverView extends ShardView {
  readonly topology: Topology;
}

function inProgress(topology: Topology): string {
  return `${topology.failover?.kind} to ${topology.failover?.new_primary_node_id}`;
}

/**
 * The wait and refusal rules of a shard failing over, in order (docs/safety.md). Cool-down does
 * not stop it: an interrupted failover must finish.
 */
export const FAILING_OVER_GATES: readonly Gate<FailingOverView>[] = [
  {
    name: "failover_state_missing",
    code: "inconsistent_topology",
    invariant: [4],
    primaryStale: false,
    test: ({ topology }) =>
      topology.failover === undefined
        ? "shard is failing_over but the topology holds no failover state"
        : undefined,
  },
  {
    name: "lock_held_continuing",
    code: "locked",
    invariant: [4],
    primaryStale: false,
    test: ({ topology, locked }) =>
      locked
        ? `${inProgress(topology)} in progress at epoch ${topology.epoch}` +
          ` (phase ${topology.phase ?? "unknown"}); another controller holds the lock`
        : undefined,
  },
];

/** A change left in `failing_over` by a controller that stopped: continue it from its stored phase. */
export function decideFailingOver(view: ShardView, topology: Topology): Decision {
  const stopped = firstGate(FAILING_OVER_GATES, { ...view, topology });
  if (stopped !== undefined) return stopped;
  // Gate failover_state_missing lets no topology without a failover state through.
  if (topology.failover === undefined)
    throw new ShardguardError("failing_over shard without a failover state passed every gate");
  return {
    kind: "continue_failover",
    epoch: topology.epoch,
    phase: topology.phase,
    failover: topology.failover,
    reason:
      `${inProgress(topology)} at epoch ${topology.epoch} stopped` +
      ` in phase ${topology.phase ?? "unknown"} and its lock is free; continuing it`,
  };
}
