import { errorMessage } from "../core/errors.ts";
import type { Command, Topology } from "../core/model.ts";
import type { ReceivedCommand } from "../core/ports.ts";
import { Backoff, sleep } from "./backoff.ts";
import { screenCommand } from "./command-screen.ts";
import type { AgentContext } from "./context.ts";
import { runCycle } from "./heartbeat-loop.ts";
import { becomePrimary, becomeReplicaOf } from "./node-control.ts";
import { withStoreTimeout } from "./scheduling.ts";
import { fence } from "./write-guard.ts";

/** Longest message body quoted in a log line. */
const BODY_IN_LOG = 500;

function commandContext(command: Command): Record<string, unknown> {
  return {
    commandId: command.command_id,
    commandType: command.type,
    commandEpoch: command.epoch,
    ...(command.primary ? { primary: command.primary.node_id, primaryAddress: command.primary.address } : {}),
  };
}

/**
 * Runs one command against the database and records it; the caller holds the role lock. Returns
 * why the database refused it (a REPLICAOF whose target would destroy its data or did not answer:
 * parked instead, \`judgeFollow\`), or undefined when it was applied.
 */
async function applyCommand(
  ctx: AgentContext,
  command: Command,
  topology: Topology | undefined,
): Promise<string | undefined> {
  switch (command.type) {
    case "PROMOTE":
      await becomePrimary(ctx, topology);
      ctx.state.recordApplied(command.command_id, command.epoch, { promoted_epoch: command.epoch });
      return undefined;
    case "REPLICAOF": {
      // The schema guarantees `primary` on REPLICAOF.
      const primary = command.primary as NonNullable<Command["primary"]>;
      const { verdict } = await becomeReplicaOf(
        ctx,
        { node_id: primary.node_id, address: primary.address },
        { epoch: command.epoch, topology },
      );
      // Refused, or its target silent: parked instead, not recorded as applied. The park keeps the
      // decision: the probe watches the target and follows it once it holds this database's data,
      // and the topology read judges any newer one.
      if (verdict.kind !== "follow") return verdict.reason;
      ctx.state.recordApplied(command.command_id, command.epoch, { promoted_epoch: undefined });
      return undefined;
    }
    case "PAUSE_WRITES":
      // The schema bounds timeout_ms (MAX_COMMAND_TIMEOUT_MS) and the screen checked that a
      // switchover away from this node is under way at this very epoch. Fenced first, then
      // paused, then the epoch recorded: a heartbeat at this epoch proves the database refuses
      // writes, and the target opens its own at once on that proof (core/crash.ts
      // pausedForSwitchover). The fence outlives the pause; it lifts only when a topology confirms
      // this node again (the switchover abandoned under a newer epoch).
      await fence(ctx, `switchover away from ${ctx.nodeId} at epoch ${command.epoch}`);
      await ctx.db.pauseWrites(command.timeout_ms as number);
      ctx.state.recordApplied(command.command_id, command.epoch);
      return undefined;
    case "REPORT":
      // Not recorded as applied: it raises no epoch, and running it twice only reports longer.
      ctx.schedule.askUntil(ctx.monotonicNow() + (command.timeout_ms as number));
      return undefined;
  }
}

/** A screened command's outcome as `/metrics` counts it. */
const COUNTED_AS = { apply: "applied", reject: "rejected", ignore: "ignored", refuse: "refused" } as const;

/**
 * Handles one message: screened, applied under the role lock, confirmed by an immediate
 * heartbeat, and deleted only after it took effect. Returns false when it failed and stays
 * queued for redelivery.
 */
