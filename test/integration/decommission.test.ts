import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { CreateQueueCommand, ListQueuesCommand } from "@aws-sdk/client-sqs";
import { PutCommand } from "@aws-sdk/lib-dynamodb";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import {
  createDynamoCoordinationStore,
  DynamoHeartbeatStore,
} from "../../src/adapters/dynamo-coordination-store.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { legacyDeadLetterQueueName } from "../../src/adapters/queue-names.ts";
import { SqsCommandBus } from "../../src/adapters/sqs-command-bus.ts";
import { retirementOf } from "../../src/cli/commands/decommission.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { keys } from "../../src/core/table.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { awsEnv, tableName, uniqueName } from "../support/aws.ts";
import {
  CHAOS_CONFIG,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";

/**
 * Agents create their queues; `shardguard decommission` is how they go away (issue 17, item 6):
 * one retired node's, or every node queue of an installation after `cdk destroy`, never another
 * installation's, even one whose prefix starts with this one's.
 */

const run = promisify(execFile);
const tag = Math.random().toString(36).slice(2, 8);
const PREFIX = `d${tag}`;
/** Starts with PREFIX: a `PREFIX*` pattern would match its queues, `PREFIX_*` must not. */
const NEIGHBOUR = `d${tag}-b`;
const aws = createAwsAdapters({ env: awsEnv() });
afterAll(() => aws.destroy());

async function createQueues(prefix: string, nodes: [string, string][]) {
  const bus = new SqsCommandBus({ sqs: aws.clients.sqs, queuePrefix: prefix, logger: silentLogger });
  for (const [shard, node] of nodes) await bus.ensureQueue(shard, node);
}

async function queuesStartingWith(start: string): Promise<string[]> {
  const { QueueUrls = [] } = await aws.clients.sqs.send(
    new ListQueuesCommand({ QueueNamePrefix: start, MaxResults: 1000 }),
  );
  return QueueUrls.map((url) => url.split("/").pop() ?? "").sort();
}

function decommission(prefix: string, ...args: string[]) {
  return run(process.execPath, ["src/cli/main.ts", "decommission", ...args], {
    env: { ...process.env, ...awsEnv(), SHARDGUARD_QUEUE_PREFIX: prefix },
  });
}

describe("shardguard decommission", () => {
  it("deletes one retired node's queue (and its own dead-letter queue from an older release, never the shared one), then every queue of the installation only", async () => {
    // Prepare
    await createQueues(PREFIX, [
      ["orders", "n1"],
      ["orders", "n2"],
    ]);
    await createQueues(NEIGHBOUR, [["orders", "n1"]]);
    // n1 as an installation before the shared dead-letter queue left it: with its own.
    await aws.clients.sqs.send(
      new CreateQueueCommand({ QueueName: legacyDeadLetterQueueName(PREFIX, "orders", "n1") }),
    );

    // Act
    const one = await decommission(PREFIX, "--shard", "orders", "--node", "n1");

    // Assess
    expect(one.stdout).toBe(`deleted ${PREFIX}_orders_n1\ndeleted ${PREFIX}_orders_n1_dlq\n`);
    // The shared dead-letter queue stays: other nodes' queues send to it.
    expect(await queuesStartingWith(`${PREFIX}_`)).toEqual([`${PREFIX}_dlq`, `${PREFIX}_orders_n2`]);

    // Act
    const all = await decommission(PREFIX, "--all-queues", "--json");

    // Assess
    expect(JSON.parse(all.stdout)).toEqual({ deleted: [`${PREFIX}_dlq`, `${PREFIX}_orders_n2`] });
    expect(await queuesStartingWith(`${PREFIX}_`)).toEqual([]);
    expect(await queuesStartingWith(NEIGHBOUR)).toEqual([`${NEIGHBOUR}_dlq`, `${NEIGHBOUR}_orders_n1`]);
  }, 60_000);
});

describe("the store's retirement of a node", () => {
  it("writes nothing when the shard changed since the read it was judged on; then removes the node everywhere, bumping only versioned sets", async () => {
    // Prepare: p1 primary with r1, r2 in its versioned set; an old unversioned set of p0 listing r2; a topology.
    const store = new DynamoHeartbeatStore({
      documents: aws.clients.documents,
      tableName: tableName(),
      clock: aws.clock,
      logger: silentLogger,
    });
    const sets = createDynamoCoordinationStore({
      documents: aws.clients.documents,
      tableName: tableName(),
      clock: aws.clock,
    }).replicaSets;
    const shard = uniqueName("r").slice(0, 24);
    const beat = (node: string, role: "primary" | "replica" = "replica"): HeartbeatInput => ({
      shard,
      node_id: node,
      node_address: `10.0.0.${node.length}:6379`,
      role,
      last_updated: aws.clock.now() * 1000,
      last_txn_id: 1,
      repl_id: "a".repeat(40),
      epoch: 3,
      priority: 100,
    });
    for (const node of ["p1", "r1", "r2"]) await store.put(beat(node, node === "p1" ? "primary" : "replica"));
    await sets.add(shard, "p1", ["r1", "r2"]);
    const put = (item: Record<string, unknown>) =>
      aws.clients.documents.send(new PutCommand({ TableName: tableName(), Item: item }));
    await put({ pk: keys.nodePk(shard, "p0"), sk: keys.replicas("p0"), replicas: new Set(["r2"]) });
    await put({ pk: keys.shardPk(shard), sk: keys.member("p0") });
    const topology = {
      pk: keys.controlPk(shard),
      sk: keys.topology,
      shard,
      epoch: 3,
      status: "online",
      updated_at: 1,
    };
    await put({ ...topology, primary_node_id: "p1" });

    // Act: each race between the read and the write, then a write judged on a fresh read.
    let judged = retirementOf(await store.snapshot(shard), "r2");
    await sets.add(shard, "p1", ["r3"]);
    const afterSetChange = await store.retireNode(shard, "r2", judged);
    judged = retirementOf(await store.snapshot(shard), "r2");
    await store.put({ ...beat("r2"), last_updated: aws.clock.now() * 1000 + 1000 });
    const afterHeartbeat = await store.retireNode(shard, "r2", judged);
    judged = retirementOf(await store.snapshot(shard), "r2");
    await put({ ...topology, epoch: 4, primary_node_id: "r1" });
    const afterFailover = await store.retireNode(shard, "r2", judged);
    const untouched = await store.snapshot(shard);
    judged = retirementOf(untouched, "r2");
    const retired = await store.retireNode(shard, "r2", judged);
    const after = await store.snapshot(shard);

    // Assess
    expect([afterSetChange, afterHeartbeat, afterFailover, retired]).toEqual([false, false, false, true]);
    expect(untouched.nodes.map((node) => node.node_id)).toContain("r2");
    expect(judged.replicaSets).toEqual([
      { primary: "p0", version: undefined },
      { primary: "p1", version: 2 },
    ]);
    expect(after.nodes.map((node) => node.node_id).sort()).toEqual(["p1", "r1"]);
    expect(after.replicaSets).toEqual({ p0: [], p1: ["r1", "r3"] });
    expect(after.replicaSetVersions).toEqual({ p1: 3 });
  }, 60_000);
});

/**
 * Nemesis seed 2905: primary node-3's agent was dead while the runbook's shrink retired node-2b;
 * nobody dropped node-2b from node-3's stored replica set, and the controller held the shard with
 * `member_unheard` for good, waiting for an agent that never reports again. `decommission` now
 * retires the node from the store too: its heartbeat, replica set and member item, and its id from
 * every other node's stored set (a conditional write that bumps the set's version). Real
 * redis-server, agent and controller processes, DynamoDB Local and the SQS emulator.
 */
let cluster: LocalCluster | undefined;

afterEach(async () => {
  await cluster?.stop();
  cluster = undefined;
});

/** Starts a node as docs/deploy.md says (fenced until its agent read the topology) and its agent. */
async function addNode(active: LocalCluster, id: string): Promise<void> {
  const node = new RedisNode(await freePort(), id);
  active.redis.push(node);
  await node.start({ extraArgs: ["--min-replicas-to-write", "1000000", "--min-replicas-max-lag", "10"] });
  active.startAgent(id);
}

/** Stops `id`'s agent (its database goes on replicating) and waits until its last report lapsed. */
async function silence(active: LocalCluster, id: string): Promise<void> {
  await active.stopAgent(id, "SIGTERM");
  await active.waitFor(
    `${id}'s last report past its keepalive plus the failure timeout`,
    async () => {
      const node = active.heartbeatOf(await active.snapshot(), id);
      if (node === undefined) return true;
      const ageMs = active.aws.clock.now() - (node.agent_updated ?? node.last_updated) / 1000;
      return ageMs > (node.keepalive_ms ?? 0) + CHAOS_CONFIG.failureTimeoutMs + 500;
    },
    WAIT_MS,
  );
}

/** The primary node-1's stored set and version, and its database's `min-replicas-to-write`. */
async function guardOf(active: LocalCluster): Promise<{ set: string[]; version?: number; min: number }> {
  const snapshot = await active.snapshot();
  const reply = (await withClient(active.node("node-1"), (client) =>
    client.config("GET", "min-replicas-to-write"),
  )) as string[];
  return {
    set: [...(snapshot.replicaSets["node-1"] ?? [])].sort(),
    version: snapshot.replicaSetVersions["node-1"],
    min: Number(reply[1]),
  };
}

function retireNode(active: LocalCluster, node: string) {
  return shardguard(active, "decommission", "--shard", active.shard, "--node", node);
}

describe("shardguard decommission retires the node from the store", () => {
  it("drops the node from the primary's stored set (its agent re-reads it, also after a restart), and a failover held for it goes ahead", {
    timeout: 240_000,
  }, async () => {
    // Prepare: node-1 primary, node-2 and node-3 in its stored set.
    cluster = await startChaosCluster({ readyTimeoutMs: 90_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await active.waitFor(
      "node-2 and node-3 in node-1's versioned replica set",
      async () => (await guardOf(active)).set.join() === "node-2,node-3",
      WAIT_MS,
    );

    // Act: node-3's agent stops (its database goes on replicating and acknowledging); the
    // refusals; then node-3's retirement while its database still runs.
    await silence(active, "node-3");
    const before = (await active.snapshot()).replicaSetVersions["node-1"] ?? 0;
    const primary = await retireNode(active, "node-1");
    const heard = await retireNode(active, "node-2");
    const retired = await retireNode(active, "node-3");
    const after = await active.snapshot();

    // Assess (b): one line each, exit code 1. Node-3 is gone from the store and from node-1's set.
    expect(primary.code).toBe(1);
    expect(primary.stderr).toMatch(/^shardguard: refused: node-1 is the primary of shard \S+;[^\n]*\n$/);
    expect(heard.code).toBe(1);
    expect(heard.stderr).toMatch(/^shardguard: refused: node-2's agent reported \d+ ms ago[^\n]*\n$/);
    expect(retired.code, retired.stderr).toBe(0);
    expect(retired.stdout).toContain("removed node-3 from the replica set of node-1\n");
    expect(after.nodes.map((node) => node.node_id).sort()).toEqual(["node-1", "node-2"]);
    expect(after.replicaSets["node-1"]).toEqual(["node-2"]);
    expect(after.replicaSetVersions["node-1"]).toBe(before + 1);

    // Act: node-1's agent restarts.
    await active.stopAgent("node-1", "SIGKILL");
    const restartedAt = active.aws.clock.now();
    active.startAgent("node-1");

    // Assess: the restarted agent read the set decommission left: the database still running at
    // node-3's address is an outsider to it now (no heartbeat names it), not a member.
    await active.waitFor(
      "node-1's restarted agent listing node-3's database as an outsider",
      async () => {
        const node = active.heartbeatOf(await active.snapshot(), "node-1");
        return (
          (node?.agent_updated ?? 0) / 1000 > restartedAt &&
          (node?.outsiders?.includes(active.node("node-3").address) ?? false)
        );
      },
      WAIT_MS,
    );

    // Act: node-3's database goes for good; node-4 joins.
    await active.node("node-3").destroy();
    await addNode(active, "node-4");

    // Assess (c): node-1's agent wrote its set again, past the version decommission left, without error.
    await active.waitFor(
      "node-1's set [node-2, node-4] under a guard of 2",
      async () => {
        const guard = await guardOf(active);
        return guard.set.join() === "node-2,node-4" && guard.min === 2;
      },
      WAIT_MS,
    );
    expect((await guardOf(active)).version).toBeGreaterThan(before + 1);
    const failed = active
      .logLines("agent-node-1.log")
      .filter((line) => String(line.message).startsWith("could not"));
    expect(failed).toEqual([]);

    // Act (a): node-4's agent dies (its database goes on acknowledging, a member); once its report
    // lapsed, node-1's agent and database die together.
    await silence(active, "node-4");
    const epoch = (await active.topology())?.epoch ?? 0;
    const seen = active.controllerLogLines().length;
    await active.stopAgent("node-1", "SIGKILL");
    active.node("node-1").signal("SIGKILL");
    // Assess: held while node-4's database may hold writes only it acknowledged (guarantee 1).
    await active.waitFor(
      "the controller holding the failover for node-4",
      () =>
        active
          .controllerLogLines()
          .slice(seen)
          .some((line) => line.code === "member_unheard" && String(line.reason).includes("node-4")),
      WAIT_MS,
    );

    // Act: the operator retires node-4 for good (its database destroyed, then decommission).
    await active.node("node-4").destroy();
    const retired4 = await retireNode(active, "node-4");

    // Assess (a): node-2 is promoted (before: held with member_unheard for good, nemesis seed 2905).
    expect(retired4.code, retired4.stderr).toBe(0);
    expect(retired4.stdout).toContain("removed node-4 from the replica set of node-1\n");
    const failedOver = await waitForNewPrimary(active, epoch);
    expect(failedOver.primary_node_id).toBe("node-2");
  });
});
