import { readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import { parseCommandBody } from "../../src/adapters/sqs-command-bus.ts";
import { startAgent } from "../../src/agent/agent.ts";
import { COMMAND_TYPES, type Command, MAX_COMMAND_TIMEOUT_MS } from "../../src/core/model.ts";
import type { Logger } from "../../src/core/observability.ts";
import type { CommandBus, ReceivedCommand } from "../../src/core/ports.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, FAST_TIMINGS, RecordingHeartbeatStore } from "../support/agent-harness.ts";

/**
 * Random and malformed SQS bodies through a real agent's command consumer for a bounded time
 * (SHARDGUARD_FUZZ_SECONDS, 3 s here; the seed is printed and SHARDGUARD_FUZZ_SEED replays it),
 * beside a real redis-server and DynamoDB Local (Guarantee 6: no SQS body can stall the agent's
 * cycle or exhaust its memory). The bodies come from a bus in this process, as fast as the agent
 * takes them, each parsed by the SQS bus's own `parseCommandBody`; a third of them are commands
 * with plausible and hostile fields (epochs around the topology's and at 2^53 - 1, huge
 * timeouts, other shards, other addresses).
 */

const SECONDS = Number(process.env.SHARDGUARD_FUZZ_SECONDS ?? 3);
const SEED = Number(process.env.SHARDGUARD_FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 31));
/** Heap growth (after a full GC) the fuzz may leave behind: the agent keeps at most 1,000 command ids. */
const HEAP_GROWTH_LIMIT_MB = 32;
const EPOCH = 3;
const TIMINGS = { ...FAST_TIMINGS, failureTimeoutMs: 3000 } as const;

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

function heapAfterGcMb(): number {
  gc();
  return process.memoryUsage().heapUsed / 2 ** 20;
}

let fixture: AgentFixture;

afterEach(async () => {
  await fixture.close();
});

/** Counts the agent's log lines by message and keeps none: the test's own memory stays flat. */
class CountingLogger implements Logger {
  readonly counts = new Map<string, number>();
  readonly applied: string[] = [];
  debug() {}
  info(message: string, attributes: Record<string, unknown> = {}) {
    this.#count(message);
    if (message === "command applied" && String(attributes.commandId).startsWith("check-")) {
      this.applied.push(String(attributes.commandId));
    }
  }
  warn(message: string) {
    this.#count(message);
  }
  error(message: string) {
    this.#count(message);
  }
  #count(message: string) {
    this.counts.set(message, (this.counts.get(message) ?? 0) + 1);
  }
  of(message: string): number {
    return this.counts.get(message) ?? 0;
  }
}