export async function handleMessage(ctx: AgentContext, message: ReceivedCommand): Promise<boolean> {
  const bus = ctx.deps.commands;
  try {
    // Every command is checked against the topology as it is now (strongly consistent read): a
    // read that fails or outlasts the store timeout leaves the message for redelivery. It is read
    // before the role lock is taken: a store that hangs must not hold the lock that parking this
    // replica needs (nemesis seed 3116: a PROMOTE waited 11 s on a GetItem during a store outage
    // while holding it; the replica's park came 5 s after its primary died, the primary had
    // restarted empty meanwhile, the replica full-synced from it and every write was lost).
    // A malformed message needs no read: it goes to the dead-letter queue whatever the topology.
    const topology = message.command
      ? await withStoreTimeout(ctx.deps.topology.read(ctx.shard), ctx.storeTimeoutMs, "topology read")
      : undefined;
    const outcome = await ctx.roleLock.run(async () => {
      // Screened under the lock: a concurrent self-demotion may have raised the epoch.
      const screening = screenCommand(message, {
        shard: ctx.shard,
        nodeId: ctx.nodeId,
        address: ctx.address,
        highestEpoch: ctx.highestEpoch,
        hasApplied: (id) => ctx.state.hasApplied(id),
        topology,
        now: ctx.deps.clock.now(),
      });
      if (screening.action !== "apply") return screening;
      const refused = await applyCommand(ctx, screening.command, topology);
      if (refused !== undefined)
        return { action: "parked" as const, command: screening.command, reason: refused };
      ctx.logger.info("command applied", { ...commandContext(screening.command), ...ctx.epochContext });
      return screening;
    });
    ctx.count("command", outcome.action === "parked" ? "refused" : COUNTED_AS[outcome.action]);
    if (outcome.action === "parked") {
      // A REPLICAOF whose target holds none of this database's data, or did not answer
      // (\`judgeFollow\`): screened as the controller's, parked instead. Deleted: the park
      // keeps the decision (the probe follows the target once it holds this database's data), and
      // the heartbeat that shows the park goes out now, as an applied command's does.
      ctx.logger.warn("command not followed: parked instead; deleted", {
        ...commandContext(outcome.command),
        reason: outcome.reason,
        receiveCount: message.receiveCount,
        ...ctx.epochContext,
      });
      await runCycle(ctx, { force: true });
      await bus.delete(ctx.shard, ctx.nodeId, message);
      return true;
    }
    if (outcome.action === "reject") {
      ctx.logger.warn("command rejected; left for the dead-letter queue", {
        reason: outcome.reason,
        receiveCount: message.receiveCount,
        body: message.body.slice(0, BODY_IN_LOG),
      });
      return true;
    }
    if (outcome.action === "ignore") {
      ctx.logger.info("command ignored", {
        ...commandContext(outcome.command),
        reason: outcome.reason,
        ...ctx.epochContext,
      });
    } else if (outcome.action === "refuse") {
      // No controller sends it for this topology: deleted at once, so that it cannot fit a later one.
      ctx.logger.warn("command refused; deleted", {
        ...commandContext(outcome.command),
        reason: outcome.reason,
        receiveCount: message.receiveCount,
        body: message.body.slice(0, BODY_IN_LOG),
        ...ctx.epochContext,
      });
    } else {
      // The controller confirms by observing this heartbeat (role and epoch), not by the delete.
      await runCycle(ctx, { force: true });
    }
    await bus.delete(ctx.shard, ctx.nodeId, message);
    return true;
  } catch (error) {
    ctx.count("command", "failed");
    ctx.logger.error("command failed; left for redelivery", {
      ...(message.command ? commandContext(message.command) : {}),
      ...ctx.epochContext,
      error: errorMessage(error),
      receiveCount: message.receiveCount,
    });
    return false;
  }
}

/**
 * Long-polls the node's own queue (created idempotently at start) and handles messages one at
 * a time. On abort the long poll returns at once; a command being applied finishes; messages
 * received but not started are made visible again for the next start.
 */
export async function runCommandConsumer(ctx: AgentContext, signal: AbortSignal): Promise<void> {
  const bus = ctx.deps.commands;
  const backoff = new Backoff({ baseMs: 200, capMs: 5000, floorMs: 50 });
  while (!signal.aborted) {
    try {
      const url = await bus.ensureQueue(ctx.shard, ctx.nodeId, { senders: ctx.options.commandSenders });
      ctx.logger.info("command queue ready", { queueUrl: url });
      backoff.reset();
      break;
    } catch (error) {
      const delay = backoff.next();
      ctx.logger.warn("command queue not ready; retrying", { error: errorMessage(error), retryInMs: delay });
      await sleep(delay, signal);
    }
  }
  while (!signal.aborted) {
    let messages: ReceivedCommand[];
    try {
      messages = await bus.receive(ctx.shard, ctx.nodeId, {
        signal,
        waitSeconds: ctx.options.commandWaitSeconds,
        maxMessages: 10,
      });
    } catch (error) {
      if (signal.aborted) break;
      const delay = backoff.next();
      ctx.logger.warn("receiving commands failed; retrying", {
        error: errorMessage(error),
        retryInMs: delay,
      });
      await sleep(delay, signal);
      continue;
    }
    for (const [index, message] of messages.entries()) {
      if (signal.aborted) {
        await releaseUnstarted(ctx, messages.slice(index));
        break;
      }
      if (await handleMessage(ctx, message)) {
        backoff.reset();
      } else {
        // Retry on the back-off, not after the queue's whole visibility timeout (30 s): a
        // PROMOTE that failed because the database restarted must not hold up a failover.
        const delay = backoff.next();
        await retryAfter(ctx, message, delay);
        await sleep(delay, signal);
      }
    }
  }
}

async function retryAfter(ctx: AgentContext, message: ReceivedCommand, delayMs: number): Promise<void> {
  try {
    await ctx.deps.commands.redeliverAfter(ctx.shard, ctx.nodeId, message, Math.ceil(delayMs / 1000));
  } catch (error) {
    ctx.logger.debug("could not shorten a failed command's visibility; it returns after its timeout", {
      error: errorMessage(error),
    });
  }
}

async function releaseUnstarted(ctx: AgentContext, messages: readonly ReceivedCommand[]): Promise<void> {
  for (const message of messages) {
    try {
      await ctx.deps.commands.redeliverAfter(ctx.shard, ctx.nodeId, message, 0);
    } catch (error) {
      ctx.logger.debug("could not release a message; it returns after its visibility timeout", {
        error: errorMessage(error),
      });
    }
  }
}
