import { planTarget } from "../core/continuation.ts";
import type { Command, Topology } from "../core/model.ts";
import type { ReceivedCommand } from "../core/ports.ts";

/**
 * What to do with one received message, decided before anything touches the database:
 * - apply: run it;
 * - ignore: stale or duplicate, as a controller's late or repeated send is; delete it with a log
 *   line (it must never run again);
 * - refuse: well-formed but not what any controller sends for the topology as it is (an epoch
 *   above the topology's, a target it does not name, no switchover for a pause, a time in the
 *   future): forged or misdirected. Deleted with a warning that quotes it, so it can never fit a
 *   later topology either, and nothing of it is kept (no epoch, no id);
 * - reject: invalid; leave it, so that after maxReceiveCount it lands in the dead-letter queue
 *   where an operator can read it.
 */
export type Screening =
  | { readonly action: "apply"; readonly command: Command }
  | { readonly action: "ignore"; readonly command: Command; readonly reason: string }
  | { readonly action: "refuse"; readonly command: Command; readonly reason: string }
  | { readonly action: "reject"; readonly reason: string };

export interface ScreenContext {
  readonly shard: string;
  readonly nodeId: string;
  readonly address: string;
  readonly highestEpoch: number;
  readonly hasApplied: (commandId: string) => boolean;
  /**
   * The topology read (strongly consistent) just before screening; undefined when the shard has
   * none. Every command runs only when it fits it: its epoch is the topology's and its target the
   * one the topology names.
   */
  readonly topology: Topology | undefined;
  /** ms on the AWS-aligned clock, as the controller stamps `issued_at`. */
  readonly now: number;
}

/**
 * How far in the future a command's `issued_at` may be. Controller and agents stamp with the
 * AWS-aligned clock (docs/coordination.md#clocks: within 1.5 s of each other), so a minute is
 * slack for a bad offset measurement, not a window for a post-dated command.
 */
export const MAX_ISSUED_AHEAD_MS = 60_000;

/**
 * The gates, in order. Malformed, misaddressed and self-replicating messages go to the dead-letter
 * queue; a duplicate or a stale epoch is ignored; then the command must fit the topology. Nothing
 * but a command that passed every gate raises `highest_epoch`, and it passes only at the
 * topology's own epoch (Guarantees 4 and 6: a command an agent obeys fits the topology).
 */
export function screenCommand(message: ReceivedCommand, context: ScreenContext): Screening {
  const command = message.command;
  if (command === undefined) {
    return { action: "reject", reason: `malformed command: ${message.error ?? "no command in the message"}` };
  }
  const id = command.command_id;
  if (command.shard !== context.shard) {
    return {
      action: "reject",
      reason: `command ${id} is for shard ${command.shard}, this node serves shard ${context.shard}`,
    };
  }
  if (
    command.type === "REPLICAOF" &&
    (command.primary?.node_id === context.nodeId || command.primary?.address === context.address)
  ) {
    return {
      action: "reject",
      reason: `command ${id} asks this node to replicate from itself (${command.primary?.node_id})`,
    };
  }
  if (command.issued_at > context.now + MAX_ISSUED_AHEAD_MS) {
    return {
      action: "refuse",
      command,
      reason: `command ${id} is issued at ${command.issued_at}, ${command.issued_at - context.now} ms in the future`,
    };
  }
  if (context.hasApplied(id)) {
    return { action: "ignore", command, reason: `command ${id} was already applied` };
  }
  if (command.epoch < context.highestEpoch) {
    return {
      action: "ignore",
      command,
      reason: `command ${id} has epoch ${command.epoch}, below the highest applied epoch ${context.highestEpoch}`,
    };
  }
  const topology = context.topology;
  const current = topology?.epoch ?? 0;
  const atEpoch =
    topology === undefined ? "the shard has no topology (epoch 0)" : `the topology is at epoch ${current}`;
  if (command.epoch > current) {
    // A controller bumps the topology's epoch before it sends (strongly consistent both ways): an
    // epoch above it was never sent by one, and must never become this node's highest epoch.
    return { action: "refuse", command, reason: `command ${id} has epoch ${command.epoch}, ${atEpoch}` };
  }
  if (command.epoch < current) {
    // A controller paused past its lease sends the plan it had: every change of plan moves the epoch.
    return { action: "ignore", command, reason: `command ${id} has epoch ${command.epoch}, ${atEpoch}` };
  }
  const misfit = targetMisfit(command, context);
  if (misfit !== undefined) return { action: "refuse", command, reason: `command ${id} ${misfit}` };
  if (
    (command.type === "PAUSE_WRITES" || command.type === "REPORT") &&
    command.issued_at + (command.timeout_ms ?? 0) <= context.now
  ) {
    return {
      action: "ignore",
      command,
      reason: `command ${id} expired ${context.now - command.issued_at - (command.timeout_ms ?? 0)} ms ago (issued at ${command.issued_at} for ${command.timeout_ms} ms)`,
    };
  }
  return { action: "apply", command };
}

/**
 * Why a command at the topology's epoch is not one the controller sends for it, or undefined
 * when it is: PROMOTE goes to the target of a change under way, REPLICAOF names the node the
 * topology names (the plan's target while failing over, else its primary) at its address,
 * PAUSE_WRITES goes to the old primary of a switchover under way. REPORT changes nothing in the
 * database: its epoch suffices.
 */
function targetMisfit(command: Command, context: ScreenContext): string | undefined {
  const topology = context.topology;
  const epoch = topology?.epoch ?? 0;
  const target = topology === undefined ? undefined : planTarget(topology);
  switch (command.type) {
    case "PROMOTE":
      if (target !== context.nodeId) {
        return `names ${context.nodeId} as primary, the topology names ${target ?? "none"} at epoch ${epoch}`;
      }
      // A change is confirmed only once its PROMOTE was applied (and its id recorded), so after it a
      // PROMOTE with another id is a replay; obeyed, it would close writes for a promotion's fence window.
      return topology?.status === "failing_over"
        ? undefined
        : `promotes ${context.nodeId}, but no change to it is under way (the topology is ${topology?.status ?? "absent"} at epoch ${epoch})`;
    case "REPLICAOF": {
      const named = command.primary?.node_id;
      if (named !== target)
        return `names ${named} as primary, the topology names ${target ?? "none"} at epoch ${epoch}`;
      const address = topology === undefined ? undefined : planAddress(topology);
      return command.primary?.address === address
        ? undefined
        : `names ${named} at ${command.primary?.address}, the topology has it at ${address ?? "no address"} at epoch ${epoch}`;
    }
    case "PAUSE_WRITES": {
      const failover = topology?.status === "failing_over" ? topology.failover : undefined;
      return failover?.kind === "switchover" && failover.old_primary_node_id === context.nodeId
        ? undefined
        : `pauses writes, but the topology has no switchover away from ${context.nodeId} at epoch ${epoch}`;
    }
    case "REPORT":
      return undefined;
  }
}

/** The address of the node `planTarget` names. */
function planAddress(topology: Topology): string | undefined {
  return topology.status === "failing_over"
    ? topology.failover?.new_primary_address
    : topology.primary_address;
}
