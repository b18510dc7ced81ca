import { describe, expect, it } from "vitest";
import { ControllerLoop } from "../../src/controller/loop.ts";
import type { Logger } from "../../src/core/observability.ts";
import { aScriptedShard, controller, type ScriptedShard } from "../support/scripted-shard.ts";
import { waitFor } from "../support/wait.ts";

/** The controller loop on the local stack: pacing, deadline, overlap, logs on change, metrics. */

class RecordingLog implements Logger {
  readonly lines: Array<{ level: string; message: string; attributes: Record<string, unknown> }> = [];
  debug = (message: string, attributes: Record<string, unknown> = {}) =>
    this.#add("debug", message, attributes);
  info = (message: string, attributes: Record<string, unknown> = {}) =>
    this.#add("info", message, attributes);
  warn = (message: string, attributes: Record<string, unknown> = {}) =>
    this.#add("warn", message, attributes);
  error = (message: string, attributes: Record<string, unknown> = {}) =>
    this.#add("error", message, attributes);
  #add(level: string, message: string, attributes: Record<string, unknown>) {
    this.lines.push({ level, message, attributes });
  }
  shardLines(level: string, shard: string) {
    return this.lines.filter(
      (line) => line.level === level && line.attributes.shard === shard && "outcome" in line.attributes,
    );
  }
}

function threeNodeShard() {
  const shard = aScriptedShard();
  shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
  shard.node("r1", { txn: 990 });
  shard.node("r2", { txn: 980 });
  return shard;
}

/** Kills p1 as soon as the loop has logged its first decision on the shard (it saw p1 healthy). */
async function killAfterFirstLine(shard: ScriptedShard, log: RecordingLog): Promise<void> {
  await waitFor(() => log.shardLines("info", shard.shard).length > 0, "the loop's first decision", 3000, 20);
  shard.kill("p1");
}

/**
 * Phase bounds that fit the few seconds these invocations get: a phase starts only when the
 * remaining time covers its bound plus 1 s (the scripted nodes confirm within a heartbeat).
 */
const SHORT_PHASES = { catch_up: 1000, promote: 1000, confirm: 1000, repoint: 1000, cleanup: 1000 };

function deadlineIn(ms: number) {
  const end = Date.now() + ms;
  return { end, remainingMs: () => end - Date.now() };
}

describe("controller loop", () => {
  it("detects a dead primary within a bounded run, fails over, and logs a line only when a shard changes", async () => {
    // Prepare
    const shard = threeNodeShard();
    await shard.start();
    const log = new RecordingLog();
    const { deps, metrics } = controller(shard, { log, timeouts: SHORT_PHASES });
    const loop = new ControllerLoop(deps);
    // 8 s: the phases need their bounds plus 1 s each of what is left; at load 19 (a fresh-clone CI
    // run) DynamoDB Local answered slowly enough that 5 s ran out before the failover.
    const deadline = deadlineIn(8000);
    // The primary dies once the loop has logged the shard healthy, not at a guessed moment.
    const primaryKilled = killAfterFirstLine(shard, log);

    // Act
    const summary = await loop.run({
      shards: [shard.shard],
      remainingMs: deadline.remainingMs,
      stopBeforeMs: 500,
      actBudgetMs: 0,
    });

    await primaryKilled;

    // Assess
    expect(Date.now()).toBeLessThan(deadline.end);
    expect(summary.passes).toBeGreaterThan(10);
    expect(summary).toMatchObject({ actions: 1, errors: 0 });
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      epoch: 2,
      primary_node_id: "r1",
    });
    const changes = log
      .shardLines("info", shard.shard)
      .map((line) => `${line.attributes.code ?? line.attributes.decision}/${line.attributes.outcome}`);
    expect(changes[0]).toBe("healthy/no_action");
    expect(changes).toContain("failover/completed");
    expect(changes.length).toBeLessThanOrEqual(5);
    expect(log.shardLines("debug", shard.shard).length).toBeGreaterThan(5);
    expect(metrics.get("staleHeartbeatDetected")).toBeGreaterThanOrEqual(1);
    expect(metrics.get("failoverCompleted")).toBe(1);
    expect(metrics.get("shardOffline")).toBe(0);
  });

  it("fails over exactly once when two loops overlap (two Lambda invocations)", async () => {
    // Prepare
    const shard = threeNodeShard();
    await shard.start();
    const firstLog = new RecordingLog();
    const first = controller(shard, { log: firstLog, timeouts: SHORT_PHASES });
    const second = controller(shard, { timeouts: SHORT_PHASES });
    const deadline = deadlineIn(7000);
    const primaryKilled = killAfterFirstLine(shard, firstLog);

    // Act
    const options = {
      shards: [shard.shard],
      remainingMs: deadline.remainingMs,
      stopBeforeMs: 500,
      actBudgetMs: 0,
    };
    const summaries = await Promise.all([
      new ControllerLoop(first.deps).run(options),
      new ControllerLoop(second.deps).run(options),
    ]);
    await primaryKilled;

    // Assess
    expect(summaries.map((summary) => summary.errors)).toEqual([0, 0]);
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({
      epoch: 2,
      primary_node_id: "r1",
    });
    expect(await shard.aws.store.history.list(shard.shard)).toHaveLength(1);
    const started = [...first.events.ofType("FailoverStarted"), ...second.events.ofType("FailoverStarted")];
    expect(started).toHaveLength(1);
  });

  it("only logs the decision when too little time is left to finish a failover", async () => {
    // Prepare
    const shard = threeNodeShard();
    await shard.start();
    shard.kill("p1");
    await shard.waitUntilStale("p1");
    const log = new RecordingLog();
    const { deps } = controller(shard, { log });

    // Act
    await new ControllerLoop(deps).run({
      shards: [shard.shard],
      once: true,
      remainingMs: () => 5000,
      stopBeforeMs: 100,
      actBudgetMs: 10_000,
    });

    // Assess
    const [line] = log.shardLines("info", shard.shard);
    expect(line?.attributes).toMatchObject({ decision: "failover", outcome: "deferred" });
    expect(await shard.aws.store.topology.read(shard.shard)).toMatchObject({ epoch: 1, status: "online" });
  });
});
