import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture } from "../support/agent-harness.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Nemesis seed 6601 (guarantee 1): replicas added by a scale-out follow the primary and never
 * apply a command, so their agents' applied epoch stays 0. The primary was killed and restarted
 * from an RDB older than the writes the replicas had acknowledged; their agents parked them (a
 * full sync from the restarted process would wipe those writes). Later each agent restarted (state
 * dir kept), forgot the park (it lived in memory only), saw a topology epoch above its applied
 * one and followed the primary it names: the full syncs wiped the last copies of 128 writes. Now
 * the park is kept in the state dir (\`parked\`) and a restarted agent keeps it as it was
 * (src/agent/primary-probe.ts, \`staysParked\`). Real redis-server processes and agent, DynamoDB
 * Local and SQS (loopback).
 */

let fixture: AgentFixture | undefined;

afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

describe("a parked replica whose agent restarts", () => {
  it("stays parked from a primary restarted without its data, and keeps every write it holds", async () => {
    // Prepare: n1 primary at epoch 5 (n2's agent never applied a command: its applied epoch is 0),
    // n2 its replica with 200 keys; n1's RDB holds the first 100 only.
    fixture = new AgentFixture();
    const active = fixture;
    const [n1, n2] = await active.startRedis(2);
    if (!n1 || !n2) throw new Error("redis nodes missing");
    await active.setTopology(undefined, {
      epoch: 5,
      primary_node_id: "n1",
      primary_address: n1.address,
      status: "online",
    });
    const stateDir = active.newStateDir();
    const first = await active.startAgent(n2, { nodeId: "n2", stateDir });
    await active.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "n2 linked");
    const writer = n1.client();
    for (let index = 0; index < 100; index++) await writer.set(`key-${index}`, "v");
    await writer.save();
    for (let index = 100; index < 200; index++) await writer.set(`key-${index}`, "v");
    expect(Number(await writer.call("WAIT", "1", "5000"))).toBe(1);
    writer.disconnect();
    // n1 dies; n2's agent parks n2; n1 comes back from its older RDB.
    n1.signal("SIGKILL");
    await n1.stop();
    await waitFor(() => first.logger.find(/replica parked/), "n2 parked", 10_000);
    await n1.start();

    // Act: n2's agent restarts, its state dir kept.
    await active.stopAgent(first);
    const second = await active.startAgent(n2, { nodeId: "n2", stateDir });
    await waitFor(() => second.logger.find("command queue ready"), "the restarted agent running", 10_000);

    // Assess: n2 stays parked with its 200 keys (on the code before, the restarted agent followed
    // n1 at once and the full sync left n2 with n1's 100).
    const replica = n2.client();
    try {
      await holdsFor(
        async () => {
          const info = await replica.info("replication");
          return info.includes("master_port:1\r") && (await replica.dbsize()) === 200;
        },
        "n2 parked with its 200 keys",
        3000,
      );
    } finally {
      replica.disconnect();
    }
  });
});
