import { jsonLineLogger } from "../adapters/observability.ts";
import { errorMessage } from "../core/errors.ts";
import type { Role } from "../core/model.ts";
import type { Logger, LogLevel } from "../core/observability.ts";
import { CLOCK_WATCH_INTERVAL_MS, clockStepFence } from "./clock-watch.ts";
import { runCommandConsumer } from "./command-consumer.ts";
import { AgentContext, type AgentDeps } from "./context.ts";
import { CrashWatch } from "./crash-watch.ts";
import { type Database, RedisDatabase, redisConnectSettings } from "./database.ts";
import { runCycle, runHeartbeatLoop } from "./heartbeat-loop.ts";
import { HttpEndpoint } from "./http-endpoint.ts";
import { type AgentOptionsInput, parseAgentOptions } from "./options.ts";
import type { ReplicationInfo } from "./redis-info.ts";
import { runLoop } from "./scheduling.ts";
import { SentinelEndpoint } from "./sentinel-endpoint.ts";
import { StateDir } from "./state-dir.ts";
import { currentPlan, fence } from "./write-guard.ts";

export type { AgentDeps } from "./context.ts";

/** How long the watchdog waits between two repeats of the same complaint (cut off, cannot fence). */
const KEEP_SERVING_REMINDER_MS = 30_000;

/** A running agent. */
export interface AgentHandle {
  readonly nodeId: string;
  readonly shard: string;
  /** host:port other nodes reach this database on. */
  readonly address: string;
  /** host:port of the Sentinel-protocol endpoint, when `sentinelPort` is set (docs/sentinel.md). */
  readonly sentinelAddress: string | undefined;
  /** host:port of the HTTP role checks and metrics, when `httpPort` is set (docs/http.md). */
  readonly httpAddress: string | undefined;
  /** What the agent currently believes, for the CLI, the demo and tests. */
  status(): AgentStatus;
  /** Runs one heartbeat cycle now (tests and the demo; the loop runs on its own). */
  heartbeatNow(): Promise<void>;
  /**
   * Stops cleanly: the long poll returns, a command being applied finishes (or stays queued
   * for redelivery), the loops end, the database connection closes and the state dir is
   * unlocked. Safe to call twice.
   */
  stop(): Promise<void>;
}

export interface AgentStatus {
  readonly role: Role | undefined;
  readonly epoch: number;
  readonly fenced: boolean;
  readonly dbUp: boolean;
  readonly storeUp: boolean;
  /** ms since the last heartbeat write that succeeded. */
  readonly msSinceHeartbeatWritten: number;
}

export interface StartAgentExtras {
  /** Replaces the ioredis connection (tests of the loops only). */
  readonly database?: Database;
  /** Level of the default logger (when `deps.logger` is not given). @default "info" */
  readonly logLevel?: LogLevel;
}

/**
 * Starts an agent in this process: opens the state dir (node id), connects to the database,
 * runs the first cycle (fenced start: the topology is read and obeyed before any heartbeat
 * claims primary), then the heartbeat loop, the fence watchdog and the command consumer.
 */
export async function startAgent(
  input: AgentOptionsInput,
  deps: AgentDeps,
  extras: StartAgentExtras = {},
): Promise<AgentHandle> {
  const options = parseAgentOptions(input);
  // Reads the password and certificate files: a setting that names an unreadable file fails the start.
  const connection = redisConnectSettings(options);
  const state = StateDir.open(options.stateDir, {
    shard: options.shard,
    nodeId: options.nodeId,
    now: deps.clock.now(),
  });
  const nodeId = state.nodeId;
  const logger: Logger =
    deps.logger ?? jsonLineLogger({ service: "shardguard-agent", shard: options.shard, node: nodeId });
  const redisTimeoutMs = options.redisTimeoutMs ?? Math.max(options.heartbeatIntervalMs, 1000);
  const db =
    extras.database ??
    new RedisDatabase({
      address: options.redis,
      connection,
      commandTimeoutMs: redisTimeoutMs,
      logger,
    });
  const sentinel =
    options.sentinelPort === undefined ? undefined : new SentinelEndpoint({ options, nodeId, deps, logger });
  const ctx = new AgentContext({ options, nodeId, deps: sentinel?.wrap(deps) ?? deps, db, state, logger });
  const http = options.httpPort === undefined ? undefined : new HttpEndpoint(ctx, options, logger);
  if (http) {
    const { commands, storeErrors } = http.metrics;
    ctx.count = (event, label) =>
      event === "command" ? commands.inc({ outcome: label }) : storeErrors.inc({ operation: label });
  }
  logger.info("agent starting", {
    redis: options.redis,
    address: ctx.address,
    priority: options.priority,
    fencePolicy: options.fencePolicy,
    stateDir: options.stateDir,
    epoch: ctx.highestEpoch,
    fenced: state.state.fence !== undefined,
  });

  const controller = new AbortController();
  const { signal } = controller;
  let loops: Promise<unknown> | undefined;
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      controller.abort();
      await loops;
      await sentinel?.close();
      await http?.close();
      ctx.probe.close();
      await db.close();
      state.release();
      logger.info("agent stopped", ctx.epochContext);
    })();
    return stopping;
  };

  try {
    await sentinel?.listen();
    await http?.listen();
    await db.waitReady(redisTimeoutMs);
    await runCycle(ctx, { force: true });
  } catch (error) {
    await sentinel?.close();
    await http?.close();
    await db.close();
    state.release();
    throw error;
  }
  loops = Promise.allSettled([
    runHeartbeatLoop(ctx, signal),
    new CrashWatch(ctx).run(signal),
    runFenceWatchdog(ctx, signal),
    runClockWatch(ctx, signal),
    runCommandConsumer(ctx, signal),
  ]);

  return {
    nodeId,
    shard: options.shard,
    address: ctx.address,
    sentinelAddress: sentinel?.address,
    httpAddress: http?.address,
    status: () => ({
      role: ctx.lastInfo?.role ?? ctx.lastHeartbeat?.role,
      epoch: ctx.highestEpoch,
      fenced: state.state.fence !== undefined,
      dbUp: ctx.dbUp,
      storeUp: ctx.storeUp,
      msSinceHeartbeatWritten: ctx.monotonicNow() - ctx.lastHeartbeatWrittenAt,
    }),
    heartbeatNow: async () => {
      await runCycle(ctx, { force: true });
    },
    stop,
  };
}

