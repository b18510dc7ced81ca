import { monitorEventLoopDelay } from "node:perf_hooks";
import { Redis } from "ioredis";
import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture } from "../support/agent-harness.ts";
import {
  aPrimaryWithSentinelEndpoint,
  heartbeatGaps,
  SENTINEL_LOAD_TIMINGS as TIMINGS,
} from "../support/sentinel-agent.ts";
import { waitFor } from "../support/wait.ts";

/**
 * The Redis CVE-2022-36021 shape against the agent's Sentinel endpoint: patterns that a
 * backtracking matcher takes minutes over (100 stars, then a character no channel has) must cost
 * nothing when the topology moves; the agent's own cycle, which shares the thread, keeps its cadence.
 */

let fixture: AgentFixture;
const clients: Redis[] = [];

afterEach(async () => {
  for (const client of clients.splice(0)) client.disconnect();
  await fixture.close();
});

const MALICIOUS = `${"*".repeat(100)}X`;

function aSubscriber(port: number): Redis {
  const client = new Redis({ port, host: "127.0.0.1", maxRetriesPerRequest: 0, retryStrategy: () => null });
  client.on("error", () => {});
  clients.push(client);
  return client;
}

describe("the Sentinel endpoint's pattern subscriptions", () => {
  it("keep the agent's heartbeat on cadence while 100 malicious patterns are subscribed and the topology moves", {
    timeout: 60_000,
  }, async () => {
    // Prepare
    fixture = new AgentFixture();
    const { agent, port, primary } = await aPrimaryWithSentinelEndpoint(fixture);
    // 100 malicious patterns over four connections (64 subscriptions each at most); the first also
    // holds a pattern that matches the down/up events, which must still arrive.
    const messages: string[] = [];
    const subscribers = [0, 1, 2, 3].map(() => aSubscriber(port));
    for (const [index, subscriber] of subscribers.entries()) {
      const patterns = Array.from({ length: 25 }, (_, n) => `${MALICIOUS}${index * 25 + n}`);
      await subscriber.psubscribe(...patterns, ...(index === 0 ? ["?[os]down"] : []));
    }
    subscribers[0]?.on("pmessage", (pattern: string, channel: string) =>
      messages.push(`${pattern} ${channel}`),
    );
    const before = agent.heartbeats.written.length;
    const loop = monitorEventLoopDelay({ resolution: 10 });
    loop.enable();

    // Act: the shard goes down and comes back (+sdown, +odown, then -sdown, -odown).
    await fixture.setTopology(0, { epoch: 1, status: "failing_over", ...primary });
    await waitFor(() => messages.length >= 2, "+sdown and +odown published", 10_000);
    await fixture.setTopology(1, { epoch: 1, status: "online", ...primary });
    await waitFor(() => messages.length >= 4, "-sdown and -odown published", 10_000);
    await waitFor(
      () => agent.heartbeats.written.length >= before + 6,
      "six heartbeats after the topology moved",
      20_000,
    );
    loop.disable();

    // Assess
    const { maxGapMs, boundMs } = heartbeatGaps(agent, before);
    const maxDelayMs = loop.max / 1e6;
    console.log(
      `100 malicious patterns, topology moved twice: heartbeat gaps max ${Math.round(maxGapMs)} ms ` +
        `(bound ${boundMs}), event loop delay max ${Math.round(maxDelayMs)} ms`,
    );
    expect(messages.sort()).toEqual([
      "?[os]down +odown",
      "?[os]down +sdown",
      "?[os]down -odown",
      "?[os]down -sdown",
    ]);
    // The cycle shares the thread: no pause of the event loop may reach one heartbeat interval.
    expect(maxDelayMs).toBeLessThan(TIMINGS.heartbeatIntervalMs);
    expect(maxGapMs).toBeLessThan(boundMs);
    expect(agent.handle.status()).toMatchObject({ role: "primary", dbUp: true });
  });
});
