import { connect, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture, FAST_TIMINGS, waitFor } from "../support/agent-harness.ts";

/**
 * An in-process agent with its Sentinel endpoint on, a real redis-server and the local stack:
 * a flood of idle connections, garbage and oversized requests costs error replies and closed
 * connections, never the agent nor the cadence of its heartbeats.
 */

let fixture: AgentFixture;
const sockets: Socket[] = [];

afterEach(async () => {
  for (const socket of sockets.splice(0)) socket.destroy();
  await fixture.close();
});

function open(port: number, bytes?: string | Buffer): Promise<Socket> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1", () => {
      if (bytes !== undefined) socket.write(bytes);
      resolve(socket);
    });
    socket.on("error", () => {});
    sockets.push(socket);
  });
}

function ask(port: number, bytes: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, "127.0.0.1", () => socket.write(bytes));
    sockets.push(socket);
    let text = "";
    socket.on("data", (chunk) => {
      text += chunk.toString();
      if (text.endsWith("\r\n")) resolve(text);
    });
    socket.on("error", reject);
  });
}

describe("the agent's Sentinel endpoint under abuse", () => {
  it("keeps heartbeating on cadence through 2000 idle connections, garbage and oversized requests", {
    timeout: 60_000,
  }, async () => {
    // Prepare
    fixture = new AgentFixture();
    const [node] = await fixture.startRedis(1);
    if (!node) throw new Error("redis node missing");
    const agent = await fixture.startAgent(node, { nodeId: "n1", sentinelPort: 0 });
    const address = agent.handle.sentinelAddress as string;
    const port = Number(address.split(":")[1]);
    const stored = await fixture.waitForHeartbeat(
      "n1",
      (hb) => hb.sentinel_address !== undefined,
      "endpoint announced",
    );
    const before = agent.heartbeats.written.length;

    // Act
    const floodStarted = Date.now();
    const idle = await Promise.all(Array.from({ length: 2000 }, () => open(port)));
    const garbage = await Promise.all(
      Array.from({ length: 200 }, (_, index) =>
        open(
          port,
          index % 2 === 0
            ? Buffer.concat([Buffer.from("*1\r\n$900000000\r\n"), Buffer.alloc(128 * 1024, 120)])
            : "GARBAGE \x00\xff\r\n",
        ),
      ),
    );
    const answer = await ask(port, "*1\r\n$4\r\nROLE\r\n");
    await waitFor(
      () => agent.heartbeats.written.length >= before + 10,
      "10 heartbeats written during the flood",
      10_000,
    );
    const floodMs = Date.now() - floodStarted;

    // Assess
    expect(stored.sentinel_address).toBe(address);
    expect(idle.filter((socket) => !socket.destroyed)).toHaveLength(2000);
    expect(garbage.length).toBe(200);
    expect(answer).toMatch(/^\*2\r\n\$8\r\nsentinel\r\n/);
    const written = agent.heartbeats.written.slice(before - 1).map((hb) => (hb.agent_updated ?? 0) / 1000);
    const gaps = written.slice(1).map((at, index) => at - (written[index] as number));
    console.log(
      `heartbeat gaps during the flood (ms): max ${Math.round(Math.max(...gaps))}, flood ${floodMs} ms`,
    );
    // A gap past the failure timeout would look like a dead primary to the controller.
    expect(Math.max(...gaps)).toBeLessThan(FAST_TIMINGS.failureTimeoutMs);
    expect(agent.handle.status()).toMatchObject({ role: "primary", fenced: false, dbUp: true });
  });
});