/**
 * Reads a primary's database clock every CLOCK_WATCH_INTERVAL_MS, independently of the heartbeat
 * loop, and fences at once on a backward step (\`clockStepFence\`, src/agent/clock-watch.ts; issue
 * 30, finding 5). The cycle judges the same watch, but only after its store calls: with the store
 * slow, a cycle's guard came seconds after its INFO, while Redis's guard counted a cut-off replica
 * good on the stepped clock (nemesis seed 6811: node-125r took writes for 2.1 s beside the new
 * primary; its cycle had waited out three store timeouts). The fence is lifted by the cycle's
 * guard once the watch's window is past. A database whose INFO has no \`server_time_usec\` (before
 * Redis 7) is not watched; nor is a replica (its guard counts nothing).
 */
function runClockWatch(ctx: AgentContext, signal: AbortSignal): Promise<void> {
  const tick = Math.max(25, Math.min(CLOCK_WATCH_INTERVAL_MS, ctx.options.heartbeatIntervalMs));
  return runLoop(
    "clock watch",
    signal,
    ctx.logger,
    async () => {
      const last = ctx.lastInfo;
      if (last?.role !== "primary" || last.clock === undefined) return tick;
      const generation = ctx.roleGeneration;
      let info: ReplicationInfo;
      try {
        info = await ctx.db.replicationInfo();
      } catch {
        // Down or hung: the heartbeat cycle and the crash watch report it.
        return tick;
      }
      const reason = clockStepFence(ctx, info);
      if (reason === undefined || info.role !== "primary") return tick;
      await ctx.roleLock.run(async () => {
        // A role change since the read is the cycle's to judge; a fence already set stands.
        if (ctx.roleGeneration !== generation) return;
        if (ctx.appliedGuard === "fence" && ctx.state.state.fence !== undefined) return;
        await fence(ctx, reason);
      });
      return tick;
    },
    () => tick,
  );
}

/**
 * Checks, independently of the heartbeat loop (whose store calls may hang), whether this
 * primary has gone fenceTimeoutMs without writing a heartbeat, and applies the write guard's
 * plan: fence (policy `fence`, or `failsafe` without a replica to witness), or keep serving and
 * say so (`failsafe` behind its replicas, `keep-serving`).
 */
function runFenceWatchdog(ctx: AgentContext, signal: AbortSignal): Promise<void> {
  const { fenceTimeoutMs, heartbeatIntervalMs } = ctx.options;
  const tick = Math.max(25, Math.min(heartbeatIntervalMs, Math.floor(fenceTimeoutMs / 4)));
  let lastReminder = Number.NEGATIVE_INFINITY;
  let lastFenceError = Number.NEGATIVE_INFINITY;
  return runLoop(
    "fence watchdog",
    signal,
    ctx.logger,
    async () => {
      const msSince = ctx.monotonicNow() - ctx.lastHeartbeatWrittenAt;
      const info = ctx.lastInfo;
      if (info?.role !== "primary" || msSince < fenceTimeoutMs || !ctx.topologyRead) {
        lastReminder = Number.NEGATIVE_INFINITY;
        lastFenceError = Number.NEGATIVE_INFINITY;
        return tick;
      }
      const plan = currentPlan(ctx, info);
      if (plan.kind === "fence") {
        // Re-applied on every tick while cut off: the database may have restarted without it.
        await ctx.roleLock.run(async () => {
          if (ctx.monotonicNow() - ctx.lastHeartbeatWrittenAt < fenceTimeoutMs) return;
          try {
            await fence(ctx, plan.reason);
          } catch (error) {
            // The database may be down too: say so once per reminder period, not on every tick.
            const now = ctx.monotonicNow();
            if (now - lastFenceError >= KEEP_SERVING_REMINDER_MS) {
              lastFenceError = now;
              ctx.logger.error("could not fence writes", { ...ctx.epochContext, error: errorMessage(error) });
            }
          }
        });
        return tick;
      }
      const now = ctx.monotonicNow();
      if (now - lastReminder >= KEEP_SERVING_REMINDER_MS) {
        lastReminder = now;
        ctx.logger.error(
          plan.kind === "guard"
            ? "failsafe: serving without coordination store; every member of the replica set must acknowledge each write"
            : "coordination store unreachable: keep-serving policy keeps this node primary from cached state",
          {
            ...ctx.epochContext,
            policy: ctx.options.fencePolicy,
            msSinceHeartbeatWritten: Math.round(msSince),
            topologyEpoch: ctx.lastTopology?.epoch,
            replicaSet: ctx.guardMembers,
          },
        );
      }
      return tick;
    },
    () => tick,
  );
}
