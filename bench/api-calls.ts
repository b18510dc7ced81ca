/**
 * AWS API requests per adapter operation and per shard per controller tick, counted by the SDK
 * middleware of src/adapters/api-call-counter.ts against the local stack (or the endpoints in the
 * environment). Run: `node bench/api-calls.ts [--nodes 3] [--ticks 20] [--json]`.
 */
import { parseArgs } from "node:util";
import { diffCounts } from "../src/adapters/api-call-counter.ts";
import { createAwsAdapters } from "../src/adapters/aws-adapters.ts";
import { silentLogger } from "../src/adapters/observability.ts";
import type { Command } from "../src/core/model.ts";
import { startLocalStack } from "../src/dev/local-stack/stack.ts";

const { values } = parseArgs({
  options: {
    nodes: { type: "string", default: "3" },
    ticks: { type: "string", default: "20" },
    json: { type: "boolean", default: false },
  },
});
const nodeCount = Number(values.nodes);
const ticks = Number(values.ticks);

const stack = await startLocalStack({
  onProgress: (line) => process.stderr.write(`[local-stack] ${line}\n`),
});
const queuePrefix = `bench${Date.now().toString(36).slice(-6)}`;
const aws = createAwsAdapters({
  env: { ...process.env, ...stack.env },
  tableName: stack.env.SHARDGUARD_TABLE,
  queuePrefix,
  logger: silentLogger,
});
const shard = `bench-${Date.now().toString(36)}`;
const nodes = Array.from({ length: nodeCount }, (_, index) => `n${index + 1}`);
const rows: Array<{ operation: string; requests: number; detail: string }> = [];

/** Runs `action` and records the requests it made, per API operation. */
async function measure(operation: string, action: () => Promise<unknown>, through = aws): Promise<number> {
  const before = through.counter.snapshot();
  await action();
  const diff = diffCounts(before, through.counter.snapshot());
  const requests = Object.values(diff).reduce((sum, count) => sum + count.requests, 0);
  const detail = Object.entries(diff)
    .map(([name, count]) => `${name} ${count.requests}`)
    .join(", ");
  rows.push({ operation, requests, detail });
  return requests;
}

function heartbeat(node: string) {
  return {
    shard,
    node_id: node,
    node_address: `127.0.0.1:${6379 + nodes.indexOf(node)}`,
    role: node === "n1" ? ("primary" as const) : ("replica" as const),
    primary_node_id: node === "n1" ? undefined : "n1",
    last_updated: aws.clock.nowMicros(),
    last_txn_id: 1000,
  };
}

function command(type: Command["type"], epoch: number): Command {
  return {
    type,
    shard,
    epoch,
    command_id: `${type}-${epoch}`,
    issued_at: aws.clock.now(),
    primary: { node_id: "n2", address: "127.0.0.1:6380" },
  };
}

