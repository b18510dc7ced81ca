import { afterEach, describe, expect, it } from "vitest";
import { type AgentHandle, startAgent } from "../../src/agent/agent.ts";
import type { ReplicaSetStore } from "../../src/core/ports.ts";
import {
  AgentFixture,
  FAST_TIMINGS,
  RecordingHeartbeatStore,
  RecordingLogger,
} from "../support/agent-harness.ts";
import { probeWrite } from "../support/chaos-cluster.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Nemesis seed 5103 (guarantee 1): node-3, promoted at epoch 6, lifted its promotion fence with
 * `min-replicas-to-write 2` demanding node-1 and node-2 while its "replica set add" did not answer
 * (the store was slow); the controller saw no member to wait for. An AZ split {node-3, node-1} |
 * {node-2, AWS} 1.8 s later: node-1's agent fell unheard, node-2 was promoted, and 100 writes
 * node-3 had taken with node-1's acknowledgement (node-2 still counted good by Redis for its lag)
 * were lost at the heal. Now a fence is lifted only after the store lists every member the guard
 * demands. Real redis-server, agents and DynamoDB Local; the store's one failing call (`add` not
 * answering) is a stand-in, as a real store cannot be made to fail that one call.
 */

let fixture: AgentFixture;
let candidate: AgentHandle | undefined;

afterEach(async () => {
  await candidate?.stop();
  candidate = undefined;
  await fixture.close();
});

describe("a new primary's promotion fence", () => {
  it("stays up while the store does not list the members its guard demands, and lifts once it does", {
    timeout: 60_000,
  }, async () => {
    // Prepare: n1 primary, n2 its replica; n2's store calls to add replica-set members hang until released.
    fixture = new AgentFixture();
    const [oldNode, newNode] = await fixture.startRedis(2);
    if (!oldNode || !newNode) throw new Error("redis nodes missing");
    await fixture.startAgent(oldNode, { nodeId: "n1" });
    let storeAnswers = false;
    const adds: string[][] = [];
    const real = fixture.aws.store.replicaSets;
    const replicaSets: ReplicaSetStore = {
      add: (shard, primaryId, nodeIds) => {
        adds.push([...nodeIds]);
        return storeAnswers ? real.add(shard, primaryId, nodeIds) : new Promise<void>(() => {});
      },
      remove: (...args) => real.remove(...args),
      removeWhilePrimary: (...args) => real.removeWhilePrimary(...args),
    };
    const logger = new RecordingLogger();
    const heartbeats = new RecordingHeartbeatStore(fixture.aws.store.heartbeats);
    candidate = await startAgent(
      {
        shard: fixture.shard,
        redis: newNode.address,
        stateDir: fixture.newStateDir(),
        nodeId: "n2",
        ...FAST_TIMINGS,
      },
      { ...fixture.depsFrom(fixture.aws, heartbeats, logger), replicaSets },
    );
    await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "replica link up");
    await fixture.planChange(
      "failover",
      1,
      { id: "n1", address: oldNode.address },
      { id: "n2", address: newNode.address },
    );

    // Act: n2 promoted; n1 repointed to it (the member its guard will demand).
    await fixture.send("n2", fixture.command("PROMOTE", 1));
    await fixture.waitForHeartbeat("n2", (hb) => hb.role === "primary" && hb.epoch >= 1, "n2 primary");
    await fixture.send(
      "n1",
      fixture.command("REPLICAOF", 1, { primary: { node_id: "n2", address: newNode.address } }),
    );
    await fixture.waitForHeartbeat(
      "n1",
      (hb) => hb.role === "replica" && hb.primary_link === "up",
      "n1 replica of n2",
    );
    await waitFor(
      () => (adds.some((ids) => ids.includes("n1")) ? true : undefined),
      "n2 adding n1 to its set",
    );
    // Past the promotion window (FAST_TIMINGS' fence timeout 600 ms) and several cycles with the add hanging.
    await waitFor(
      () =>
        logger.lines.filter((line) => line.message === "could not apply the write guard").length >= 3
          ? true
          : undefined,
      "three cycles whose replica-set add did not answer",
      20_000,
    );

    // Assess: n2 refuses writes while n1 is demanded but not listed; opens once the store answers.
    const stored = (await fixture.snapshot()).replicaSets.n2 ?? [];
    expect(stored).not.toContain("n1");
    expect((await probeWrite(newNode, "while-unlisted")).accepted).toBe(false);
    expect(logger.find("write fence lifted")).toBeUndefined();
    storeAnswers = true;
    await waitFor(
      async () => (((await fixture.snapshot()).replicaSets.n2 ?? []).includes("n1") ? true : undefined),
      "n1 listed in n2's replica set",
    );
    await waitFor(
      async () => (await probeWrite(newNode, "after-listed")).accepted || undefined,
      "n2 taking writes",
    );
    expect(logger.find("write fence lifted")).toBeDefined();
  });
});
