import { z } from "zod";
import { idSchema } from "./model.ts";

/**
 * Controller wake-ups (docs/controller.md#controller-wake-ups): an agent that wrote a heartbeat the
 * crash fast path may act on tells the controller at once instead of waiting for its next tick.
 * A wake-up is only a hint: it names a shard to look at now; the decision still comes from the
 * snapshot, and a lost wake-up costs at most one tick (the periodic scan stays).
 */

export const WAKE_REASONS = ["crash", "link_down", "probe"] as const;

export const wakeSchema = z.object({
  shard: idSchema,
  node: idSchema,
  /**
   * `crash`: the primary's agent wrote a confirmed crash report; `link_down`: a replica lost its
   * primary; `probe`: a replica's probe of its primary got no good answer (hung, fenced, restarted).
   */
  reason: z.enum(WAKE_REASONS),
  /** ms (AWS-aligned) when the agent sent it: the receiver measures the delivery latency. */
  sent_at: z.number().int(),
});
export type Wake = z.output<typeof wakeSchema>;

export interface WakeSender {
  /** Best effort: resolves false (never throws) when the queue is missing or unreachable. */
  send(wake: Wake): Promise<boolean>;
}

export interface WakeReceiver {
  /** Long-polls up to `waitSeconds`; received wake-ups are deleted at once (they are hints). */
  receive(waitSeconds: number, signal?: AbortSignal): Promise<Wake[]>;
}
