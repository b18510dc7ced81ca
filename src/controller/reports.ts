import { awaitingReports, reportsPending, switchoverReporters } from "../core/decide.ts";
import { errorMessage } from "../core/errors.ts";
import { type Command, MAX_COMMAND_TIMEOUT_MS } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import { type ControllerDeps, sleepOf } from "./deps.ts";

/**
 * Quiet agents (a replica following a fresh primary writes only on a change and at its keepalive)
 * are asked to report when the controller needs their word now: a decision that would change the
 * primary waits for every agent whose last report still stands (`awaiting_reports`), and a
 * switchover ranks its target by offsets no older than the failure timeout. A REPORT command has
 * the agent write at once and every cycle for `timeout_ms`; it changes nothing in the database.
 */

/** Failure timeouts a REPORT asked by a failure keeps an agent reporting: through the failover it may lead to. */
export const REPORT_REQUEST_TIMEOUTS = 4;

/** Failure timeouts a caller waits for the nodes it asked to report (a switchover, `status --fresh`). */
export const REPORT_WAIT_TIMEOUTS = 2;

/** How long a REPORT asked by a failure keeps an agent reporting (REPORT_REQUEST_TIMEOUTS). */
export function reportWindowMs(deps: ControllerDeps): number {
  return REPORT_REQUEST_TIMEOUTS * deps.config.failureTimeoutMs;
}

/** Sends REPORT to each node; a node whose queue cannot be reached is logged and left to its keepalive. */
export async function requestReports(
  deps: ControllerDeps,
  shard: string,
  epoch: number,
  nodes: readonly string[],
  timeoutMs: number,
): Promise<void> {
  const issuedAt = Math.round(deps.clock.now());
  await Promise.all(
    nodes.map(async (node) => {
      const command: Command = {
        type: "REPORT",
        shard,
        epoch,
        command_id: `${shard}:${epoch}:REPORT:${node}:${issuedAt}`,
        issued_at: issuedAt,
        // A longer lease than the schema's bound asks for no more than it: the command stays valid.
        timeout_ms: Math.min(timeoutMs, MAX_COMMAND_TIMEOUT_MS),
      };
      try {
        await deps.bus.send(shard, node, command);
      } catch (error) {
        deps.log.warn("could not ask a quiet agent to report", { shard, node, error: errorMessage(error) });
      }
    }),
  );
}

/**
 * Asks the shard's quiet agents (all but `exclude`) to report, then re-reads until none is left
 * quiet or `waitMs` passed: the snapshot to plan on. With `everyone` (a switchover), every quiet
 * agent (one with a keepalive) whose report still stands but was not heard within half the failure
 * timeout is asked
 * (`reportsPending`), on each re-read too, and waited for until none is left: one heard just
 * before the request is not quiet, yet would turn stale while the others are waited for, the lock
 * taken and the plan made again.
 */
export async function withReports(
  deps: ControllerDeps,
  shard: string,
  snapshot: ShardSnapshot,
  options: {
    readonly exclude?: string;
    readonly timeoutMs: number;
    readonly waitMs: number;
    readonly everyone?: boolean;
  },
): Promise<ShardSnapshot> {
  const epoch = snapshot.topology?.epoch ?? 0;
  const asked = new Set<string>();
  const pending = (current: ShardSnapshot): string[] => {
    const now = deps.clock.now();
    const nodes =
      options.everyone === true
        ? reportsPending(
            current,
            switchoverReporters(current, deps.config, now, options.exclude).map((node) => node.node_id),
            deps.config,
            now,
          )
        : awaitingReports(current, deps.config, now, options.exclude);
    return nodes.map((node) => node.node_id);
  };
  const askNew = async (ids: readonly string[]): Promise<void> => {
    const fresh = ids.filter((id) => !asked.has(id));
    for (const id of fresh) asked.add(id);
    if (fresh.length > 0) await requestReports(deps, shard, epoch, fresh, options.timeoutMs);
  };
  const first = pending(snapshot);
  if (first.length === 0) return snapshot;
  await askNew(first);
  const deadline = deps.clock.now() + options.waitMs;
  const pollMs = Math.max(50, Math.min(250, deps.config.heartbeatIntervalMs / 4));
  let current = snapshot;
  while (deps.clock.now() < deadline) {
    await sleepOf(deps)(pollMs);
    current = await deps.store.heartbeats.snapshot(shard);
    const left = pending(current);
    if (left.length === 0) return current;
    if (options.everyone === true) await askNew(left);
  }
  return current;
}
