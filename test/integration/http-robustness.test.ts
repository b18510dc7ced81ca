import { monitorEventLoopDelay } from "node:perf_hooks";
import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture } from "../support/agent-harness.ts";
import { liveMemoryMb, runJsonClient } from "../support/client-process.ts";
import { heartbeatGaps, SENTINEL_LOAD_TIMINGS as TIMINGS } from "../support/sentinel-agent.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Issue 33's "done when" for the HTTP endpoint (docs/http.md#bad-input): bad input gets a clear
 * status (unknown path 404, a POST 405, 64 KiB of headers or a 20,000-byte path 431), and 1,000
 * slowloris connections from one address, with that bad input from another, neither stall the agent's
 * cycle (event loop, heartbeat gaps), nor grow its memory, nor turn a load balancer's checks away
 * (the checker, on a third address, gets its 200 on /primary throughout). The hostile client runs in a
 * process of its own (test/support/http-abuse-client.ts); the agent runs in this one, so what it costs
 * shows in this process's event loop and memory.
 */

const SECONDS = 10;
const LIVE_GROWTH_LIMIT_MB = 32;

let fixture: AgentFixture;

afterEach(async () => {
  await fixture.close();
});

function runAbuseClient(host: string, port: number) {
  return runJsonClient<{
    slowOpened: number;
    slowMaxOpenAtOnce: number;
    requests: number;
    statuses: Record<string, number>;
  }>("test/support/http-abuse-client.ts", [host, String(port), String(SECONDS), "127.0.0.2", "127.0.0.3"]);
}

describe("the HTTP endpoint under bad input and a slowloris crowd", () => {
  it(`answers clearly, keeps the checker served and the cycle intact for ${SECONDS} s of 1,000 slow connections`, {
    timeout: SECONDS * 1000 + 60_000,
  }, async () => {
    // Prepare: a primary with its HTTP endpoint, on 127.0.0.1.
    fixture = new AgentFixture();
    const [node] = await fixture.startRedis(1);
    if (!node) throw new Error("redis node missing");
    const primary = { primary_node_id: "n1", primary_address: node.address };
    await fixture.setTopology(undefined, { epoch: 0, status: "online", ...primary });
    const agent = await fixture.startAgent(node, { nodeId: "n1", httpPort: 0, ...TIMINGS });
    const address = agent.handle.httpAddress as string;
    const [host = "127.0.0.1", port = "0"] = address.split(":");
    const check = async () => {
      const response = await fetch(`http://${address}/primary`, { signal: AbortSignal.timeout(3000) });
      await response.text();
      return response.status;
    };
    await waitFor(async () => (await check()) === 200, "/primary answering 200", 20_000);
    const before = agent.heartbeats.written.length;
    const baselineLive = liveMemoryMb();
    const loop = monitorEventLoopDelay({ resolution: 10 });
    loop.enable();

    // Act: the crowd, and a checker like HAProxy's (inter 500) on the side.
    const abuse = runAbuseClient(host, Number(port));
    const checks: Array<number | string> = [];
    let checking = true;
    const checker = (async () => {
      while (checking) {
        checks.push(await check().catch((error: Error) => error.name));
        await new Promise((next) => setTimeout(next, 500));
      }
    })();
    const counts = await abuse;
    checking = false;
    await checker;
    loop.disable();
    await waitFor(
      () => agent.heartbeats.written.length >= before + 3,
      "heartbeats written during and after the crowd",
      10_000,
    );
    // Live memory once the crowd is gone and the agent has cycled on: what a leak would keep. (Taken
    // the moment the crowd's process exited, sockets the server had not closed yet still held their
    // buffers: +48 MB once in a fresh-clone CI run, +18-21 MB in two runs before.)
    // A leak keeps what it took; buffers of sockets still closing are given back within seconds:
    // the growth is read until it is within the limit, or for 15 s (+52 MB once at the first
    // reading in a full fresh-clone run on a loaded machine).
    let liveGrowthMb = liveMemoryMb() - baselineLive;
    const firstGrowthMb = liveGrowthMb;
    await waitFor(
      () => {
        liveGrowthMb = liveMemoryMb() - baselineLive;
        return liveGrowthMb < LIVE_GROWTH_LIMIT_MB;
      },
      "live memory back within the limit",
      15_000,
      500,
    ).catch(() => undefined);

    // Assess
    const { maxGapMs, boundMs } = heartbeatGaps(agent, before);
    const p99 = loop.percentile(99) / 1e6;
    const max = loop.max / 1e6;
    console.log(
      `http crowd: ${JSON.stringify(counts)}; checker ${checks.filter((status) => status === 200).length}/${checks.length} ` +
        `answered 200; heartbeat gaps max ${Math.round(maxGapMs)} ms (bound ${boundMs}); event loop p99 ` +
        `${Math.round(p99)} ms, max ${Math.round(max)} ms; live memory after a collection ` +
        `${liveGrowthMb >= 0 ? "+" : ""}${liveGrowthMb.toFixed(1)} MB (first reading ${firstGrowthMb.toFixed(1)} MB)`,
    );
    // Bad input, each with its own clear status, none unanswered.
    expect(counts.statuses["404"]).toBeGreaterThan(0);
    expect(counts.statuses["405"]).toBeGreaterThan(0);
    expect(counts.statuses["431"]).toBeGreaterThan(0);
    expect(Object.keys(counts.statuses).sort()).toEqual(["404", "405", "431"]);
    // The crowd was a crowd: 1,000 at once asked for, the rest turned away per address.
    expect(counts.slowOpened).toBeGreaterThanOrEqual(1000);
    // The load balancer's checks were never turned away.
    expect(checks.length).toBeGreaterThanOrEqual(SECONDS);
    expect(checks.every((status) => status === 200)).toBe(true);
    // The cycle shares the thread.
    expect(p99).toBeLessThan(TIMINGS.heartbeatIntervalMs);
    expect(max).toBeLessThan(TIMINGS.fenceTimeoutMs);
    expect(maxGapMs).toBeLessThan(boundMs);
    expect(liveGrowthMb).toBeLessThan(LIVE_GROWTH_LIMIT_MB);
    expect(agent.handle.status()).toMatchObject({ role: "primary", dbUp: true });
  });
});