try {
  // Start-up, once per node or shard.
  await measure("agent start: ensure queue (new)", () => aws.bus.ensureQueue(shard, "n1"));
  const fresh = createAwsAdapters({
    env: { ...process.env, ...stack.env },
    tableName: stack.env.SHARDGUARD_TABLE,
    queuePrefix,
  });
  await measure(
    "agent start: ensure queue (exists, other process)",
    () => fresh.bus.ensureQueue(shard, "n1"),
    fresh,
  );
  await measure("ensure queue (cached)", () => fresh.bus.ensureQueue(shard, "n1"), fresh);
  fresh.destroy();
  for (const node of nodes.slice(1)) await aws.bus.ensureQueue(shard, node);
  await measure("register shard", () => aws.store.shards.register(shard));
  await measure("topology compare-and-set", () =>
    aws.store.topology.compareAndSet(shard, undefined, {
      shard,
      epoch: 1,
      primary_node_id: "n1",
      status: "online",
      updated_at: aws.clock.now(),
    }),
  );
  await measure("replica set add", () => aws.store.replicaSets.add(shard, "n1", nodes.slice(1)));

  // Steady state.
  await measure("heartbeat put", () => aws.store.heartbeats.put(heartbeat("n1")));
  await measure("shard snapshot", () => aws.store.heartbeats.snapshot(shard));
  await measure("shard index page (100)", () => aws.store.shards.list(undefined, 100));
  await measure("idle long poll (1 s here, 20 s in service)", () =>
    aws.bus.receive(shard, "n3", { waitSeconds: 1 }),
  );

  // Failover steps as DESIGN.md lists them, through the ports.
  await measure("lock acquire", () => aws.store.locks.acquire(shard, "bench", 60_000, "n1"));
  await measure("lock renew", () => aws.store.locks.renew(shard, "bench", 60_000));
  await measure("send command", () => aws.bus.send(shard, "n2", command("PROMOTE", 2)));
  const [received] = await aws.bus.receive(shard, "n2", { waitSeconds: 1 });
  if (received) {
    await measure("redeliver after", () => aws.bus.redeliverAfter(shard, "n2", received, 30));
    await measure("delete command", () => aws.bus.delete(shard, "n2", received));
  }
  await measure("delete node (heartbeat + replica set)", () => aws.store.heartbeats.deleteNode(shard, "n1"));
  await measure("history append", () =>
    aws.store.history.append({
      shard,
      epoch: 2,
      kind: "failover",
      at: aws.clock.now(),
      reason: "bench",
      candidates: [],
      phase_timings: {},
    }),
  );
  await measure("history list", () => aws.store.history.list(shard));
  await measure("lock release", () => aws.store.locks.release(shard, "bench"));

  // Per tick: every agent writes one heartbeat, the controller lists shards and reads one snapshot.
  aws.counter.reset();
  for (let tick = 0; tick < ticks; tick += 1) {
    await Promise.all(nodes.map((node) => aws.store.heartbeats.put(heartbeat(node))));
    await aws.store.shards.list(undefined, 100);
    await aws.store.heartbeats.snapshot(shard);
  }
  const perTick = aws.counter.snapshot();
  const perShardPerTick = {
    heartbeatPuts: (perTick["DynamoDB.PutItem"]?.requests ?? 0) / ticks,
    snapshotQueries: (perTick["DynamoDB.Query"]?.requests ?? 0) / ticks - 1,
    shardIndexQueries: 1,
  };
  const steadyPerShard = perShardPerTick.heartbeatPuts + perShardPerTick.snapshotQueries;
  // An idle agent holds one 20 s long poll at a time.
  const longPollsPerShardPerSecond = nodeCount / 20;
  const summary = {
    nodes: nodeCount,
    ticks,
    perShardPerTick,
    dynamoRequestsPerShardPerSecond: steadyPerShard,
    sqsRequestsPerShardPerSecond: longPollsPerShardPerSecond,
    requestsPerShardPer30Days: Math.round((steadyPerShard + longPollsPerShardPerSecond) * 86_400 * 30),
    clockOffsetBounds: aws.clock.offsetBounds(),
  };
  if (values.json) {
    console.log(JSON.stringify({ operations: rows, summary }));
  } else {
    const width = Math.max(...rows.map((row) => row.operation.length));
    console.log(`${"operation".padEnd(width)}  requests  by API`);
    for (const row of rows)
      console.log(`${row.operation.padEnd(width)}  ${String(row.requests).padStart(8)}  ${row.detail}`);
    console.log("");
    console.log(`per shard per tick (1 s), ${nodeCount} nodes, averaged over ${ticks} ticks:`);
    console.log(`  heartbeat puts     ${perShardPerTick.heartbeatPuts}`);
    console.log(`  snapshot queries   ${perShardPerTick.snapshotQueries}`);
    console.log("  shard index query  1 per tick for up to 100 shards (shared)");
    console.log(
      `  SQS long polls     ${longPollsPerShardPerSecond} per second (one 20 s poll per idle agent)`,
    );
    console.log(
      `  => ${summary.requestsPerShardPer30Days.toLocaleString("en")} requests per shard per 30 days`,
    );
  }
} finally {
  aws.destroy();
  await stack.stop();
}
