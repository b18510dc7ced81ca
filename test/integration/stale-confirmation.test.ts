import { afterEach, describe, expect, it } from "vitest";
import { AgentFixture, tryWrite } from "../support/agent-harness.ts";
import type { TcpProxy } from "../support/tcp-proxy.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Nemesis seed 6602 (guarantee 2): node-3, primary at epoch 20, hung (its redis paused 71 s);
 * while it hung its agent read the topology naming its successor (epoch 22), but kept the
 * confirmation of epoch 20, which only a cycle where the database answers recomputed. node-3 woke,
 * its successor fenced it (\`min-replicas-to-write\` 1,000,000), and its agent, cut off from the
 * store, set its epoch-20 guard again over that fence; a replica with no agent then satisfied the
 * guard, and node-3 took writes beside the new primary (14 two-writable samples, 29 writes lost).
 * Now a read that names another primary withdraws the confirmation at once
 * (src/agent/topology-read.ts \`readSnapshot\`), so the fence it did not set stays until a read
 * confirms it (\`heldByConfigFence\`). Real redis-server processes and agent, DynamoDB Local behind
 * a TCP proxy the test cuts, and SQS (loopback).
 * **This test does not fail on the code before the fix**: here the agent's guard plan is the same
 * before and after the hang, so the old agent sent no command and the fence stayed; in the run,
 * node-3's plan changed after it woke (its guard of 1 member), and that path is not reproduced
 * here. It guards the invariant (a fence set by a successor stays while the agent cannot read a
 * topology that confirms it); the fix itself is reasoned from the run's logs
 * (/work/notes/analysis-nemesis-6602.md in the eleventh session).
 */

const QUERY = "DynamoDB_20120810.Query";

let fixture: AgentFixture | undefined;
let proxy: TcpProxy | undefined;

afterEach(async () => {
  for (const node of fixture?.nodes ?? []) node.signal("SIGCONT");
  await proxy?.close();
  proxy = undefined;
  await fixture?.close();
  fixture = undefined;
});

describe("a primary's agent that read its successor's topology while its database hung", () => {
  it("keeps the successor's fence when the database wakes and the store is cut off", async () => {
    // Prepare: n1 primary at epoch 1 (no replicas: its guard opens it), its agent behind the proxy
    // (keep-serving: a store outage alone fences nothing); n2 another database.
    fixture = new AgentFixture();
    const active = fixture;
    const [n1, n2] = await active.startRedis(2);
    if (!n1 || !n2) throw new Error("redis nodes missing");
    const other = n2.client();
    await other.call("REPLICAOF", "NO", "ONE");
    other.disconnect();
    await active.setTopology(undefined, {
      epoch: 1,
      primary_node_id: "n1",
      primary_address: n1.address,
      status: "online",
    });
    const behind = await active.adaptersBehindProxy();
    proxy = behind.proxy;
    const aws = behind.aws;
    await active.startAgent(n1, { nodeId: "n1", fencePolicy: "failsafe" }, aws);
    await waitFor(async () => (await tryWrite(n1)) === "OK" || undefined, "n1 writable", 10_000);

    // Act: n1's database hangs; the topology moves to n2 and n1's agent reads it (a second snapshot
    // query means the first one was answered); the store is cut off; n1 wakes and its successor
    // fences it at once.
    n1.signal("SIGSTOP");
    await active.setTopology(1, {
      epoch: 2,
      primary_node_id: "n2",
      primary_address: n2.address,
      status: "online",
    });
    proxy?.resetRequestsContaining(QUERY);
    await waitFor(
      () => ((proxy?.requests(QUERY) ?? 0) >= 2 ? true : undefined),
      "n1's agent read epoch 2",
      10_000,
    );
    await proxy?.cut();
    n1.signal("SIGCONT");
    const successor = n1.client();
    try {
      await successor.config("SET", "min-replicas-to-write", "1000000");
    } finally {
      successor.disconnect();
    }

    // Assess: n1 refuses every write and the successor's fence stays (in the run, node-3's agent
    // set its old guard over it; this test's path does not, see above).
    await holdsFor(
      async () => (await tryWrite(n1)).startsWith("NOREPLICAS"),
      "n1 refuses writes while cut off from the store after reading its successor's topology",
      3000,
    );
    const after = n1.client();
    try {
      expect(await after.config("GET", "min-replicas-to-write")).toEqual([
        "min-replicas-to-write",
        "1000000",
      ]);
    } finally {
      after.disconnect();
    }
  });
});
