import { FAILOVER_PHASES, type Role, type Topology } from "../core/model.ts";

/**
 * Pure fencing rules: who the topology says the primary is, what this node must do about it,
 * and when a primary cut off from the coordination store must stop taking writes.
 */

export interface PrimaryRef {
  readonly node_id: string;
  readonly address: string;
}

const PROMOTE_PHASE = FAILOVER_PHASES.indexOf("promote");

/**
 * The primary the topology stands for. Once a failover has reached `promote` (the point of no
 * return) its target is the primary even before the controller commits it; before that the
 * failover may still abort, so the committed primary stands.
 */
export function topologyPrimary(topology: Topology): PrimaryRef | undefined {
  const failover = topology.failover;
  if (
    topology.status === "failing_over" &&
    failover !== undefined &&
    topology.phase !== undefined &&
    FAILOVER_PHASES.indexOf(topology.phase) >= PROMOTE_PHASE
  ) {
    return { node_id: failover.new_primary_node_id, address: failover.new_primary_address };
  }
  if (topology.primary_node_id === undefined || topology.primary_address === undefined) return undefined;
  return { node_id: topology.primary_node_id, address: topology.primary_address };
}

/** What this node knows about itself when it compares with the topology. */
export interface LocalView {
  readonly nodeId: string;
  readonly role: Role;
  /** host:port of the primary a replica follows (as set with REPLICAOF). */
  readonly replicatingFrom: string | undefined;
  readonly highestEpoch: number;
  /** Epoch of the PROMOTE command that made this node primary, if one did. */
  readonly promotedEpoch: number | undefined;
  /**
   * Set when the replica is parked (`REPLICAOF 127.0.0.1 1`, src/agent/primary-probe.ts): `from`
   * is the primary it was parked from, undefined when this agent does not know it (the database
   * was parked before this agent process started).
   */
  readonly parked?: { readonly from: string | undefined };
  /**
   * The address the replica replicates from is a node of the shard (a heartbeat names it). At its
   * own epoch a replica is repointed only away from such a node: an address no node reports (a
   * proxy, a hostname for the primary) is the operator's and is left alone.
   */
  readonly followsShardNode?: boolean;
}

export type TopologyVerdict =
  | {
      readonly kind: "keep";
      /** True when nothing in the topology contradicts this node serving as primary. */
      readonly primaryConfirmed: boolean;
      readonly reason: string;
      /** The node id the topology gives to this node's own address, when it is not this agent's. */
      readonly conflict?: string;
    }
  | { readonly kind: "demote"; readonly target: PrimaryRef; readonly epoch: number; readonly reason: string }
  | {
      readonly kind: "repoint";
      readonly target: PrimaryRef;
      readonly epoch: number;
      readonly reason: string;
    };

/**
 * Compares the node with the topology. A primary that the topology does not name steps down
 * (redis issue 9049: a returning old primary must never serve as a second primary) when the
 * topology is newer than anything it applied, or as new but not won by a PROMOTE at that epoch
 * (two primaries of a new shard: the one the topology adopted stays). A replica follows a
 * newer topology's primary once; at its own epoch it follows the primary of an online topology
 * too, when its database replicates from another address (restarted with a config file's
 * `replicaof` of a node that is a replica now, an operator's REPLICAOF): a replica chained behind
 * another is outside every replica set and never repointed by the controller. Not while a
 * failover of that epoch may still change its target (`failing_over`), nor when the replica was
 * parked from a primary this agent does not know (the probe that would unpark it knows nothing of
 * the lineage it holds). A topology older than the node's own epoch is ignored: the controller
 * bumps the epoch before it sends a command, so the node is ahead only while the controller's
 * write is on its way.
 */
