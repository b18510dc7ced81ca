import { isIP } from "node:net";
import { parseAddress } from "../core/address.ts";
import { CRASH_CONFIRM_MS } from "../core/crash.ts";
import { errorMessage } from "../core/errors.ts";
import type { CrashState } from "../core/model.ts";
import { FENCED_MIN_REPLICAS, GUARD_MAX_LAG_S } from "../core/write-guard.ts";
import { sleep } from "./backoff.ts";
import type { AgentContext } from "./context.ts";
import type { DatabaseLink } from "./database.ts";
import { FENCING_CONFIG_KEYS } from "./fencing.ts";
import type { ReplicationInfo } from "./redis-info.ts";

/**
 * The primary's agent watches its own database for death (docs/agent.md#the-crash-fast-path).
 * A dedicated connection hears the process go away at once (its socket closes); the agent then
 * checks every `CHECK_INTERVAL_MS` what is there: `refused` (nothing listens), `reset` (accepted,
 * then reset before any reply), a new process (another run_id: the old one is dead), the same
 * process (the connection was closed by someone else: nothing happened), or no answer in time (a
 * stall, never a crash). Each crash observation updates `ctx.crash` and wakes the heartbeat loop,
 * which writes it at once; two observations `CRASH_CONFIRM_MS` apart confirm it for `decide()`.
 *
 * `refused` and `reset` count only when the database is reached over loopback: across a network a
 * firewall's reject looks the same while the process lives on. A new process answering is evidence
 * from anywhere. A new process is **fenced first** (before its agent's cycle judges it): after a
 * fast failover the promoted node may already take writes, and a process restarted by a supervisor
 * comes up with the config file's settings, i.e. without the write guard.
 */

/** Pause between two checks while the database is in doubt. */
export const CHECK_INTERVAL_MS = 100;
/** A check that takes longer than this (connect or INFO) saw no crash: the database may be stalled. */
const CHECK_TIMEOUT_MS = 250;
/** How often a watch that is not connected looks again whether this node is a primary. */
const IDLE_MS = 200;

export type Observation =
  | { readonly kind: "crash"; readonly state: CrashState }
  | { readonly kind: "answered"; readonly runId: string | undefined }
  | { readonly kind: "no_answer"; readonly why: string };

export function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "");
  if (bare === "localhost") return true;
  if (isIP(bare) === 4) return bare.startsWith("127.");
  return bare === "::1";
}

/** One look at the database through a new connection. */
export async function observeDatabase(
  ctx: AgentContext,
  onAnswer?: (link: DatabaseLink, info: ReplicationInfo) => Promise<void>,
): Promise<Observation> {
  const loopback = isLoopback(parseAddress(ctx.options.redis).host);
  const link = ctx.db.dial(ctx.options.redis, {
    name: "shardguard-crash-check",
    connectTimeoutMs: CHECK_TIMEOUT_MS,
    commandTimeoutMs: CHECK_TIMEOUT_MS,
  });
  try {
    await link.connect();
    const info = await link.replicationInfo();
    await onAnswer?.(link, info);
    return { kind: "answered", runId: info.runId };
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (loopback && code === "ECONNREFUSED") return { kind: "crash", state: "refused" };
    if (loopback && code === "ECONNRESET") return { kind: "crash", state: "reset" };
    // A timeout, a closed connection (maxclients), a BUSY or LOADING reply, an auth error: the
    // process may well be alive.
    return { kind: "no_answer", why: errorMessage(error) };
  } finally {
    link.disconnect();
  }
}

/** Refuses every write on a new process through the check's own connection (the agent's may be reconnecting). */
async function fenceNewProcess(ctx: AgentContext, link: DatabaseLink): Promise<void> {
  if (ctx.state.state.fence === undefined) {
    const saved: Record<string, string> = {};
    for (const key of FENCING_CONFIG_KEYS) {
      const value = await link.configGet(key);
      if (value !== undefined) saved[key] = value;
    }
    ctx.state.update({ fence: { saved, since: ctx.deps.clock.now() } });
  }
  await link.configSet("min-replicas-max-lag", String(GUARD_MAX_LAG_S));
  await link.configSet("min-replicas-to-write", String(FENCED_MIN_REPLICAS));
  ctx.appliedGuard = "fence";
}

