import type { FailoverConfig } from "./config.ts";
import { firstGate } from "./decide/gate.ts";
import { describeCandidates } from "./decide/pick-candidate.ts";
import { liveTargetAhead, RETARGET_GATES, type RetargetView, retargetView } from "./decide/retarget.ts";
import { isFresh, shardView } from "./decide/view.ts";
import { decide, isPastPointOfNoReturn, type NoActionCode } from "./decide.ts";
import { ShardguardError } from "./errors.ts";
import type { LineageLink } from "./identity.ts";
import type { Candidate, FailoverPhase, FailoverState, Lineage, Topology } from "./model.ts";
import type { ShardSnapshot } from "./ports.ts";

/**
 * What a controller does with a failover that another controller (or an earlier cycle) left in
 * `failing_over`: a pure function of the snapshot, the config and `now`, like `decide`.
 *
 * The rule that keeps stale orders harmless: **a new plan is a new epoch**. Only `continue`
 * keeps the stored epoch, and it keeps the stored plan too (same target, same commands, same
 * command ids). Every other answer changes the plan (another target, offline, back to the old
 * primary) and is written under epoch + 1, so an order issued under the old plan can never be
 * taken for the current one: agents obey a command only when its epoch and target match the
 * topology.
 */
export type Continuation =
  | {
      /** The stored plan holds: run its phases from `from`, at the stored epoch. */
      readonly kind: "continue";
      readonly from: "promote" | "repoint" | "cleanup";
      readonly reason: string;
    }
  | {
      /** Another target: the plan is replaced under epoch + 1 and its phases start at promote. */
      readonly kind: "replan";
      readonly failover: FailoverState;
      readonly reason: string;
    }
  | {
      /** Nobody can be promoted: offline under epoch + 1. */
      readonly kind: "offline";
      readonly oldPrimary: string | undefined;
      readonly candidates: readonly Candidate[];
      readonly lineage: Lineage | undefined;
      /**
       * The lineage history to record with the offline mark, when the failed target's promotion
       * adds a link to it (src/core/decide/retarget.ts \`promotedAncestry\`, simulator seed 72080).
       */
      readonly ancestry?: readonly LineageLink[];
      readonly reason: string;
    }
  | {
      /**
       * Past PROMOTE, another target would be chosen but a gate of RETARGET_GATES holds it (a
       * member unheard, a replica ahead): the plan stays as it is, at its epoch, and the next cycle
       * judges again. The controller asks \`awaiting\` nodes to report.
       */
      readonly kind: "wait";
      readonly code: NoActionCode;
      readonly awaiting?: readonly string[];
      readonly reason: string;
    }
  | {
      /** Before PROMOTE, the change no longer holds: the previous state returns under epoch + 1. */
      readonly kind: "abandon";
      readonly reason: string;
    };

export interface ContinuationOptions {
  /** The confirm phase's timeout: a live target that has not confirmed after MAX_CONFIRM_ROUNDS of them is replaced. */
  readonly confirmTimeoutMs: number;
}

/** Confirm timeouts a live target gets before another node is promoted instead. */
export const MAX_CONFIRM_ROUNDS = 3;

/** The topology is `failing_over` but holds no plan: corrupt or hand-edited, never a lost lock. */
export class FailoverStateMissing extends ShardguardError {
  override name = "FailoverStateMissing";
}

/** The failover plan stored in a `failing_over` topology; throws FailoverStateMissing when absent. */
export function failoverStateOf(topology: Topology): FailoverState {
  if (topology.failover === undefined) {
    throw new FailoverStateMissing(
      `shard ${topology.shard} is ${topology.status} at epoch ${topology.epoch} (phase ${topology.phase ?? "none"}) but its topology holds no failover state`,
    );
  }
  return topology.failover;
}

/** The node a topology names for its epoch: the plan's target while failing over, else its primary. */
export function planTarget(topology: Topology): string | undefined {
  return topology.status === "failing_over"
    ? topology.failover?.new_primary_node_id
    : topology.primary_node_id;
}

/**
 * The promoted node's own heartbeat says primary at the epoch, fresh, from a database that answers
 * (\`db_status: up\`). A down report keeps the role, offset and lineage of the database's last answer
 * (heartbeat-report.ts \`downHeartbeat\`) and its \`last_updated\` stays fresh for a failure timeout
 * after that answer: a target that died, or restarted without its data and is fenced, after its
 * PROMOTE still reads "primary at the epoch, fresh" for up to that long, and confirming it would
 * name a primary that cannot serve and start the cool-down (simulator seed 282758: 30 s without a
 * writable primary). It is not confirmed; the continuation judges it not alive and retargets.
 */
export function targetConfirmed(
  snapshot: ShardSnapshot,
  target: string,
  epoch: number,
  config: FailoverConfig,
  now: number,
): boolean {
  const node = snapshot.nodes.find((candidate) => candidate.node_id === target);
  return (
    node !== undefined &&
    node.role === "primary" &&
    node.db_status === "up" &&
    node.epoch >= epoch &&
    isFresh(node, config, now)
  );
}

