import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { type Database, type DialOptions, RedisLink, readReplicationInfo } from "../../src/agent/database.ts";
import { parseAgentOptions } from "../../src/agent/options.ts";
import { PrimaryProbe, type ProbeContext } from "../../src/agent/primary-probe.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import { Mutex } from "../../src/agent/scheduling.ts";
import { StateDir } from "../../src/agent/state-dir.ts";
import type { Wake } from "../../src/core/wake.ts";
import { type RedisNode, startRedisNodes } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, RecordingLogger } from "../support/agent-harness.ts";
import { awsEnv } from "../support/aws.ts";
import { waitFor } from "../support/wait.ts";

/**
 * A replica's probe of its primary, against real redis-server processes: the replica's vote in
 * `decide()` ("unreachable": the primary did not answer within the probe timeout) must come from a
 * probe that asked, never from a connection opened a moment before.
 */

const PROBE_TIMEOUT_MS = 500;
let nodes: RedisNode[] = [];
let probe: PrimaryProbe | undefined;
let fixture: AgentFixture | undefined;
let controllerAws: AwsAdapters | undefined;
let agentAws: AwsAdapters | undefined;
const stateDirs: StateDir[] = [];

afterEach(async () => {
  probe?.close();
  probe = undefined;
  for (const dir of stateDirs.splice(0)) {
    dir.release();
    rmSync(dir.dir, { recursive: true, force: true });
  }
  for (const node of fixture?.nodes ?? []) node.signal("SIGCONT");
  await fixture?.close();
  fixture = undefined;
  for (const built of [controllerAws, agentAws]) built?.destroy();
  controllerAws = undefined;
  agentAws = undefined;
  for (const node of nodes) {
    node.signal("SIGCONT");
    await node.stop();
  }
  nodes = [];
});

/** What the probe reads of its agent; the paths these tests take change nothing in it. */
function probeContext(): ProbeContext {
  const state = StateDir.open(mkdtempSync(join(tmpdir(), "shardguard-probe-test-")), {
    shard: "s1",
    nodeId: "n2",
    now: Date.now(),
  });
  stateDirs.push(state);
  return {
    options: parseAgentOptions({ shard: "s1", redis: "127.0.0.1:1" }),
    nodeId: "n2",
    // Only the probe's own connection is used on these paths: dialled as the agent's database would.
    db: {
      dial: (address: string, options: DialOptions) => new RedisLink(address, options),
    } as Partial<Database> as Database,
    logger: new RecordingLogger(),
    roleLock: new Mutex(),
    roleGeneration: 0,
    lastInfo: undefined,
    lastInfoGeneration: -1,
    heartbeatsWritten: 0,
    lastTopology: undefined,
    highestEpoch: 0,
    epochContext: {},
    wakeHeartbeat: () => {},
    monotonicNow: () => performance.now(),
    state,
  };
}

async function withReplicaOf(replica: RedisNode, primary: RedisNode): Promise<void> {
  const client = replica.client();
  try {
    await client.replicaof("127.0.0.1", primary.port);
  } finally {
    client.disconnect();
  }
}

/** A primary and a replica linked to it; the replica's INFO as its agent reads it. */
async function linkedPair(): Promise<{ primary: RedisNode; mine: ReplicationInfo }> {
  nodes = await startRedisNodes(2);
  const [primary, replica] = nodes;
  if (!primary || !replica) throw new Error("redis nodes missing");
  const client = replica.client();
  try {
    await client.replicaof("127.0.0.1", primary.port);
    const mine = await waitFor(async () => {
      const info = await readReplicationInfo(client);
      return info.primary?.link === "up" ? info : undefined;
    }, "replica linked");
    return { primary, mine };
  } finally {
    client.disconnect();
  }
}

describe("a replica's probe of its primary", () => {
  it("answers ok on the cycle its connection is opened, from a live primary", async () => {
    // Prepare
    const { primary, mine } = await linkedPair();
    probe = new PrimaryProbe(probeContext(), PROBE_TIMEOUT_MS);

    // Act: the agent's cycle right after pointing its replica at the primary.
    probe.track(primary.address);
    const result = await probe.probe(mine);

    // Assess
    expect(result).toBe("ok");
  });

  it("says unreachable within the probe timeout when a hung primary does not answer", async () => {
    // Prepare
    const { primary, mine } = await linkedPair();
    probe = new PrimaryProbe(probeContext(), PROBE_TIMEOUT_MS);
    primary.signal("SIGSTOP");

    // Act
    const started = performance.now();
    probe.track(primary.address);
    const first = await probe.probe(mine);
    const tookMs = performance.now() - started;
    const second = await probe.probe(mine);

    // Assess: the first answer waits out the timeout, never longer; later ones do not wait again.
    expect(first).toBe("unreachable");
    expect(tookMs).toBeGreaterThanOrEqual(PROBE_TIMEOUT_MS - 50);
    expect(tookMs).toBeLessThan(PROBE_TIMEOUT_MS * 3);
    expect(second).toBe("unreachable");
  });

  it("wakes the controller when the replica's probe finds its primary hung (the replication link stays up)", {
    timeout: 30_000,
  }, async () => {
    // Prepare: a real wake queue, and a shard of two agents.
    const prefix = `pw${Math.random().toString(36).slice(2, 8)}`;
    controllerAws = createAwsAdapters({ env: { ...awsEnv() }, queuePrefix: prefix, createWakeQueue: true });
    await controllerAws.wake.receive(0);
    fixture = new AgentFixture();
    agentAws = createAwsAdapters({ env: { ...awsEnv() }, queuePrefix: prefix });
    fixture.wake = agentAws.wake;
    const [primary, replica] = await fixture.startRedis(2);
    if (!primary || !replica) throw new Error("redis nodes missing");
    await withReplicaOf(replica, primary);
    await fixture.setTopology(undefined, {
      epoch: 0,
      primary_node_id: "n1",
      primary_address: primary.address,
      status: "online",
    });
    await fixture.startAgent(primary, { nodeId: "n1" });
    await fixture.startAgent(replica, { nodeId: "n2" });
    await fixture.waitForHeartbeat(
      "n2",
      (hb) => hb.primary_link === "up" && hb.primary_probe === "ok",
      "n2 linked",
    );

    // Act
    primary.signal("SIGSTOP");
    const wakes: Wake[] = [];
    await waitFor(
      async () => {
        wakes.push(...((await controllerAws?.wake.receive(1)) ?? []));
        return wakes.some((wake) => wake.node === "n2") || undefined;
      },
      "a wake-up from n2",
      15_000,
      0,
    );

    // Assess
    expect(wakes.find((wake) => wake.node === "n2")).toMatchObject({ shard: fixture.shard, reason: "probe" });
  });
});
