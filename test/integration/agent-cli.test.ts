import { type ChildProcess, spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture } from "../support/agent-harness.ts";
import { awsEnv, tableName } from "../support/aws.ts";
import { waitFor } from "../support/wait.ts";

const CLI = "src/cli/main.ts";

interface AgentProcess {
  readonly child: ChildProcess;
  readonly lines: Record<string, unknown>[];
  readonly stderr: string[];
  readonly exited: Promise<number | null>;
}

let fixture: AgentFixture;
const running: AgentProcess[] = [];

afterEach(async () => {
  for (const agent of running.splice(0)) {
    if (agent.child.exitCode === null) agent.child.kill("SIGKILL");
    await agent.exited;
  }
  await fixture.close();
});

/** `shardguard agent` as a child process, configured like an operator would: flags and variables. */
function spawnAgent(args: string[]): AgentProcess {
  const child = spawn(process.execPath, [CLI, "agent", ...args], {
    env: {
      ...process.env,
      ...awsEnv(),
      SHARDGUARD_TABLE: tableName(),
      SHARDGUARD_HEARTBEAT_INTERVAL_MS: "200",
      SHARDGUARD_FENCE_TIMEOUT_MS: "600",
      SHARDGUARD_FAILURE_TIMEOUT_MS: "1000",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: Record<string, unknown>[] = [];
  const stderr: string[] = [];
  createInterface({ input: child.stdout }).on("line", (line) => {
    try {
      lines.push(JSON.parse(line));
    } catch {
      lines.push({ raw: line });
    }
  });
  createInterface({ input: child.stderr }).on("line", (line) => stderr.push(line));
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  const agent = { child, lines, stderr, exited };
  running.push(agent);
  return agent;
}

describe("shardguard agent as a process", () => {
  it("keeps its node id across restarts and stops promptly on SIGTERM, even mid long poll", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [node] = await fixture.startRedis(1);
    if (!node) throw new Error("redis node missing");
    const stateDir = fixture.newStateDir();
    const args = ["--shard", fixture.shard, "--redis", node.address, "--state-dir", stateDir];
    const first = spawnAgent(args);
    const firstBeat = await waitFor(
      async () => (await fixture.snapshot()).nodes[0],
      "first heartbeat",
      20_000,
    );
    await waitFor(
      () => first.lines.some((line) => line.message === "command queue ready"),
      "long poll running",
    );

    // Act
    const signalledAt = Date.now();
    first.child.kill("SIGTERM");
    const firstCode = await first.exited;
    const stopMs = Date.now() - signalledAt;
    const second = spawnAgent(args);
    await waitFor(
      () => second.lines.find((line) => line.message === "agent starting"),
      "second start",
      20_000,
    );
    const secondBeat = await fixture.waitForHeartbeat(
      firstBeat.node_id,
      (hb) => hb.last_updated > firstBeat.last_updated,
      "heartbeat after restart",
    );
    second.child.kill("SIGTERM");
    const secondCode = await second.exited;

    // Assess
    expect(firstCode).toBe(0);
    expect(stopMs).toBeLessThan(3000);
    expect(first.lines.some((line) => line.message === "agent stopped")).toBe(true);
    expect(firstBeat.node_id).toMatch(/^node-[0-9a-f]{10}$/);
    expect(second.lines.find((line) => line.message === "agent starting")?.node).toBe(firstBeat.node_id);
    expect(secondBeat.node_address).toBe(node.address);
    expect((await fixture.snapshot()).nodes.map((hb) => hb.node_id)).toEqual([firstBeat.node_id]);
    expect(secondCode).toBe(0);
  });

  it("refuses to start with a node id other than the one its state dir holds", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [node] = await fixture.startRedis(1);
    if (!node) throw new Error("redis node missing");
    const stateDir = fixture.newStateDir();
    const base = ["--shard", fixture.shard, "--redis", node.address, "--state-dir", stateDir];
    const first = spawnAgent([...base, "--node-id", "alpha"]);
    await waitFor(() => first.lines.find((line) => line.message === "agent starting"), "first start", 20_000);
    first.child.kill("SIGTERM");
    await first.exited;

    // Act
    const second = spawnAgent([...base, "--node-id", "beta"]);
    const code = await second.exited;

    // Assess
    expect(code).toBe(1);
    expect(second.stderr.join("\n")).toMatch(/--node-id beta does not match node id alpha/);
  });

  it("names every bad flag and variable and exits 1", async () => {
    // Prepare
    fixture = new AgentFixture();

    // Act
    const agent = spawnAgent([
      "--shard",
      "bad shard!",
      "--redis",
      "localhost",
      "--fence-policy",
      "sometimes",
    ]);
    const code = await agent.exited;

    // Assess
    const message = agent.stderr.join("\n");
    expect(code).toBe(1);
    expect(message).toMatch(/--shard: must be 1-24 letters/);
    expect(message).toMatch(/--redis: must be host:port/);
    expect(message).toMatch(/--fence-policy: Invalid option/);
  });
});