/** The shard as it was before the stored change began (what `decide` judged). */
export function topologyBefore(topology: Topology, state: FailoverState, now: number): Topology {
  const wasOffline = state.kind === "bring_online";
  return {
    shard: topology.shard,
    epoch: topology.epoch,
    status: wasOffline ? "offline" : "online",
    primary_node_id: wasOffline ? undefined : state.old_primary_node_id,
    primary_address: wasOffline ? undefined : topology.primary_address,
    updated_at: now,
    // The lineage the stored decision judged: for an offline shard its mark's; for an online one
    // what a demoted primary's replacement must hold when no follower says (online-view.ts
    // \`demotedLineage\`). Without it a demoted primary restarted empty, in a shard with no history
    // (its only primary the initial one), was judged by its own empty lineage: the parked holders
    // "foreign", the shard offline on it (simulator seed 171726, guarantee 1: 374 lost).
    lineage: state.lineage,
    // The old primaries still unfenced, online and offline alike (src/core/depose.ts \`deposedAfter\`).
    deposed: topology.deposed,
    // The shard's lineage history, recorded only when a change completes: what \`decide\` judged had
    // it. Without it a demoted primary restarted empty, no replica following it, was judged by its
    // own new lineage (online-view.ts \`historyTip\`): the parked replicas holding every write were
    // "foreign", the shard went offline on the empty lineage and came back on that node at offset 0
    // (simulator seed 420097, guarantee 1: 3,182 replica-acknowledged writes lost).
    ancestry: topology.ancestry,
    paused_reason: topology.paused_reason,
    cooldown_until: topology.cooldown_until,
  };
}

/**
 * Decides how to continue the change stored in `snapshot.topology` (which must be
 * `failing_over`):
 * - before PROMOTE (`locked`, `epoch_bumped`, `catch_up`): judged again as if the shard were
 *   still in its previous state. Same target: `continue` from promote; another target:
 *   `replan`; nobody eligible: `offline`; nothing to do any more, or an interrupted switchover:
 *   `abandon`.
 * - `repoint`/`cleanup`: `continue` there.
 * - `promote`/`confirm`: target confirmed: `continue` from repoint; target alive and not overdue
 *   (MAX_CONFIRM_ROUNDS confirm timeouts since the epoch was bumped), or alive within a confirm
 *   timeout of this plan's last PROMOTE (the start of its `confirm` phase): `continue` from promote
 *   (the same PROMOTE again); a live target holding more of the lineage than every other node
 *   gets its PROMOTE again too, overdue or not (rule \`live_target_ahead\`, guarantee 1: simulator
 *   seed 420290); otherwise `replan` to the best other eligible node, or `offline`.
 */
export function decideContinuation(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
  options: ContinuationOptions,
): Continuation {
  const topology = snapshot.topology;
  if (topology === undefined || topology.status !== "failing_over") {
    throw new FailoverStateMissing(
      `shard ${snapshot.shard} is not failing over (${topology ? `status ${topology.status}` : "no topology"})`,
    );
  }
  const state = failoverStateOf(topology);
  const phase: FailoverPhase | undefined = topology.phase;
  if (!isPastPointOfNoReturn(phase)) return reconsider(snapshot, topology, state, config, now);
  if (phase === "repoint" || phase === "cleanup") {
    return { kind: "continue", from: phase, reason: `continuing phase ${phase}` };
  }
  const target = state.new_primary_node_id;
  if (targetConfirmed(snapshot, target, topology.epoch, config, now)) {
    return {
      kind: "continue",
      from: "repoint",
      reason: `${target} confirmed as primary at epoch ${topology.epoch}`,
    };
  }
  const view = shardView(snapshot, config, now);
  const node = view.nodes.find((candidate) => candidate.heartbeat.node_id === target);
  const alive = node?.alive === true;
  const attemptStarted = state.phase_started.epoch_bumped ?? state.started_at;
  const overdue = now - attemptStarted > MAX_CONFIRM_ROUNDS * options.confirmTimeoutMs;
  // The last PROMOTE of this plan went out when its confirm phase was recorded (phases.ts
  // \`execute\`); a live target is not replaced before a confirm timeout since then, whatever the
  // time since the epoch bump: it may be applying it and taking acknowledged writes (simulator
  // seed 320092: the PROMOTE sent 42 s after the bump, the shard taken offline 24 ms after the
  // target applied it, and brought online on the old primary without what the target's replica
  // had acknowledged). A \`confirm\` start from an earlier plan (a replan keeps the timings) is older
  // than this plan's bump and does not count.
  const sentAt = state.phase_started.confirm;
  const justSent =
    sentAt !== undefined && sentAt >= attemptStarted && now - sentAt <= options.confirmTimeoutMs;
  if (alive && (!overdue || justSent)) {
    return { kind: "continue", from: "promote", reason: `${target} is alive; sending PROMOTE again` };
  }
  const v = retargetView(
    view,
    state,
    alive ? "did not confirm in time" : node ? "is no longer alive" : "has no heartbeat",
  );
  // Overdue or not, a live target holding more than every other node keeps the plan (guarantee 1).
  const kept = alive ? liveTargetAhead(v) : undefined;
  if (kept !== undefined && node !== undefined && node.heartbeat.epoch >= topology.epoch) {
    // Its report is at this epoch: it applied this plan's PROMOTE, and its agent ignores the same
    // command again (one id per epoch and node), so the plan's PROMOTE never promotes it twice. Its
    // promotion was undone since (its database restarted from an RDB as a replica): a plan of its
    // own under a new epoch sends a PROMOTE it applies (simulator seed 100696, guarantee 3: the plan
    // sent the ignored PROMOTE every cycle, \`failing_over\` for good).
    return {
      kind: "replan",
      failover: {
        ...state,
        reason: `${v.why}; promoting ${target} again under a new epoch (${state.reason})`,
      },
      reason: `${v.why}: it applied this epoch's PROMOTE and no longer answers as primary, and still holds the most; promoting it again under a new epoch`,
    };
  }
  if (kept !== undefined) return { kind: "continue", from: "promote", reason: kept };
  return retarget(v, state);
}

