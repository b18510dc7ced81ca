import { afterEach, describe, expect, it } from "vitest";
import { type AgentHandle, startAgent } from "../../src/agent/agent.ts";
import type { HeartbeatStore } from "../../src/core/ports.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, FAST_TIMINGS, RecordingLogger } from "../support/agent-harness.ts";
import { countKeys, probeWrite, withClient, writeKeys } from "../support/chaos-cluster.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Nemesis seed 5101 (guarantee 1): the primary's database was SIGKILLed and restarted from an RDB
 * older than what both replicas had acknowledged, while its agent was cut off from the store. The
 * agent judged the new process on the replicas' reports of its last snapshot, 25 s old and behind
 * the RDB: "it continues its replication lineage". It opened the new process once the store
 * answered, the shard came back on it, and the parked replicas resynced 67 acknowledged writes
 * away. Now a primary's new process that would continue its lineage by reports read before the
 * restart stays fenced until a snapshot read after it, with every member reporting since, judges
 * it again; here that finds n2 ahead and keeps it fenced and reported down.
 *
 * Real redis-server, agents and DynamoDB Local; n1's agent being cut off from the store is a
 * stand-in (its heartbeat store fails every call while `cut`), as in fence-lift-members.test.ts.
 */

const KEYS = 200;
/** How long n1 must go on refusing writes once its agent reaches the store again. */
const REFUSE_FOR_MS = 8 * FAST_TIMINGS.failureTimeoutMs;

let fixture: AgentFixture;
let primary: AgentHandle | undefined;

afterEach(async () => {
  await primary?.stop();
  primary = undefined;
  await fixture.close();
});

describe("a primary restarted from its RDB while its agent is cut off from the store", () => {
  it("is judged on the replicas' reports written after the restart: fenced while a member holds writes the RDB lacks", {
    timeout: 90_000,
  }, async () => {
    // Prepare: n1 primary, n2 its member; n1's agent's store calls fail while `cut`.
    fixture = new AgentFixture();
    const n1 = await fixture.onlinePrimary("n1");
    const [n2] = await fixture.startRedis(1);
    if (!n2) throw new Error("redis node missing");
    let cut = false;
    const real = fixture.aws.store.heartbeats;
    const cutOff = async <T>(call: () => Promise<T>): Promise<T> => {
      if (cut) throw new Error("TimeoutError: the store does not answer (cut off)");
      return call();
    };
    const heartbeats: HeartbeatStore = {
      put: (heartbeat) => cutOff(() => real.put(heartbeat)),
      snapshot: (shard) => cutOff(() => real.snapshot(shard)),
      deleteNode: (shard, nodeId) => cutOff(() => real.deleteNode(shard, nodeId)),
    };
    const logger = new RecordingLogger();
    primary = await startAgent(
      {
        shard: fixture.shard,
        redis: n1.address,
        stateDir: fixture.newStateDir(),
        nodeId: "n1",
        ...FAST_TIMINGS,
      },
      fixture.depsFrom(fixture.aws, heartbeats, logger),
    );
    await fixture.startAgent(n2, { nodeId: "n2" });
    await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "n2 following n1");
    await waitFor(
      async () => ((await fixture.snapshot()).replicaSets.n1 ?? []).includes("n2") || undefined,
      "n2 in n1's replica set",
    );

    // Act: n1's agent cut off; writes n2 acknowledges, n1's RDB saved between two batches; n1's
    // database killed and restarted from that RDB (fenced, as docs/deploy.md starts databases).
    cut = true;
    await writeKeys(n1, "before", KEYS, 1);
    await withClient(n1, (client) => client.save());
    await writeKeys(n1, "after", KEYS, 1);
    n1.signal("SIGKILL");
    await n1.stop();
    await n1.start({ extraArgs: FENCED_START_ARGS });
    expect(await countKeys(n1, "after", KEYS)).toBe(0);
    await waitFor(
      () => logger.find(/^database restarted/) ?? undefined,
      "n1's agent judging the new process",
      15_000,
    );
    // n2, parked when its primary's connection closed, reports what it holds.
    await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "down", "n2 parked");
    cut = false;

    // Assess: n1 refuses every write while its agent reaches the store again (the code before
    // opened it: its verdict rested on n2's report from before the restart), and reports its
    // database down; n2 still holds every write it acknowledged.
    const from = Date.now();
    while (Date.now() - from < REFUSE_FOR_MS) {
      const probe = await probeWrite(n1, "probe");
      expect(
        probe.accepted,
        `n1 took a write ${Date.now() - from} ms after its agent reached the store`,
      ).toBe(false);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect(
      logger.find("database restarted without its data: fenced until it follows the shard's primary"),
    ).toBeDefined();
    const reported = await fixture.heartbeatOf("n1");
    expect(reported?.db_status).toBe("down");
    expect(await countKeys(n2, "after", KEYS)).toBe(KEYS);
  });
});
