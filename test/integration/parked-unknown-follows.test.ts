import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture } from "../support/agent-harness.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Simulator seed 420081 (guarantee 3): n3, parked from its primary, lost its agent's state dir. The
 * new agent took the epoch of its own last report, found its database parked from a primary it did
 * not know, and waited for a newer epoch than the online topology's, for ever, while the topology's
 * primary was healthy and ahead on n3's lineage. Now such a park is taken as one from the topology's
 * primary: the probe watches it and follows it once it is known to hold the replica's data
 * (src/agent/primary-probe.ts, \`resumeParkedWatch\`). Real redis-server processes and agent,
 * DynamoDB Local and SQS (loopback).
 */

let fixture: AgentFixture | undefined;

afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

describe("a parked replica whose agent restarts without its state", () => {
  it("follows the online topology's primary that holds its data (simulator seed 420081)", async () => {
    // Prepare: topology online at epoch 3 naming n1.
    fixture = new AgentFixture();
    const active = fixture;
    const [n1, n2] = await active.startRedis(2);
    if (!n1 || !n2) throw new Error("redis nodes missing");
    await active.setTopology(undefined, {
      epoch: 3,
      primary_node_id: "n1",
      primary_address: n1.address,
      status: "online",
    });
    // n2 starts as a master: its agent steps it down to n1 at epoch 3 (the epoch its report carries).
    const detach = n2.client();
    await detach.call("REPLICAOF", "NO", "ONE");
    detach.disconnect();
    const first = await active.startAgent(n2, { nodeId: "n2" });
    await active.waitForHeartbeat(
      "n2",
      (hb) => hb.primary_link === "up" && hb.epoch === 3,
      "n2 linked at epoch 3",
    );
    const writer = n1.client();
    for (let index = 0; index < 200; index++) await writer.set(`key-${index}`, "v");
    expect(Number(await writer.call("WAIT", "1", "5000"))).toBe(1);
    // n2's agent dies; its park (as its probe parks a replica: REPLICAOF 127.0.0.1 1) outlives it,
    // its state dir does not.
    await active.stopAgent(first);
    const replica = n2.client();
    try {
      await replica.call("REPLICAOF", "127.0.0.1", "1");

      // Act: a new agent for n2 with an empty state dir.
      const second = await active.startAgent(n2, { nodeId: "n2" });

      // Assess: n2 follows n1 again, with its 200 keys (on the code before it stayed parked,
      // "waiting for a newer epoch than 3").
      await waitFor(
        async () => {
          const info = await replica.info("replication");
          return info.includes(`master_port:${n1.port}\r`) && info.includes("master_link_status:up");
        },
        "n2 following n1 again",
        15_000,
      );
      expect(await replica.dbsize()).toBe(200);
      expect(
        second.logger.find("parked replica: watching the topology's primary for its data"),
      ).toBeDefined();
      expect(second.logger.find("replica unparked: its primary is back")).toBeDefined();
      await writer.set("after", "v");
      expect(Number(await writer.call("WAIT", "1", "5000"))).toBe(1);
    } finally {
      replica.disconnect();
      writer.disconnect();
    }
  });
});