function reconsider(
  snapshot: ShardSnapshot,
  topology: Topology,
  state: FailoverState,
  config: FailoverConfig,
  now: number,
): Continuation {
  if (state.kind === "switchover") {
    return {
      kind: "abandon",
      reason: "resumed before PROMOTE and abandoned: an interrupted switchover is not resumed",
    };
  }
  const previous = topologyBefore(topology, state, now);
  const decision = decide({ ...snapshot, topology: previous, lock: undefined }, config, now);
  if (decision.kind === "failover" || decision.kind === "bring_online") {
    if (decision.target.node_id === state.new_primary_node_id) {
      return { kind: "continue", from: "promote", reason: `the plan still holds: ${decision.reason}` };
    }
    // The new decision says whether its target deposes the old primary first (src/core/depose.ts).
    const { depose: _previous, ...rest } = state;
    const depose = decision.kind === "bring_online" ? decision.depose : undefined;
    return {
      kind: "replan",
      failover: {
        ...rest,
        ...(depose === undefined
          ? {}
          : { depose: { node_id: depose.node_id, address: depose.node_address } }),
        new_primary_node_id: decision.target.node_id,
        new_primary_address: decision.target.node_address,
        candidates: [...decision.candidates],
        reason: `resumed before PROMOTE; ${decision.target.node_id} instead of ${state.new_primary_node_id}: ${decision.reason}`,
      },
      reason: `resumed before PROMOTE with another target: ${decision.reason}`,
    };
  }
  if (decision.kind === "mark_offline") {
    return {
      kind: "offline",
      oldPrimary: decision.oldPrimary,
      candidates: decision.candidates,
      lineage: decision.lineage,
      reason: decision.reason,
    };
  }
  // Nothing to do any more (the primary came back, quorum lost): PROMOTE was never sent.
  return { kind: "abandon", reason: `resumed before PROMOTE and abandoned: ${decision.reason}` };
}

/**
 * The promoted node died or never confirmed. PROMOTE may still reach it later, so the
 * replacement is a new plan under a further epoch: the failed target, if it ever applies the
 * old PROMOTE, finds the topology at a newer epoch naming another node and drops it. A deposing
 * plan stays deposing: the new target too must fence the old primary first, or not promote.
 */
function retarget(v: RetargetView, state: FailoverState): Continuation {
  const stopped = firstGate(RETARGET_GATES, v);
  if (stopped?.kind === "none") {
    return {
      kind: "wait",
      code: stopped.code,
      ...(stopped.awaiting !== undefined ? { awaiting: stopped.awaiting } : {}),
      reason: stopped.reason,
    };
  }
  const { candidates, lineage, why } = v;
  if (v.target === undefined) {
    const reason = `${why} and no other node is eligible (${candidates.length === 0 ? "none" : describeCandidates(candidates)})`;
    const link = v.promotedAncestry?.at(-1);
    return {
      kind: "offline",
      oldPrimary: state.old_primary_node_id,
      candidates,
      lineage,
      ...(v.promotedAncestry === undefined || link === undefined
        ? { reason }
        : {
            // Rule 7's ancestor last resort judges the nodes on the plan's lineage through it.
            ancestry: v.promotedAncestry,
            reason: `${reason}; recorded in the lineage history that ${link.by} continues ${link.repl_id} up to ${link.until} (${state.new_primary_node_id}'s promotion)`,
          }),
    };
  }
  const { best } = v.target;
  return {
    kind: "replan",
    failover: {
      ...state,
      new_primary_node_id: best.node_id,
      new_primary_address: best.node_address,
      candidates: [...candidates],
      reason: `${why}; promoting ${best.node_id} instead (${state.reason})`,
    },
    reason: `${why}; promoting ${best.node_id} instead`,
  };
}
