import type { AgentFixture, TestAgent } from "./agent-harness.ts";

/** Timings of the Sentinel endpoint's load tests: a primary writes at 1 s, fences at 2.5 s. */
export const SENTINEL_LOAD_TIMINGS = {
  heartbeatIntervalMs: 500,
  fenceTimeoutMs: 2500,
  failureTimeoutMs: 3000,
} as const;

/**
 * One redis-server and its agent, the shard online with it as primary and the Sentinel endpoint
 * on: what the endpoint's abuse tests start from.
 */
export async function aPrimaryWithSentinelEndpoint(fixture: AgentFixture): Promise<{
  agent: TestAgent;
  port: number;
  primary: { primary_node_id: string; primary_address: string };
}> {
  const [node] = await fixture.startRedis(1);
  if (!node) throw new Error("redis node missing");
  const primary = { primary_node_id: "n1", primary_address: node.address };
  await fixture.setTopology(undefined, { epoch: 0, status: "online", ...primary });
  const agent = await fixture.startAgent(node, { nodeId: "n1", sentinelPort: 0, ...SENTINEL_LOAD_TIMINGS });
  const port = Number((agent.handle.sentinelAddress as string).split(":")[1]);
  await fixture.waitForHeartbeat("n1", (hb) => hb.role === "primary", "serving as primary");
  return { agent, port, primary };
}

/**
 * Gaps between the heartbeats written from index `from` on, and the bound they must stay under:
 * the fence timeout, past which the primary would fence its own writes. (A primary writes at its
 * keepalive, 1 s here, on the first cycle past it; the rest is the table's latency, which on a
 * loaded two-core machine is most of the margin.)
 */
export function heartbeatGaps(agent: TestAgent, from: number): { maxGapMs: number; boundMs: number } {
  const written = agent.heartbeats.written
    .slice(Math.max(0, from - 1))
    .map((hb) => (hb.agent_updated ?? 0) / 1000);
  const gaps = written.slice(1).map((at, index) => at - (written[index] as number));
  return { maxGapMs: Math.max(...gaps), boundMs: SENTINEL_LOAD_TIMINGS.fenceTimeoutMs };
}
