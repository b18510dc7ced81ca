import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture, FAST_TIMINGS, redisRole } from "../support/agent-harness.ts";
import { cycleUntil } from "../support/controller-cycles.ts";
import { controllerOverAgents } from "../support/controller-fakes.ts";

/**
 * The agent against the real controller (decide + orchestrator), real redis-server processes
 * and the local stack: the contract between the two, end to end.
 */

let fixture: AgentFixture;

afterEach(async () => {
  await fixture.close();
});

describe("agents under the controller", () => {
  it("fail over to the preferred replica when the primary dies, and take the old primary back as a replica", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [oldNode, preferredNode, otherNode] = await fixture.startRedis(3);
    if (!oldNode || !preferredNode || !otherNode) throw new Error("redis nodes missing");
    await fixture.startAgent(oldNode, { nodeId: "n1" });
    const preferred = await fixture.startAgent(preferredNode, { nodeId: "n2", priority: 10 });
    await fixture.startAgent(otherNode, { nodeId: "n3", priority: 50 });
    await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "n2 linked");
    await fixture.waitForHeartbeat("n3", (hb) => hb.primary_link === "up", "n3 linked");
    const deps = controllerOverAgents(fixture.aws, FAST_TIMINGS);
    await cycleUntil(deps, fixture.shard, (result) => result.outcome === "initialized", 20_000);
    await cycleUntil(
      deps,
      fixture.shard,
      (result) => result.outcome === "no_action" && result.decision?.kind === "none",
      20_000,
    );
    const client = oldNode.client();
    for (let index = 0; index < 20; index++) await client.set(`before-${index}`, "v");
    // Replication is asynchronous: only writes both replicas acknowledged must survive the kill.
    expect(await client.call("WAIT", "2", "2000")).toBe(2);
    client.disconnect();

    // Act
    const killedAt = Date.now();
    oldNode.signal("SIGKILL");
    const completed = (
      await cycleUntil(deps, fixture.shard, (result) => result.outcome === "completed", 20_000)
    ).at(-1);
    const failoverMs = Date.now() - killedAt;
    await fixture.waitForHeartbeat(
      "n3",
      (hb) => hb.primary_node_id === "n2" && hb.primary_link === "up",
      "n3 follows n2",
    );
    await oldNode.start();
    const returned = await fixture.waitForHeartbeat(
      "n1",
      (hb) => hb.db_status === "up" && hb.role === "replica" && hb.primary_link === "up",
      "n1 back as a replica of n2",
    );

    // Assess
    expect(completed?.primary).toBe("n2");
    expect(await fixture.aws.store.topology.read(fixture.shard)).toMatchObject({
      primary_node_id: "n2",
      primary_address: preferredNode.address,
      status: "online",
    });
    expect(await redisRole(preferredNode)).toBe("master");
    expect(await redisRole(otherNode)).toBe("slave");
    expect(await redisRole(oldNode)).toBe("slave");
    expect(returned.primary_node_id).toBe("n2");
    expect(preferred.handle.status()).toMatchObject({ role: "primary", epoch: completed?.epoch });
    const newPrimary = preferredNode.client();
    expect(await newPrimary.get("before-19")).toBe("v");
    newPrimary.disconnect();
    expect(failoverMs).toBeLessThan(10_000);
  });
});
