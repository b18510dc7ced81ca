import type { FailoverConfig } from "./config.ts";
import { isRecent } from "./freshness.ts";
import type { CrashReport, Heartbeat, Topology } from "./model.ts";

/**
 * The crash fast path (docs/agent.md#the-crash-fast-path), pure: when a primary's own agent saw its
 * database die, and when that evidence lets a promoted node skip the promotion fence window.
 */

/**
 * A crash counts once it was observed twice at least this far apart: a single observation may
 * be a passing state (a connection killed by an operator, a process mid-restart).
 */
export const CRASH_CONFIRM_MS = 100;

/**
 * The primary's confirmed, current crash report, or undefined. It counts when the agent reports
 * the database down with a crash state, observed twice `CRASH_CONFIRM_MS` apart, first after the
 * database last answered (`last_updated`), and the latest observation is recent by the same rule
 * as any heartbeat (`isRecent`, src/core/freshness.ts): a report is evidence about now, not about the past.
 */
export function confirmedCrash(
  heartbeat: Heartbeat,
  config: FailoverConfig,
  now: number,
): CrashReport | undefined {
  const crash = heartbeat.db_crash;
  if (heartbeat.db_status !== "down" || crash === undefined) return undefined;
  if (crash.first_seen < heartbeat.last_updated) return undefined;
  if (crash.last_seen - crash.first_seen < CRASH_CONFIRM_MS * 1000) return undefined;
  return isRecent(crash.last_seen, config, now) ? crash : undefined;
}

/** What a node being promoted knows about the primary it leaves. */
export interface PromotionWindowInput {
  /** The old primary's heartbeat as read from the store at promotion (undefined: not found). */
  readonly oldPrimary: Heartbeat | undefined;
  /** `run_id` of the primary process this node last replicated from (its probe's view). */
  readonly lastPrimaryRunId: string | undefined;
  /** Whether this node's own link to the old primary is down (or parked) now. */
  readonly linkDown: boolean;
  /** The topology read with `oldPrimary` (undefined: not read). */
  readonly topology?: Topology;
}

export type PromotionWindow =
  | { readonly kind: "skip"; readonly reason: string }
  | { readonly kind: "wait"; readonly reason: string };

/**
 * Whether a promoted node may open writes without waiting out the old primary's guard window.
 * The window exists because the old *process* counts this node as an acknowledging replica for
 * up to `min-replicas-max-lag` + 1 s after their last contact. It may be skipped only when that
 * very process is known dead: its own agent reported a crash of the `run_id` this node last
 * replicated from (`refused`/`reset` over loopback, or a new process answering), and this node's
 * link to it is down. Any later process at that address is a new one that its agent fences first.
 * It is skipped as well in a switchover whose old primary already applied PAUSE_WRITES
 * (`pausedForSwitchover`): that process refuses every write already.
 */
export function promotionWindow(input: PromotionWindowInput): PromotionWindow {
  const paused = pausedForSwitchover(input);
  if (paused !== undefined) return { kind: "skip", reason: paused };
  const crash = input.oldPrimary?.db_status === "down" ? input.oldPrimary.db_crash : undefined;
  if (crash === undefined) return { kind: "wait", reason: "no crash reported by the old primary's agent" };
  if (crash.last_seen - crash.first_seen < CRASH_CONFIRM_MS * 1000) {
    return { kind: "wait", reason: "the old primary's crash is not confirmed yet" };
  }
  if (
    input.lastPrimaryRunId === undefined ||
    crash.run_id === "" ||
    crash.run_id !== input.lastPrimaryRunId
  ) {
    return {
      kind: "wait",
      reason: `the crashed process (${crash.run_id || "unknown run_id"}) is not known to be the one this node replicated from (${input.lastPrimaryRunId ?? "unknown"})`,
    };
  }
  if (!input.linkDown) return { kind: "wait", reason: "this node's link to the old primary is still up" };
  return {
    kind: "skip",
    reason: `the old primary's agent saw process ${crash.run_id} die (${crash.state}): it takes no writes`,
  };
}

/**
 * Why the old primary of a switchover takes no writes, or undefined. Its agent fences its database
 * (\`min-replicas-to-write\` beyond reach, a setting that outlives the agent and the pause) before
 * it pauses writes and before it records the PAUSE_WRITES epoch, which its heartbeat then
 * reports; the controller sends PROMOTE only after it read that epoch (catch_up). The fence lifts
 * only once a topology confirms that node as primary again, at a later epoch (a switchover is
 * never abandoned after PROMOTE). At a heartbeat epoch below the switchover's the window stays.
 */
export function pausedForSwitchover(input: PromotionWindowInput): string | undefined {
  const topology = input.topology;
  const failover = topology?.status === "failing_over" ? topology.failover : undefined;
  const old = input.oldPrimary;
  if (topology === undefined || failover?.kind !== "switchover" || old === undefined) return undefined;
  if (old.node_id !== failover.old_primary_node_id || old.epoch < topology.epoch) return undefined;
  return `switchover at epoch ${topology.epoch}: the old primary ${old.node_id} applied PAUSE_WRITES (its heartbeat is at epoch ${old.epoch}), its writes are fenced`;
}
