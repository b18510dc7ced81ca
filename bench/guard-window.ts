/**
 * How long a primary keeps taking writes after its only guarded replica stops acknowledging
 * (issue 30, finding 5): Redis counts a replica good while `unixtime - repl_ack_time <=
 * min-replicas-max-lag` in whole seconds, and refreshes that count in its once-a-second
 * replication cron, so the window after the replica's last contact is longer than
 * `min-replicas-max-lag` + 1 s. A promoted node waits `PROMOTION_FENCE_WINDOW_MS` for the old
 * primary's guard to close; this measures whether that covers it.
 *
 *   npm run bench:guard-window -- [--trials 20] [--out bench/results/guard-window.json]
 *
 * Each trial: a primary with `min-replicas-to-write 1`, `min-replicas-max-lag 2` and one linked
 * replica; after a random 0-1,000 ms (the phase against the replica's 1 s acknowledgements and
 * the primary's cron), the replica is stopped with SIGSTOP (its TCP connection stays open, as in
 * a partition that drops packets) and the primary is written every 5 ms until it answers
 * NOREPLICAS. The window is from the stop to the last accepted write.
 */
import { writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { Command } from "commander";
import { parseIntegerOption } from "../src/cli/options.ts";
import { errorMessage } from "../src/core/errors.ts";
import { GUARD_MAX_LAG_S, PROMOTION_FENCE_WINDOW_MS } from "../src/core/write-guard.ts";
import { type RedisNode, startRedisNodes } from "../src/dev/local-stack/redis-nodes.ts";
import { loadAverage, machineInfo } from "./lib/report.ts";
import { summarize } from "./lib/stats.ts";

const WRITE_EVERY_MS = 5;
const GIVE_UP_MS = 15_000;

interface Trial {
  readonly trial: number;
  readonly phaseMs: number;
  /** From SIGSTOP of the replica to the primary's last accepted write. */
  readonly windowMs: number;
  /** From SIGSTOP to the first NOREPLICAS. */
  readonly refusedAfterMs: number;
}

async function waitUntilGood(primary: RedisNode): Promise<void> {
  const client = primary.client();
  try {
    const deadline = performance.now() + GIVE_UP_MS;
    while (performance.now() < deadline) {
      const info = await client.info("replication");
      if (/min_slaves_good_slaves:1\b/.test(info)) return;
      await sleep(50);
    }
    throw new Error("the replica did not become good again within 15 s");
  } finally {
    client.disconnect();
  }
}

async function trial(index: number, primary: RedisNode, replica: RedisNode): Promise<Trial> {
  await waitUntilGood(primary);
  const phaseMs = Math.floor(Math.random() * 1000);
  await sleep(phaseMs);
  const client = primary.client();
  try {
    replica.signal("SIGSTOP");
    const stoppedAt = performance.now();
    let lastAccepted = stoppedAt;
    for (;;) {
      const now = performance.now();
      if (now - stoppedAt > GIVE_UP_MS)
        throw new Error(`still accepting writes ${GIVE_UP_MS} ms after the stop`);
      try {
        await client.set("guard-window", String(now));
        lastAccepted = performance.now();
      } catch (error) {
        if (!/NOREPLICAS/.test(errorMessage(error))) throw error;
        return {
          trial: index,
          phaseMs,
          windowMs: Math.round(lastAccepted - stoppedAt),
          refusedAfterMs: Math.round(performance.now() - stoppedAt),
        };
      }
      await sleep(WRITE_EVERY_MS);
    }
  } finally {
    replica.signal("SIGCONT");
    client.disconnect();
  }
}

async function main(): Promise<void> {
  const options = new Command("guard-window")
    .description("measure how long a primary takes writes after its guarded replica stops acknowledging")
    .option("--trials <n>", "trials (1-1000)", parseIntegerOption(1, 1000), 20)
    .option("--out <file>", "JSON report", "bench/results/guard-window.json")
    .parse()
    .opts<{ trials: number; out: string }>();
  const nodes = await startRedisNodes(2);
  const [primary, replica] = nodes;
  if (!primary || !replica) throw new Error("two nodes expected");
  const trials: Trial[] = [];
  const loadBefore = loadAverage();
  try {
    const admin = primary.client();
    await admin.config("SET", "min-replicas-to-write", "1");
    await admin.config("SET", "min-replicas-max-lag", String(GUARD_MAX_LAG_S));
    admin.disconnect();
    for (let index = 1; index <= options.trials; index++) {
      const result = await trial(index, primary, replica);
      trials.push(result);
      console.log(
        `trial ${index}/${options.trials}: writes taken ${result.windowMs} ms after the replica stopped` +
          ` (NOREPLICAS at ${result.refusedAfterMs} ms; phase ${result.phaseMs} ms)`,
      );
    }
  } finally {
    await Promise.all(nodes.map((node) => node.destroy()));
  }
  const windows = summarize(trials.map((t) => t.windowMs));
  const max = Math.max(...trials.map((t) => t.windowMs));
  const report = {
    bench: "guard-window",
    at: new Date().toISOString(),
    machine: machineInfo(),
    load: { before: loadBefore, after: loadAverage() },
    minReplicasMaxLagS: GUARD_MAX_LAG_S,
    promotionFenceWindowMs: PROMOTION_FENCE_WINDOW_MS,
    windowMs: windows,
    maxWindowMs: max,
    covered: max < PROMOTION_FENCE_WINDOW_MS,
    trials,
  };
  writeFileSync(options.out, `${JSON.stringify(report, null, 2)}\n`);
  console.log(
    `window after the replica's last contact: median ${windows?.median} ms, max ${max} ms over ${trials.length} trials;` +
      ` promotion fence window ${PROMOTION_FENCE_WINDOW_MS} ms: ${report.covered ? "covers it" : "does NOT cover it"}` +
      ` (load ${loadBefore.join(" ")}); ${options.out}`,
  );
}

await main();
