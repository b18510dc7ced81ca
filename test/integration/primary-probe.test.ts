import { afterEach, describe, expect, it } from "vitest";
import type { Database } from "../../src/agent/database.ts";
import { readReplicationInfo } from "../../src/agent/database.ts";
import { Mutex } from "../../src/agent/loop.ts";
import { parseAgentOptions } from "../../src/agent/options.ts";
import { PrimaryProbe, type ProbeContext } from "../../src/agent/primary-probe.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import { type RedisNode, startRedisNodes } from "../../src/local-stack/redis-nodes.ts";
import { RecordingLogger } from "../support/agent-harness.ts";
import { waitFor } from "../support/wait.ts";

/**
 * A replica's probe of its primary, against real redis-server processes: the replica's vote in
 * `decide()` ("unreachable": the primary did not answer within the probe timeout) must come from a
 * probe that asked, never from a connection opened a moment before.
 */

const PROBE_TIMEOUT_MS = 500;
let nodes: RedisNode[] = [];
let probe: PrimaryProbe | undefined;

afterEach(async () => {
  probe?.close();
  probe = undefined;
  for (const node of nodes) {
    node.signal("SIGCONT");
    await node.stop();
  }
  nodes = [];
});

/** What the probe reads of its agent; the paths these tests take change nothing in it. */
function probeContext(): ProbeContext {
  return {
    options: parseAgentOptions({ shard: "s1", redis: "127.0.0.1:1" }),
    nodeId: "n2",
    db: {} as Database,
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
  };
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
});
