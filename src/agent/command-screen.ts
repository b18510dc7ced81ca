import type { Command } from "../core/model.ts";
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
  return { action: "apply", command };
}
