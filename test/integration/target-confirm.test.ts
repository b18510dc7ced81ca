import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture, FAST_TIMINGS, redisRole, tryWrite } from "../support/agent-harness.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Simulator seed 221485 (guarantees 1 and 2): a failover's target, its PROMOTE never sent, became a
 * master by itself (restarted from its RDB without `replicaof`); its agent took the topology's
 * `promote` phase naming it for a confirmation and opened writes, so it served 15 s of writes at its
 * old epoch, outside the promotion's fence window and unknown to the controller, which brought the
 * shard back on another node: 12 acknowledged writes lost. The agent confirmed a database that
 * answers as a primary whenever the topology's plan target was this node; now, while the topology is
 * failing over, only once the PROMOTE of that epoch ran here (src/agent/fencing.ts `assessTopology`).
 * Real redis-server processes and agent, DynamoDB Local and SQS (loopback).
 */

let fixture: AgentFixture | undefined;

afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

describe("the target of a failover whose database became a primary before its PROMOTE", () => {
  it("takes no write until the PROMOTE runs, and opens once it has", async () => {
    // Prepare: n1 primary, n2 its linked replica, both with agents; n1 dies (agent first, then
    // its database) and the controller plans the failover to n2 at epoch 1, then stalls before
    // sending the PROMOTE.
    fixture = new AgentFixture();
    const active = fixture;
    const { n1, n2, n1Agent: oldAgent, n2Agent: agent } = await active.linkedPair();
    const first = await tryWrite(n1, "before-failover");
    if (first !== "OK") throw new Error(`n1 refused the first write: ${first}`);
    // The write is not waited for by WAIT: n2 must hold it before n1 dies (a fresh-clone CI run at
    // load 20 killed n1 first, and the last assertion found the key missing).
    const reader = n2.client();
    await waitFor(
      async () => (await reader.get("before-failover")) !== null || undefined,
      "n2 holding the first write",
    );
    reader.disconnect();
    await active.primaryDiesForN2({ n1, n2, n1Agent: oldAgent });
    await active.waitForHeartbeat("n2", (hb) => hb.primary_link === "down", "n2 sees n1 gone");

    // Act: n2's database becomes a master by itself (an operator's REPLICAOF NO ONE), and its
    // agent reports it: a database the agent has not seen yet takes writes whatever the code, but
    // the agent applies the guard of an unconfirmed primary before the heartbeat that reports it.
    const reported = agent.heartbeats.written.length;
    const operator = n2.client();
    await operator.call("REPLICAOF", "NO", "ONE");
    operator.disconnect();
    expect(await redisRole(n2)).toBe("master");
    await waitFor(
      () => agent.heartbeats.written.slice(reported).some((hb) => hb.role === "primary"),
      "n2's agent reports its database a primary",
    );

    // Assess 1: for 3 s (15 heartbeat intervals: the agent reads the topology and applies its write
    // guard every cycle) n2 refuses writes, and no heartbeat claims the plan's epoch.
    const refusals = new Set<string>();
    await holdsFor(
      async () => {
        const reply = await tryWrite(n2);
        refusals.add(reply.split(" ")[0] ?? reply);
        return reply !== "OK";
      },
      "n2 refuses writes before its PROMOTE",
      15 * FAST_TIMINGS.heartbeatIntervalMs,
    );
    expect([...refusals]).toEqual(["NOREPLICAS"]);
    expect(agent.heartbeats.written.some((hb) => hb.role === "primary" && hb.epoch === 1)).toBe(false);

    // Assess 2: the PROMOTE comes; n2 is reported primary at epoch 1 and opens once the promotion's
    // fence window (4.5 s after its last contact with n1) has passed.
    await active.send("n2", active.command("PROMOTE", 1));
    await active.waitForHeartbeat("n2", (hb) => hb.role === "primary" && hb.epoch === 1, "promoted");
    await waitFor(
      async () => (await tryWrite(n2, "after-promote")) === "OK" || undefined,
      "n2 writable after its PROMOTE",
      15_000,
    );
    const client = n2.client();
    expect(await client.get("before-failover")).not.toBeNull();
    client.disconnect();
  });
});
