import { type ChildProcess, spawn } from "node:child_process";
import { connect, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture } from "../support/agent-harness.ts";
import { waitFor } from "../support/wait.ts";

/**
 * An in-process agent with its Sentinel endpoint on, a real redis-server and the local stack:
 * a flood of idle connections, garbage and oversized requests costs error replies and closed
 * connections, never the agent nor the cadence of its heartbeats.
 */

let fixture: AgentFixture;
let flood: ChildProcess | undefined;
const sockets: Socket[] = [];

afterEach(async () => {
  flood?.kill("SIGKILL");
  flood = undefined;
  for (const socket of sockets.splice(0)) socket.destroy();
  await fixture.close();
});

/**
 * The abusive clients run in their own process, as they would in production: their side of 2200
 * connections must not load the event loop of the agent under test. Prints "ready" once every
 * connection is open and every garbage request sent; holds the idle ones until killed.
 */
const FLOOD = `
const net = require("node:net");
const port = Number(process.argv[1]);
const open = (bytes) => new Promise((resolve) => {
  const socket = net.connect(port, "127.0.0.1", () => { if (bytes) socket.write(bytes); resolve(socket); });
  socket.on("error", () => resolve(socket));
});
(async () => {
  const idle = [];
  for (let i = 0; i < 2000; i += 100) idle.push(...(await Promise.all(Array.from({ length: 100 }, () => open()))));
  const huge = Buffer.concat([Buffer.from("*1\\r\\n$900000000\\r\\n"), Buffer.alloc(128 * 1024, 120)]);
  await Promise.all(Array.from({ length: 200 }, (_, i) => open(i % 2 === 0 ? huge : "GARBAGE \\x00\\xff\\r\\n")));
  const open_ = idle.filter((socket) => !socket.destroyed).length;
  process.stdout.write("ready " + open_ + "\\n");
  setInterval(() => {}, 60000);
})();
`;

function startFlood(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["-e", FLOOD, String(port)], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    flood = child;
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes("\n")) resolve(output.trim());
    });
    child.on("exit", (code) => reject(new Error(`flood process exited with ${code} before it was ready`)));
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

/** Production-like guard timings: a heartbeat gap past the fence timeout would fence this primary. */
const TIMINGS = { heartbeatIntervalMs: 200, fenceTimeoutMs: 2000, failureTimeoutMs: 3000 } as const;

describe("the agent's Sentinel endpoint under abuse", () => {
  it("keeps heartbeating on cadence through 2000 idle connections, garbage and oversized requests", {
    timeout: 60_000,
  }, async () => {
    // Prepare
    fixture = new AgentFixture();
    const [node] = await fixture.startRedis(1);
    if (!node) throw new Error("redis node missing");
    const agent = await fixture.startAgent(node, { nodeId: "n1", sentinelPort: 0, ...TIMINGS });
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
    const ready = await startFlood(port);
    const answer = await ask(port, "*1\r\n$4\r\nROLE\r\n");
    await waitFor(
      () => agent.heartbeats.written.length >= before + 10,
      "10 heartbeats written during the flood",
      20_000,
    );
    const floodMs = Date.now() - floodStarted;

    // Assess
    expect(stored.sentinel_address).toBe(address);
    expect(ready).toBe("ready 2000");
    expect(answer).toMatch(/^\*2\r\n\$8\r\nsentinel\r\n/);
    const written = agent.heartbeats.written.slice(before - 1).map((hb) => (hb.agent_updated ?? 0) / 1000);
    const gaps = written.slice(1).map((at, index) => at - (written[index] as number));
    console.log(
      `heartbeat gaps during the flood (ms): max ${Math.round(Math.max(...gaps))}, flood ${floodMs} ms`,
    );
    expect(Math.max(...gaps)).toBeLessThan(TIMINGS.fenceTimeoutMs);
    expect(agent.handle.status()).toMatchObject({ role: "primary", fenced: false, dbUp: true });
  });
});
