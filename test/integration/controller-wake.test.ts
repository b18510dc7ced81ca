import { afterAll, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { ControllerLoop } from "../../src/controller/loop.ts";
import type { Wake } from "../../src/core/wake.ts";
import { awsEnv } from "../support/aws.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * The controller's wake-up queue on the SQS emulator: what an agent sends reaches a long-polling
 * controller, and how long that takes (the figure in docs/controller.md#controller-wake-ups).
 */

const opened: AwsAdapters[] = [];

function adapters(prefix: string, createWakeQueue: boolean): AwsAdapters {
  const built = createAwsAdapters({ env: { ...awsEnv() }, queuePrefix: prefix, createWakeQueue });
  opened.push(built);
  return built;
}

afterAll(() => {
  for (const built of opened) built.destroy();
});

function aWake(overrides: Partial<Wake> = {}): Wake {
  return { shard: "s1", node: "n1", reason: "crash", sent_at: Date.now(), ...overrides };
}

describe("controller wake-ups", () => {
  it("delivers an agent's wake-up to a long-polling controller in tens of milliseconds", {
    timeout: 30_000,
  }, async () => {
    // Prepare
    const prefix = `w${Math.random().toString(36).slice(2, 8)}`;
    const controller = adapters(prefix, true);
    const agent = adapters(prefix, false);
    await controller.wake.receive(0);
    const latencies: number[] = [];

    // Act
    for (let sample = 0; sample < 20; sample++) {
      let returned = false;
      const polling = controller.wake.receive(20).finally(() => {
        returned = true;
      });
      // Negative check: the poll must not return on an empty queue; 20 ms of it pending also lets
      // the request reach the emulator (the client cannot see when it did).
      await holdsFor(() => !returned, "the poll pending on an empty queue", 20, 5);
      const sentAt = performance.now();
      expect(await agent.wake.send(aWake({ node: `n${sample}` }))).toBe(true);
      const received = await polling;
      latencies.push(performance.now() - sentAt);
      expect(received.map((wake) => wake.node)).toEqual([`n${sample}`]);
    }

    // Assess
    latencies.sort((a, b) => a - b);
    const median = latencies[10] ?? Number.NaN;
    console.log(
      `wake-up send -> receive: median ${median.toFixed(1)} ms, max ${latencies.at(-1)?.toFixed(1)} ms`,
    );
    expect(median).toBeLessThan(250);
    expect(await controller.wake.receive(0)).toEqual([]);
  });

  it("reports a missing queue to the sender without throwing", async () => {
    const agent = adapters(`m${Math.random().toString(36).slice(2, 8)}`, false);
    expect(await agent.wake.send(aWake())).toBe(false);
  });

  it("runs one cycle per woken shard, and one more for a shard woken while its cycle ran", async () => {
    // Prepare
    const cycles: string[] = [];
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const store = {
      shards: { list: async () => ({ shards: ["s1", "s2"] }) },
      heartbeats: {
        snapshot: async (shard: string) => {
          cycles.push(shard);
          if (cycles.length === 1) await gate;
          return { shard, nodes: [], replicaSets: {}, replicaSetVersions: {}, malformed: [] };
        },
      },
    };
    const noop = () => {};
    const loop = new ControllerLoop({
      store,
      clock: { now: () => Date.now() },
      config: { tickIntervalMs: 100, failureTimeoutMs: 1000, heartbeatIntervalMs: 250 },
      log: { debug: noop, info: noop, warn: noop, error: noop },
      metrics: { count: noop, flush: noop },
    } as unknown as ConstructorParameters<typeof ControllerLoop>[0]);

    // Act
    const first = loop.wake([aWake({ shard: "s1" }), aWake({ shard: "s1", node: "n2" })]);
    await waitFor(() => cycles.length === 1, "the first cycle of s1 under way", 2000, 5);
    const second = loop.wake([aWake({ shard: "s1" }), aWake({ shard: "s2" })]);
    release();
    await Promise.all([first, second]);

    // Assess
    expect(cycles.sort()).toEqual(["s1", "s1", "s2"]);
  });
});