export function assessTopology(topology: Topology | undefined, view: LocalView): TopologyVerdict {
  if (topology === undefined) {
    return {
      kind: "keep",
      primaryConfirmed: true,
      reason: "no topology yet: the controller adopts the shard's only primary",
    };
  }
  const primary = topologyPrimary(topology);
  if (primary === undefined) {
    // An offline shard has no confirmed primary: the controller may bring another node online,
    // and whatever this node accepted meanwhile would be discarded when it steps down. A write
    // fence stays until the topology names this node again.
    return {
      kind: "keep",
      primaryConfirmed: false,
      reason: `topology at epoch ${topology.epoch} (${topology.status}) names no primary`,
    };
  }
  if (primary.node_id === view.nodeId) {
    const elsewhere =
      topology.status === "failing_over" && topology.failover !== undefined
        ? topology.failover.new_primary_node_id
        : view.nodeId;
    if (elsewhere !== view.nodeId) {
      // Still the committed primary, but a failover away from it may yet promote its target.
      return {
        kind: "keep",
        primaryConfirmed: false,
        reason: `failover to ${elsewhere} in progress at epoch ${topology.epoch} (phase ${topology.phase ?? "unknown"})`,
      };
    }
    if (
      topology.status === "failing_over" &&
      topology.primary_node_id !== view.nodeId &&
      view.promotedEpoch !== topology.epoch
    ) {
      // Named only as the target of a change past its point of no return, with no PROMOTE of that
      // epoch applied here: a database that answers as a primary became one by itself (a replica
      // restarted from its RDB without \`replicaof\` in its config, an operator's REPLICAOF NO ONE).
      // It serves only once its PROMOTE runs: the promotion's fence window, and a controller that
      // knows of it (simulator seed 221485: the target, its PROMOTE never sent, served 15 s of
      // writes at its old epoch; the controller, seeing no confirmation, brought the shard back on
      // another node and 12 acknowledged writes were lost).
      return {
        kind: "keep",
        primaryConfirmed: false,
        reason: `target of the ${topology.failover?.kind ?? "change"} at epoch ${topology.epoch}, its PROMOTE not applied here: a primary only once it is`,
      };
    }
    return {
      kind: "keep",
      primaryConfirmed: true,
      reason: `topology at epoch ${topology.epoch} names this node primary`,
    };
  }
  if (topology.epoch < view.highestEpoch) {
    return {
      kind: "keep",
      primaryConfirmed: view.role === "primary",
      reason: `topology epoch ${topology.epoch} is behind this node's epoch ${view.highestEpoch}; waiting for the controller`,
    };
  }
  if (view.role === "primary") {
    const promotedHere = topology.epoch === view.highestEpoch && view.promotedEpoch === view.highestEpoch;
    if (promotedHere) {
      return {
        kind: "keep",
        primaryConfirmed: true,
        reason: `promoted at epoch ${view.highestEpoch}; the topology does not name this node yet`,
      };
    }
    return {
      kind: "demote",
      target: primary,
      epoch: topology.epoch,
      reason:
        `topology at epoch ${topology.epoch} names ${primary.node_id} (${primary.address}) primary, ` +
        `not this node (epoch ${view.highestEpoch}): becoming its replica`,
    };
  }
  const keep = {
    kind: "keep",
    primaryConfirmed: false,
    reason: `replica of ${view.replicatingFrom ?? "nobody"}`,
  } as const;
  if (view.replicatingFrom === primary.address || topology.status === "paused") return keep;
  const repoint = (why: string): TopologyVerdict => ({
    kind: "repoint",
    target: primary,
    epoch: topology.epoch,
    reason:
      `topology at epoch ${topology.epoch} names ${primary.node_id} (${primary.address}) primary; ` +
      `this replica follows ${view.replicatingFrom ?? "nobody"} ${why}`,
  });
  if (topology.epoch > view.highestEpoch) return repoint(`at epoch ${view.highestEpoch}`);
  // The same epoch: only a committed topology names a primary that no failover of this epoch
  // may still change (a snapshot read before PROMOTE names the old primary).
  if (topology.status !== "online") return keep;
  if (view.parked === undefined && view.replicatingFrom !== undefined && view.followsShardNode !== true) {
    return {
      kind: "keep",
      primaryConfirmed: false,
      reason: `replica of ${view.replicatingFrom}, an address no node of the shard reports: left as set until a newer epoch`,
    };
  }
  if (view.parked !== undefined && view.parked.from === undefined) {
    return {
      kind: "keep",
      primaryConfirmed: false,
      reason: `parked from a primary this agent does not know; waiting for a newer epoch than ${topology.epoch}`,
    };
  }
  return repoint(`at the same epoch ${view.highestEpoch}`);
}

/** The two settings every fence changes (the operator's values are saved before). */
export const FENCING_CONFIG_KEYS = ["min-replicas-to-write", "min-replicas-max-lag"] as const;

/** Where a parked replica stands: the address it was parked from, at which epoch, and what its probe last found there. */
export interface ParkedView {
  readonly from: string | undefined;
  readonly atEpoch: number | undefined;
  /** The probe found the process at \`from\` not holding this replica's data (\`restarted\`). */
  readonly lacksData: boolean;
  /** The topology's status. */
  readonly status: string | undefined;
}

/**
 * A parked replica's repoint to the address it was parked from waits: for its own primary to come
 * back holding its data, or for a new decision (a newer, committed topology naming that address
 * again is followed; a failover still under way names the old primary until its point of no
 * return). Unless the probe found the process there lacking its data: the controller, which ranks
 * this replica's offset, does not choose that process over it, but an abandoned failover returns
 * the shard to its old primary under a new epoch, unjudged (simulator seed 150370: both replicas
 * followed a primary restarted from an older RDB and 200 acknowledged writes were lost).
 * The same holds for the step-down of a parked replica whose database restarted as a master (from
 * its RDB, the park not in its config): the restart gave it no primary holding its data.
 */
export function staysParked(
  verdict: TopologyVerdict,
  parked: ParkedView,
): verdict is Extract<TopologyVerdict, { kind: "repoint" | "demote" }> {
  if (verdict.kind === "keep" || verdict.target.address !== parked.from) return false;
  return verdict.epoch === parked.atEpoch || parked.status !== "online" || parked.lacksData;
}