/** A command bus that hands the agent generated bodies from `start` to `stop`, and the queued ones. */
class FuzzBus implements CommandBus {
  received = 0;
  deleted = 0;
  released = 0;
  #batch = 0;
  #fuzzing = false;
  readonly #queued: string[] = [];
  readonly #bodies: fc.Arbitrary<string>;
  constructor(bodies: fc.Arbitrary<string>) {
    this.#bodies = bodies;
  }
  start(): void {
    this.#fuzzing = true;
  }
  stop(): void {
    this.#fuzzing = false;
  }
  enqueue(body: string): void {
    this.#queued.push(body);
  }
  async ensureQueue(): Promise<string> {
    return "fuzz";
  }
  async send(): Promise<void> {
    throw new Error("the fuzz bus only delivers");
  }
  async receive(
    _shard: string,
    _node: string,
    options: { signal?: AbortSignal } = {},
  ): Promise<ReceivedCommand[]> {
    const bodies = this.#queued.splice(0, 10);
    if (bodies.length === 0 && this.#fuzzing) {
      bodies.push(...fc.sample(this.#bodies, { seed: SEED + this.#batch++, numRuns: 10 }));
    }
    if (bodies.length === 0) {
      // An empty long poll: short, and over at once when the agent stops.
      await sleep(20, undefined, { signal: options.signal }).catch(() => {});
      return [];
    }
    // A receive is I/O: the agent's other loops run between two of them.
    await sleep(0);
    return bodies.map((body) => {
      this.received++;
      const { command, error } = parseCommandBody(body);
      return { command, error, receiptHandle: String(this.received), receiveCount: 1, body };
    });
  }
  async delete(): Promise<void> {
    this.deleted++;
  }
  async redeliverAfter(): Promise<void> {
    this.released++;
  }
}

/**
 * Bodies: random text and JSON; commands with every field drawn from hostile values (most fail
 * the schema); and, three times as often, well-formed commands whose epoch, target, timing and
 * type are drawn around what the topology holds (most pass the schema and meet the screen).
 */
function bodies(shard: string, address: string): fc.Arbitrary<string> {
  const epoch = fc.oneof(
    { arbitrary: fc.constantFrom(EPOCH - 1, EPOCH, EPOCH + 1, Number.MAX_SAFE_INTEGER), weight: 4 },
    { arbitrary: fc.constantFrom(2 ** 53, -1, 0.5), weight: 1 },
    { arbitrary: fc.integer(), weight: 1 },
  );
  const issuedAt = fc.integer({ min: -120_000, max: 120_000 }).map((offset) => Date.now() + offset);
  const timeout = fc.oneof(
    { arbitrary: fc.integer({ min: 1, max: 5000 }), weight: 4 },
    { arbitrary: fc.constantFrom(MAX_COMMAND_TIMEOUT_MS, 86_400_000_000, 0, -5), weight: 1 },
  );
  const primary = fc.record({
    node_id: fc.constantFrom("n1", "n2", "node-x"),
    address: fc.constantFrom(address, "203.0.113.7:6379"),
  });
  const plausible = fc.record({
    type: fc.constantFrom(...COMMAND_TYPES),
    shard: fc.oneof(
      { arbitrary: fc.constant(shard), weight: 9 },
      { arbitrary: fc.constant("other"), weight: 1 },
    ),
    epoch,
    command_id: fc.string({ minLength: 1, maxLength: 40 }),
    issued_at: issuedAt,
    primary,
    timeout_ms: timeout,
  });
  const hostile = fc.record(
    {
      type: fc.oneof(fc.constantFrom(...COMMAND_TYPES), fc.string({ maxLength: 12 })),
      shard: fc.oneof(fc.constant(shard), fc.string({ maxLength: 30 })),
      epoch: fc.oneof(epoch, fc.double()),
      command_id: fc.string({ maxLength: 140 }),
      issued_at: fc.oneof(issuedAt, fc.double(), fc.integer()),
      primary: fc.oneof(primary, fc.json({ maxDepth: 2 })),
      timeout_ms: fc.oneof(timeout, fc.double()),
    },
    { requiredKeys: [] },
  );
  return fc.oneof(
    { arbitrary: plausible.map((value) => JSON.stringify(value)), weight: 6 },
    { arbitrary: hostile.map((value) => JSON.stringify(value)), weight: 2 },
    { arbitrary: fc.string({ maxLength: 300 }), weight: 1 },
    { arbitrary: fc.string({ unit: "binary", maxLength: 300 }), weight: 1 },
    { arbitrary: fc.json({ maxDepth: 4 }), weight: 1 },
    {
      arbitrary: fc.constantFrom("[".repeat(50_000), `{"type":"${"A".repeat(200_000)}"}`, "null", "{}", ""),
      weight: 1,
    },
  );
}

/** One SET on the database: its latency, or Infinity when it fails (a paused database holds it). */
async function writeLatencyMs(node: RedisNode): Promise<number> {
  const client = node.client({ maxRetriesPerRequest: 0, commandTimeout: 2000 });
  const started = performance.now();
  try {
    await client.set("fuzz-probe", String(started));
    return performance.now() - started;
  } catch (error) {
    // A refusal is an answer: the agent's write fence (a heartbeat write slower than the fence
    // timeout on a loaded host: a fresh-clone CI run at load 19) answers NOREPLICAS at once. Only
    // no answer (a timeout, a lost connection) is a stalled database.
    if (error instanceof Error && error.name === "ReplyError") return performance.now() - started;
    return Number.POSITIVE_INFINITY;
  } finally {
    client.disconnect();
  }
}

describe("the command consumer under fuzzed SQS bodies", () => {
  it(`survives ${SECONDS} s of random and malformed bodies: never stops, obeys none that does not fit, memory bounded`, {
    timeout: SECONDS * 1000 + 60_000,
  }, async () => {
    // Prepare: one primary, adopted by the topology at epoch 3.
    fixture = new AgentFixture();
    const [node] = await fixture.startRedis(1);
    if (!node) throw new Error("redis node missing");
    await fixture.setTopology(undefined, {
      epoch: EPOCH,
      primary_node_id: "n1",
      primary_address: node.address,
      status: "online",
    });
    const logger = new CountingLogger();
    const heartbeats = new RecordingHeartbeatStore(fixture.aws.store.heartbeats);
    const bus = new FuzzBus(bodies(fixture.shard, node.address));
    const stateDir = fixture.newStateDir();
    const agent = await startAgent(
      { shard: fixture.shard, redis: node.address, stateDir, nodeId: "n1", ...TIMINGS },
      { ...fixture.depsFrom(fixture.aws, heartbeats, logger), commands: bus },
    );
    // The agent starts fenced until its first cycle read the topology: the fuzz starts once it serves.
    const deadline = Date.now() + 15_000;
    while ((await writeLatencyMs(node)) === Number.POSITIVE_INFINITY && Date.now() < deadline)
      await sleep(50);
    bus.start();
    console.log(`command fuzz: seed ${SEED} (SHARDGUARD_FUZZ_SEED replays it), ${SECONDS} s`);
    let heapAtStart = 0;
    let highestEpochSeen = 0;
    let slowestWriteMs = 0;

    // Act
    try {
      const started = performance.now();
      let warmedUp = false;
      while (performance.now() - started < SECONDS * 1000) {
        if (!warmedUp && performance.now() - started > Math.min(1000, (SECONDS * 1000) / 3)) {
          heapAtStart = heapAfterGcMb();
          warmedUp = true;
        }
        slowestWriteMs = Math.max(slowestWriteMs, await writeLatencyMs(node));
        highestEpochSeen = Math.max(highestEpochSeen, agent.status().epoch);
        await sleep(100);
      }
      bus.stop();
      // The consumer is still there: a controller's REPORT at the topology's epoch is obeyed.
      const check: Command = {
        type: "REPORT",
        shard: fixture.shard,
        epoch: EPOCH,
        command_id: "check-after-fuzz",
        issued_at: Date.now(),
        timeout_ms: 1000,
      };
      bus.enqueue(JSON.stringify(check));
      const checkDeadline = Date.now() + 15_000;
      while (!logger.applied.includes("check-after-fuzz") && Date.now() < checkDeadline) await sleep(50);
    } finally {
      await agent.stop();
    }
    const heapGrowthMb = heapAfterGcMb() - heapAtStart;
    const written = heartbeats.written.map((heartbeat) => heartbeat.agent_updated ?? 0);
    const gaps = written.slice(1).map((at, index) => (at - (written[index] ?? at)) / 1000);
    const state = JSON.parse(readFileSync(join(stateDir, "state.json"), "utf8"));
    const handled =
      logger.of("command applied") +
      logger.of("command ignored") +
      logger.of("command refused; deleted") +
      logger.of("command rejected; left for the dead-letter queue") +
      logger.of("command failed; left for redelivery");
    console.log(
      `command fuzz: ${bus.received} bodies, ${JSON.stringify(Object.fromEntries(logger.counts))}; ` +
        `slowest write ${Math.round(slowestWriteMs)} ms, longest heartbeat gap ${Math.round(Math.max(0, ...gaps))} ms, ` +
        `heap after GC ${heapAtStart.toFixed(1)} MB + ${heapGrowthMb.toFixed(1)} MB; highest epoch ${highestEpochSeen}`,
    );

    // Assess
    expect(highestEpochSeen).toBeLessThanOrEqual(EPOCH);
    expect(state.highest_epoch).toBeLessThanOrEqual(EPOCH);
    expect(slowestWriteMs).toBeLessThan(1000);
    expect(logger.applied).toEqual(["check-after-fuzz"]);
    expect(handled).toBe(bus.received);
    expect(bus.received).toBeGreaterThan(100);
    expect(Math.max(...gaps)).toBeLessThan(TIMINGS.failureTimeoutMs);
    expect(heapGrowthMb).toBeLessThan(HEAP_GROWTH_LIMIT_MB);
  });
});
