import { ENV } from "../src/adapters/env.ts";
import type { FailoverConfig } from "../src/core/config.ts";

/**
 * The timings an agent must share with the controller: its cycle, its fence timeout (below the
 * controller's failure timeout, so a cut-off primary fences before it is replaced) and the failure
 * timeout itself (the agent judges its primary stale with it). The agent's defaults are the
 * construct's; props that change them must reach every agent.
 */
export const AGENT_TIMING_FIELDS = ["heartbeatIntervalMs", "failureTimeoutMs", "fenceTimeoutMs"] as const;

/** The agent's timing variables with the controller's values (`SHARDGUARD_HEARTBEAT_INTERVAL_MS`, …). */
export function agentTimingEnvironment(
  config: Pick<FailoverConfig, (typeof AGENT_TIMING_FIELDS)[number]>,
): Record<string, string> {
  return Object.fromEntries(AGENT_TIMING_FIELDS.map((field) => [ENV[field], String(config[field])]));
}

/** `KEY=value` lines, as systemd's `EnvironmentFile=` and `docker run --env-file` read them. */
export function environmentFileText(environment: Readonly<Record<string, string>>): string {
  return Object.entries(environment)
    .map(([key, value]) => `${key}=${value}`)
    .join("\n");
}
