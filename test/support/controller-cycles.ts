import { setTimeout as tick } from "node:timers/promises";
import { type ControllerDeps, type CycleResult, runShardCycle } from "../../src/controller/orchestrator.ts";

/**
 * Runs controller cycles on `shard` until `until` accepts a result, or fails after `ms`. The
 * cycles are `deps.config.tickIntervalMs` apart, as the controller's own loop paces them: the pause
 * is the controller's tick, not a wait for a condition.
 */
export async function cycleUntil(
  deps: ControllerDeps,
  shard: string,
  until: (result: CycleResult) => boolean,
  ms = 15_000,
): Promise<CycleResult[]> {
  const results: CycleResult[] = [];
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    const result = await runShardCycle(deps, shard);
    results.push(result);
    if (until(result)) return results;
    await tick(deps.config.tickIntervalMs);
  }
  throw new Error(`no matching cycle within ${ms} ms; last: ${JSON.stringify(results.at(-1))}`);
}
