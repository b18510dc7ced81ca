import type { FailoverConfig } from "../config.ts";
import { drainedOf, withDrainedNeverPromoted } from "../drain.ts";
import type { Candidate, Lineage } from "../model.ts";
import type { ShardSnapshot } from "../ports.ts";
import { type NodeRef, refOf } from "./decision.ts";
import { pickCandidates } from "./pick-candidate.ts";
import { guardMembers, isFresh, lineageOf, lockBlocks } from "./view.ts";

export type SwitchoverPlan =
  | { readonly kind: "refused"; readonly reason: string }
  | {
      readonly kind: "switchover";
      readonly epoch: number;
      readonly oldPrimary: NodeRef;
      readonly target: NodeRef;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage;
      readonly reason: string;
    };

/**
 * Plans an operator-requested switchover: the primary must be alive (writes are paused on it
 * while the target catches up), the target eligible by the same rules as a failover. Cool-down
 * does not apply (an operator asked); a paused shard may be switched over (maintenance).
 */
export function planSwitchover(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  request: { readonly to?: string; readonly lockOwner?: string },
): SwitchoverPlan {
  const topology = snapshot.topology;
  if (topology === undefined) return { kind: "refused", reason: "the shard has no topology yet" };
  if (topology.status !== "online" && topology.status !== "paused") {
    return { kind: "refused", reason: `the shard is ${topology.status}; a switchover needs a live primary` };
  }
  if (lockBlocks(snapshot, now, { lockOwner: request.lockOwner })) {
    return { kind: "refused", reason: "another controller holds the shard's lock" };
  }
  const primary = snapshot.nodes.find((node) => node.node_id === topology.primary_node_id);
  if (primary === undefined || !isFresh(primary, config, now) || primary.db_status === "down") {
    return { kind: "refused", reason: `primary ${topology.primary_node_id ?? "(none)"} is not alive` };
  }
  const lineage = lineageOf(primary);
  const drained = drainedOf(topology);
  if (request.to !== undefined && drained.includes(request.to)) {
    return { kind: "refused", reason: `${request.to} is drained; shardguard undrain it first` };
  }
  const candidates = pickCandidates(withDrainedNeverPromoted(snapshot).nodes, lineage, config, now, {
    exclude: primary.node_id,
    members: guardMembers(snapshot, primary.node_id),
    // The target catches up to the old primary before PROMOTE: the preferred node loses nothing.
    order: "priority",
  });
  const chosen =
    request.to === undefined
      ? candidates[0]
      : candidates.find((candidate) => candidate.node_id === request.to);
  if (request.to === primary.node_id) {
    return { kind: "refused", reason: `${request.to} is already the primary` };
  }
  if (chosen === undefined) {
    return {
      kind: "refused",
      reason:
        request.to === undefined ? "no other node reports a heartbeat" : `${request.to} has no heartbeat`,
    };
  }
  if (!chosen.eligible) {
    return { kind: "refused", reason: `${chosen.node_id} is not eligible: ${chosen.reason}` };
  }
  return {
    kind: "switchover",
    epoch: topology.epoch,
    oldPrimary: { node_id: primary.node_id, node_address: primary.node_address },
    target: refOf(chosen),
    candidates,
    lineage,
    reason:
      `switchover requested from ${primary.node_id} to ${chosen.node_id}` +
      (request.to === undefined ? " (best eligible replica)" : ""),
  };
}