/** Records one crash observation; wakes the heartbeat on a new report and on its confirmation. */
export function recordCrash(ctx: AgentContext, state: CrashState): void {
  const now = Math.floor(ctx.deps.clock.now() * 1000);
  const previous = ctx.crash;
  const fresh = previous === undefined || previous.state !== state;
  const wasConfirmed =
    previous !== undefined && previous.last_seen - previous.first_seen >= CRASH_CONFIRM_MS * 1000;
  ctx.crash = {
    state,
    run_id: previous?.run_id ?? ctx.identity?.runId ?? "",
    first_seen: previous?.first_seen ?? now,
    last_seen: now,
  };
  const confirmed = ctx.crash.last_seen - ctx.crash.first_seen >= CRASH_CONFIRM_MS * 1000;
  if (fresh || (confirmed && !wasConfirmed)) {
    ctx.logger.warn(confirmed ? "database death confirmed" : "database died", {
      ...ctx.epochContext,
      state,
      runId: ctx.crash.run_id,
      sinceFirstMs: Math.round((now - ctx.crash.first_seen) / 1000),
    });
    ctx.wakeHeartbeat();
  }
}

export class CrashWatch {
  readonly #ctx: AgentContext;
  #link: DatabaseLink | undefined;

  constructor(ctx: AgentContext) {
    this.#ctx = ctx;
  }

  /** Runs until `signal` aborts. */
  async run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      try {
        if (this.#ctx.lastInfo?.role !== "primary" || this.#ctx.identity === undefined) {
          this.close();
          await sleep(IDLE_MS, signal);
          continue;
        }
        await this.#watch(signal);
        if (!signal.aborted) await this.#doubt(signal);
      } catch (error) {
        this.#ctx.logger.warn("crash watch failed", {
          ...this.#ctx.epochContext,
          error: errorMessage(error),
        });
        await sleep(IDLE_MS, signal);
      }
    }
    this.close();
  }

  /** Holds a connection until it closes (the process went away) or this node stops being primary. */
  async #watch(signal: AbortSignal): Promise<void> {
    const link = this.#ctx.db.dial(this.#ctx.options.redis, {
      name: "shardguard-crash-watch",
      connectTimeoutMs: CHECK_TIMEOUT_MS * 4,
      reconnectMs: undefined,
    });
    this.#link = link;
    await link.connect().catch(() => {});
    await new Promise<void>((resolve) => {
      const poll = setInterval(() => {
        if (signal.aborted || this.#ctx.lastInfo?.role !== "primary") finish();
      }, IDLE_MS);
      const finish = () => {
        clearInterval(poll);
        link.off("end", finish);
        signal.removeEventListener("abort", finish);
        resolve();
      };
      if (!link.ready) {
        finish();
        return;
      }
      link.on("end", finish);
      signal.addEventListener("abort", finish, { once: true });
    });
    this.close();
  }

  /** Checks every CHECK_INTERVAL_MS until the database answers. */
  async #doubt(signal: AbortSignal): Promise<void> {
    const ctx = this.#ctx;
    const knownRunId = ctx.identity?.runId;
    while (!signal.aborted && ctx.lastInfo?.role === "primary") {
      const observation = await observeDatabase(ctx, async (link, info) => {
        if (info.runId !== knownRunId && info.role === "primary") {
          await ctx.roleLock.run(() => fenceNewProcess(ctx, link));
          ctx.logger.warn("a new database process answers: fenced until this agent judged it", {
            ...ctx.epochContext,
            runId: info.runId,
            previousRunId: knownRunId,
          });
        }
      });
      if (observation.kind === "crash") {
        recordCrash(ctx, observation.state);
      } else if (observation.kind === "answered") {
        if (observation.runId !== undefined && observation.runId !== knownRunId)
          recordCrash(ctx, "restarted");
        // Same process: its connection was closed by someone else (CLIENT KILL, a proxy), nothing died.
        return;
      }
      await sleep(CHECK_INTERVAL_MS, signal);
    }
  }

  close(): void {
    this.#link?.disconnect();
    this.#link = undefined;
  }
}
