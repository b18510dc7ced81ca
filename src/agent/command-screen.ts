import { planTarget } from "../core/continuation.ts";
import type { Command, Topology } from "../core/model.ts";
import type { ReceivedCommand } from "../core/ports.ts";

/**
 * What to do with one received message, decided before anything touches the database:
 * - apply: run it;
 * - ignore: stale or duplicate; delete it with a log line (it must never run again);
 * - reject: invalid; leave it, so that after maxReceiveCount it lands in the dead-letter queue
 *   where an operator can read it.
 */
export type Screening =
  | { readonly action: "apply"; readonly command: Command }
  | { readonly action: "ignore"; readonly command: Command; readonly reason: string }
  | { readonly action: "reject"; readonly reason: string };

export interface ScreenContext {
  readonly shard: string;
  readonly nodeId: string;
  readonly address: string;
  readonly highestEpoch: number;
  readonly hasApplied: (commandId: string) => boolean;
  /**
   * The topology read (strongly consistent) just before screening; required for PROMOTE and
   * REPLICAOF, which run only when their epoch and target match it.
   */
  readonly topology?: Topology | undefined;
}

/** The commands that change who is primary: obeyed only when epoch and target match the topology. */
export function needsTopology(command: Command | undefined): boolean {
  return command?.type === "PROMOTE" || command?.type === "REPLICAOF";
}

export function screenCommand(message: ReceivedCommand, context: ScreenContext): Screening {
  const command = message.command;
  if (command === undefined) {
    return { action: "reject", reason: `malformed command: ${message.error ?? "no command in the message"}` };
  }
  if (command.shard !== context.shard) {
    return {
      action: "reject",
      reason: `command ${command.command_id} is for shard ${command.shard}, this node serves shard ${context.shard}`,
    };
  }
  if (
    command.type === "REPLICAOF" &&
    (command.primary?.node_id === context.nodeId || command.primary?.address === context.address)
  ) {
    return {
      action: "reject",
      reason: `command ${command.command_id} asks this node to replicate from itself (${command.primary?.node_id})`,
    };
  }
  if (context.hasApplied(command.command_id)) {
    return { action: "ignore", command, reason: `command ${command.command_id} was already applied` };
  }
  if (command.epoch < context.highestEpoch) {
    return {
      action: "ignore",
      command,
      reason: `command ${command.command_id} has epoch ${command.epoch}, below the highest applied epoch ${context.highestEpoch}`,
    };
  }
  if (needsTopology(command)) {
    const mismatch = topologyMismatch(command, context);
    if (mismatch) return { action: "ignore", command, reason: `command ${command.command_id} ${mismatch}` };
  }
  return { action: "apply", command };
}

/**
 * Why a PROMOTE/REPLICAOF does not match the topology, or undefined when it does. A controller
 * that was paused past its lease may still send what it planned; every change of plan moves the
 * epoch, so its orders carry an epoch the topology has left, or name a node the topology does
 * not name for that epoch.
 */
function topologyMismatch(command: Command, context: ScreenContext): string | undefined {
  const topology = context.topology;
  // No topology at all: no controller manages the shard yet, so no controller can have sent it
  // (a controller writes the topology before any command); an operator's command by hand runs.
  if (topology === undefined) return undefined;
  if (command.epoch !== topology.epoch) {
    return `has epoch ${command.epoch}, the topology is at epoch ${topology.epoch}`;
  }
  const target = planTarget(topology);
  const named = command.type === "PROMOTE" ? context.nodeId : command.primary?.node_id;
  if (named !== target) {
    return `names ${named} as primary, the topology names ${target ?? "none"} at epoch ${topology.epoch}`;
  }
  return undefined;
}
