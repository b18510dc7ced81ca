import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import { type AgentHandle, startAgent } from "../../src/agent/agent.ts";
import type { AgentOptionsInput } from "../../src/agent/options.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import type { HeartbeatStore, ShardSnapshot } from "../../src/core/ports.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, FAST_TIMINGS, RecordingLogger } from "../support/agent-harness.ts";
import { waitFor } from "../support/wait.ts";

/**
 * The pause gate (issue 36): a primary's agent stopped (SIGSTOP) while its cycle's topology read
 * was in flight resumed with an answer from before the stop, while the controller had marked the
 * shard offline during it; the cycle stamped its heartbeat "now" and wrote it with the write fence
 * down (chaos-agent-stall: "fenced at ; resumed at …, first heartbeat after at +6 ms"). A cycle
 * that finds the process paused after its read began reads the topology again first.
 */

let fixture: AgentFixture;
let agent: AgentHandle | undefined;

afterEach(async () => {
  await agent?.stop();
  agent = undefined;
  await fixture.close();
});

/** Stops this thread, timers and I/O included, the way SIGSTOP stops a process. */
function freezeThread(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** The agent's store: records whether the fence was up at each heartbeat write; can hold one read. */
class GatedStore implements HeartbeatStore {
  readonly written: Array<{ heartbeat: HeartbeatInput; fenced: boolean }> = [];
  reads = 0;
  fenced: () => boolean = () => false;
  #hold: (() => Promise<void>) | undefined;
  readonly #inner: HeartbeatStore;
  constructor(inner: HeartbeatStore) {
    this.#inner = inner;
  }
  /** The next snapshot answers, then `hold` runs before the agent gets the answer. */
  holdNextRead(hold: () => Promise<void>): void {
    this.#hold = hold;
  }
  async snapshot(shard: string): Promise<ShardSnapshot> {
    this.reads++;
    const snapshot = await this.#inner.snapshot(shard);
    const hold = this.#hold;
    this.#hold = undefined;
    if (hold) await hold();
    return snapshot;
  }
  put(heartbeat: HeartbeatInput): Promise<void> {
    this.written.push({ heartbeat, fenced: this.fenced() });
    return this.#inner.put(heartbeat);
  }
  deleteNode(shard: string, nodeId: string): Promise<void> {
    return this.#inner.deleteNode(shard, nodeId);
  }
}

/** The agent's store timeout, unless a test says otherwise. */
const STORE_TIMEOUT_MS = 1000;

/**
 * n1 alone, primary of an online shard, policy keep-serving: nothing but the topology fences it
 * (no fence timeout), so a fence seen is the topology's.
 */
async function primaryAlone(
  timings: Partial<AgentOptionsInput> = {},
): Promise<{ node: RedisNode; store: GatedStore; logger: RecordingLogger }> {
  fixture = new AgentFixture();
  const node = await fixture.onlinePrimary("n1");
  const store = new GatedStore(fixture.aws.store.heartbeats);
  const logger = new RecordingLogger();
  const handle = await startAgent(
    {
      shard: fixture.shard,
      redis: node.address,
      stateDir: fixture.newStateDir(),
      nodeId: "n1",
      fencePolicy: "keep-serving",
      ...FAST_TIMINGS,
      storeTimeoutMs: STORE_TIMEOUT_MS,
      ...timings,
    },
    fixture.depsFrom(fixture.aws, store, logger),
  );
  agent = handle;
  store.fenced = () => handle.status().fenced;
  await waitFor(() => store.written.some((w) => w.heartbeat.role === "primary"), "n1's first heartbeat");
  return { node, store, logger };
}

/** The controller marks the shard offline (nobody eligible), as it does for a silent primary. */
function markOffline(): Promise<void> {
  return fixture.setTopology(0, { epoch: 1, status: "offline" });
}

const PAUSE_MESSAGE = "the agent paused after its topology read: no heartbeat goes out on that read";

describe("the pause gate", () => {
  it.each([
    { read: "answered before it", pauseMs: 3 * FAST_TIMINGS.heartbeatIntervalMs },
    // The read's timeout fires first on resume (timers before I/O): the cycle goes on without a
    // topology, on the confirmation it read last (the other way chaos-agent-stall failed).
    { read: "timed out during it", pauseMs: STORE_TIMEOUT_MS + FAST_TIMINGS.heartbeatIntervalMs },
  ])(
    "a primary paused with its topology read $read fences before its next heartbeat goes out",
    async ({ pauseMs }) => {
      // Prepare
      const { store, logger } = await primaryAlone();
      let resumedAt = 0;

      // Act: the read answers "online, n1"; the shard goes offline; the agent's process stops.
      store.holdNextRead(async () => {
        await markOffline();
        freezeThread(pauseMs);
        resumedAt = fixture.aws.clock.now();
        await delay(0); // after the timers due on resume
      });
      const first = await waitFor(
        () =>
          store.written.find((w) => resumedAt > 0 && (w.heartbeat.agent_updated ?? 0) / 1000 >= resumedAt),
        "n1's first heartbeat stamped after the pause",
        10_000,
        10,
      );

      // Assess
      expect(first, JSON.stringify(logger.lines.slice(-10))).toMatchObject({
        fenced: true,
        heartbeat: { role: "primary", db_status: "up" },
      });
      expect(logger.find(PAUSE_MESSAGE)?.attributes).toMatchObject({ rereadNow: true });
      expect(Number(logger.find(PAUSE_MESSAGE)?.attributes.pausedMs)).toBeGreaterThanOrEqual(pauseMs - 50);
      expect(logger.find(/^writes fenced/)?.attributes.reason).toMatch(/offline/);
    },
  );

  it("a slow topology read is no pause: the heartbeat goes out on it, without a second read", async () => {
    // Prepare: a store timeout far above the read's time, and a cycle (the pause threshold) that a
    // loaded machine's scheduling does not reach.
    const heartbeatIntervalMs = 500;
    const { store, logger } = await primaryAlone({ heartbeatIntervalMs, storeTimeoutMs: 10_000 });
    let answeredAt = 0;
    const slowMs = 3 * heartbeatIntervalMs;

    // Act: the read takes three cycles to answer, the process running all along.
    store.holdNextRead(async () => {
      await delay(slowMs);
      answeredAt = fixture.aws.clock.now();
    });
    const readsBefore = store.reads;
    const next = await waitFor(
      () =>
        store.written.find((w) => answeredAt > 0 && (w.heartbeat.agent_updated ?? 0) / 1000 >= answeredAt),
      "n1's heartbeat after the slow read",
      10_000,
      10,
    );

    // Assess
    expect(next).toMatchObject({ fenced: false, heartbeat: { role: "primary", db_status: "up" } });
    expect(store.reads - readsBefore, JSON.stringify(logger.lines.slice(-10))).toBe(1);
    expect(logger.find(PAUSE_MESSAGE)).toBeUndefined();
  });
});
