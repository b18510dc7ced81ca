import { afterEach, describe, expect, it } from "vitest";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture } from "../support/agent-harness.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Simulator seed 7003 (guarantee 5, and through it 1: 2,810 acknowledged writes lost), with real
 * redis-server processes and agents: the primary's database restarts empty, its agent fences it
 * (it does not continue the lineage its replica holds) and dies; the agent that starts next has no
 * state dir (the machine rebuilt from its image, the dir deleted). The code before judged the empty
 * process "the same" (nothing to compare it with), opened it while the topology still named it,
 * and dropped the parked replica holding every write from the replica set: the empty dataset took
 * writes, and the shard's next failover could only choose between the two. Now the new agent judges
 * the process against this node's own last stored report and keeps it fenced, reported down.
 * No controller runs: the topology keeps naming n1, as it did in the seed (the controller was held).
 */

const KEYS = 50;

let fixture: AgentFixture;

afterEach(async () => {
  await fixture.close();
});

/** "OK" or the error reply (NOREPLICAS, READONLY, ...) of one write. */
async function tryWrite(node: RedisNode, key: string): Promise<string> {
  const client = node.client({ maxRetriesPerRequest: 0 });
  try {
    return await client.set(key, "x");
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  } finally {
    client.disconnect();
  }
}

/**
 * n1 primary, n2 its replica, KEYS writes n2 acknowledged; then n1's database restarts empty
 * (fenced by its config) and its agent reports it restarted without its data.
 */
async function primaryRestartedEmpty() {
  fixture = new AgentFixture();
  const [primary, replica] = await fixture.startRedis(2);
  if (!primary || !replica) throw new Error("redis nodes missing");
  await fixture.setTopology(undefined, {
    epoch: 0,
    primary_node_id: "n1",
    primary_address: primary.address,
    status: "online",
  });
  const first = await fixture.startAgent(primary, { nodeId: "n1" });
  await fixture.startAgent(replica, { nodeId: "n2" });
  await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "n2 linked");
  await fixture.waitForHeartbeat("n1", (hb) => hb.role === "primary" && hb.db_status === "up", "n1 serving");
  // n1's guard demands n2 from its first report on; Redis counts n2 good from its first
  // acknowledgement (a second at most): under load the first write may come before it.
  await waitFor(
    async () => (await tryWrite(primary, "acked:probe")) === "OK",
    "n1 taking writes (n2 counted good by its guard)",
    15_000,
  );
  const client = primary.client();
  for (let i = 0; i < KEYS; i++) {
    await client.set(`acked:${i}`, "v");
    expect(await client.wait(1, 1000)).toBe(1);
  }
  client.disconnect();
  await fixture.waitForHeartbeat("n1", (hb) => hb.last_txn_id > 0, "n1 reporting an offset");

  // Act: n1's database restarts empty (fenced by its config); its agent sees it and reports it.
  primary.signal("SIGKILL");
  await primary.stop();
  primary.wipeData();
  await primary.start({ extraArgs: FENCED_START_ARGS });
  const restarted = await fixture.waitForHeartbeat(
    "n1",
    (hb) => hb.db_status === "down" && hb.db_crash?.state === "restarted",
    "n1 reporting its database restarted without its data",
  );
  return { primary, first, restarted };
}

describe("an agent restarted without its state dir beside a primary restarted empty", () => {
  it("keeps the empty process fenced and reported down, and the replica holding the writes in the set", {
    timeout: 90_000,
  }, async () => {
    // Prepare: n1 primary, n2 its replica, every key acknowledged by n2.
    const { primary, first, restarted } = await primaryRestartedEmpty();
    // Its agent dies; the next one starts without a state dir.
    await fixture.stopAgent(first);
    await fixture.startAgent(primary, { nodeId: "n1" });

    // Assess: the empty process stays fenced for 8 s (several guard passes and heartbeats of the
    // new agent), reported down, and n2, holding every write, stays in n1's replica set.
    const written = (hb: { agent_updated?: number | undefined; last_updated: number }) =>
      hb.agent_updated ?? hb.last_updated;
    await fixture.waitForHeartbeat(
      "n1",
      (hb) => written(hb) > written(restarted),
      "the new agent's first report",
    );
    await holdsFor(
      async () => {
        const reply = await tryWrite(primary, "after");
        const snapshot = await fixture.snapshot();
        const n1 = snapshot.nodes.find((node) => node.node_id === "n1");
        return reply !== "OK" && n1?.db_status === "down" && (snapshot.replicaSets.n1 ?? []).includes("n2");
      },
      "n1's empty process fenced and reported down, n2 in its set",
      8_000,
    );
    expect(await tryWrite(primary, "last")).toMatch(/NOREPLICAS|READONLY/);
  });

  it("keeps it fenced when an agent restarted with its state came between (nemesis seed 7311)", {
    timeout: 90_000,
  }, async () => {
    // Nemesis seed 7311 (guarantee 5, and through it 1: 264 acknowledged writes lost): after the
    // empty restart, an agent restarted with its state dir took the live, empty process for the
    // one that died and stored that run id in its report's restart; the agent after it, started
    // without its state, found that run id still answering, judged the process "the same" and
    // opened it. Now a restart naming the live process is not taken as the dead one's.
    const { primary, first, restarted } = await primaryRestartedEmpty();
    await fixture.stopAgent(first);
    const second = await fixture.startAgent(primary, { nodeId: "n1", stateDir: first.stateDir });
    const written = (hb: { agent_updated?: number | undefined; last_updated: number }) =>
      hb.agent_updated ?? hb.last_updated;
    const again = await fixture.waitForHeartbeat(
      "n1",
      (hb) => written(hb) > written(restarted) + 1_000_000 && hb.db_status === "down",
      "the agent restarted with its state reporting again",
    );
    await fixture.stopAgent(second);
    await fixture.startAgent(primary, { nodeId: "n1" });

    // Assess: as in the test above, the empty process stays fenced and reported down for 8 s.
    await fixture.waitForHeartbeat(
      "n1",
      (hb) => written(hb) > written(again),
      "the stateless agent's first report",
    );
    await holdsFor(
      async () => {
        const reply = await tryWrite(primary, "after");
        const snapshot = await fixture.snapshot();
        const n1 = snapshot.nodes.find((node) => node.node_id === "n1");
        return reply !== "OK" && n1?.db_status === "down" && (snapshot.replicaSets.n1 ?? []).includes("n2");
      },
      "n1's empty process fenced and reported down, n2 in its set",
      8_000,
    );
    expect(await tryWrite(primary, "last")).toMatch(/NOREPLICAS|READONLY/);
  });
});
