import { z } from "zod";
import { describeIssues } from "../core/config.ts";
import { idSchema } from "../core/model.ts";
import {
  type ControllerDeps,
  type CycleOutcome,
  pauseShard,
  type RequestOptions,
  recoverShard,
  requestSwitchover,
  resumeShard,
} from "./orchestrator.ts";

/**
 * Operator requests, as the Lambda receives them (`aws lambda invoke`, the CLI) and as the
 * local controller runs them: `{ action: "switchover" | "pause" | "resume" | "recover", shard, to?,
 * reason? }` (`recover` needs both `to` and `reason`).
 */
export const operatorRequestSchema = z.object({
  action: z.enum(["switchover", "pause", "resume", "recover"]),
  shard: idSchema,
  to: idSchema.optional(),
  reason: z.string().max(500).optional(),
});
export type OperatorRequest = z.output<typeof operatorRequestSchema>;

export interface OperatorResponse {
  readonly ok: boolean;
  readonly action?: OperatorRequest["action"];
  readonly shard?: string;
  readonly outcome?: CycleOutcome;
  readonly epoch?: number;
  readonly primary?: string;
  /** One sentence: what happened and why, or what was wrong with the request. */
  readonly reason: string;
}

const SUCCESS: ReadonlySet<CycleOutcome> = new Set(["completed", "paused", "resumed", "recovered"]);

/** An event meant as an operator request (it names an action); anything else is a scheduled tick. */
export function isOperatorRequest(event: unknown): boolean {
  return typeof event === "object" && event !== null && "action" in event;
}

/**
 * Runs one operator request. `options.remainingMs` is the invocation's time (Lambda): the
 * request's lease and phases stay within it, as a failover's do.
 */
export async function handleOperatorRequest(
  deps: ControllerDeps,
  event: unknown,
  options: RequestOptions = {},
): Promise<OperatorResponse> {
  const parsed = operatorRequestSchema.safeParse(event);
  if (!parsed.success) return { ok: false, reason: `invalid request: ${describeIssues(parsed.error)}` };
  const request = parsed.data;
  if (request.to !== undefined && request.action !== "switchover" && request.action !== "recover") {
    return {
      ok: false,
      action: request.action,
      shard: request.shard,
      reason: "invalid request: to: only for switchover and recover",
    };
  }
  if (request.action === "recover" && (request.to === undefined || !request.reason)) {
    return {
      ok: false,
      action: request.action,
      shard: request.shard,
      reason: "invalid request: recover needs to (the node whose data to keep) and reason",
    };
  }
  deps.log.info("operator request", { ...request });
  const result =
    request.action === "switchover"
      ? await requestSwitchover(deps, request.shard, { to: request.to, reason: request.reason }, options)
      : request.action === "pause"
        ? await pauseShard(deps, request.shard, request.reason, options)
        : request.action === "recover"
          ? await recoverShard(
              deps,
              request.shard,
              { to: request.to as string, reason: request.reason as string },
              options,
            )
          : await resumeShard(deps, request.shard, options);
  const response: OperatorResponse = {
    ok: SUCCESS.has(result.outcome),
    action: request.action,
    shard: result.shard,
    outcome: result.outcome,
    epoch: result.epoch,
    primary: result.primary,
    reason: result.reason,
  };
  deps.log.info("operator request done", { ...response });
  return response;
}
