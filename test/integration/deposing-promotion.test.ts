import { afterEach, describe, expect, it } from "vitest";
import { FENCED_MIN_REPLICAS } from "../../src/core/write-guard.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  linesWith,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30, nemesis seed 3501 (guarantee 3, keeping 1 and 2): the primary's agent dies while a
 * replica outside its set (here node-4, attached before its agent started) is counted by its guard;
 * then its members die. node-1's database lives on, refusing writes (its guard demands members
 * that are gone, and no agent can shrink the set), and the only node left, node-4, is outside the
 * set: promoting it would detach no replica node-1's guard waits for, so the controller held the
 * shard offline until node-1's agent came back (130.5 s in seed 3501). Now node-4, which
 * replicates from node-1 and reaches it, is brought online in a deposing promotion: its agent
 * fences node-1 itself, catches up with node-1's final offset, then detaches.
 * Real redis-server, agent and controller processes, DynamoDB Local and SQS (loopback).
 */

const PREFIX = "deposing";
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };
const COUNT = 200;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

async function minReplicasToWrite(node: RedisNode): Promise<number> {
  const reply = (await withClient(node, (client) =>
    client.config("GET", "min-replicas-to-write"),
  )) as string[];
  return Number(reply[1]);
}

describe("a deposing promotion", () => {
  it("brings the shard back on the one node outside the dead-agent primary's set, after fencing that primary", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary, node-2 and node-3 members; node-4 attached with no agent yet.
    // The production failure timeout: the heartbeats stay fresh on loaded cores while the test
    // prepares (with 1 s, a CI run saw the shard marked offline right after its start).
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const primary = active.node("node-1");
    const node4 = new RedisNode(await freePort(), "node-4");
    active.redis.push(node4);
    await node4.start({ replicaOf: primary.address });
    await active.waitFor(
      "node-1's guard demanding node-2, node-3 and the outsider node-4",
      async () => (await minReplicasToWrite(primary)) === 3,
      WAIT_MS,
    );
    await writeKeys(primary, PREFIX, COUNT, 3);

    // Act: node-1's agent dies, then its members' databases; node-1 serves on, refusing writes.
    await active.stopAgent("node-1", "SIGKILL");
    active.node("node-2").signal("SIGKILL");
    active.node("node-3").signal("SIGKILL");
    await active.waitFor(
      "node-1 refusing writes",
      async () => !(await probeWrite(primary, `${PREFIX}:probe`)).accepted,
      WAIT_MS,
    );
    // The operator starts node-4's agent.
    active.startAgent("node-4");
    let topology = await active.topology();
    await active.waitFor(
      "the shard online on node-4",
      async () => {
        topology = await active.topology();
        return topology?.status === "online" && topology.primary_node_id === "node-4";
      },
      2 * WAIT_MS,
    );

    // Assess: node-4 deposed node-1 first (fenced there, caught up), holds every acknowledged
    // write, and takes writes once its window ends; node-1 refuses them for good.
    expect(linesWith(active.logLines("agent-node-4.log"), /^old primary deposed/)).toHaveLength(1);
    expect(await minReplicasToWrite(primary)).toBe(FENCED_MIN_REPLICAS);
    expect(await countKeys(node4, PREFIX, COUNT)).toBe(COUNT);
    await active.waitFor(
      "node-4 writable",
      async () => (await probeWrite(node4, `${PREFIX}:after`)).accepted,
      WAIT_MS,
    );
    expect((await probeWrite(primary, `${PREFIX}:stray`)).accepted).toBe(false);
    const reasons = active.controllerLogLines().map((line) => String(line.reason ?? ""));
    expect(
      reasons.some((reason) => /deposing node-1 first: node-4 is outside its replica set/.test(reason)),
    ).toBe(true);
  });
});
