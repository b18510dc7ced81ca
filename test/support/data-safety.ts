import { createWriteStream, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { DynamoDBDocumentClient, GetCommand, PutCommand } from "@aws-sdk/lib-dynamodb";
import type { Redis } from "ioredis";
import { keys } from "../../src/core/table.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { type ManagedProcess, startProcess } from "../../src/dev/local-stack/processes.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { dynamoClient, tableName } from "./aws.ts";
import { probeWrite, type RoleReply, roleOf, type WriteProbe, withClient } from "./chaos-cluster.ts";

/**
 * Helpers for the data-safety and failsafe tests (issues 13 and 20). They observe the shard the
 * way an operator or a client would: raw table items, ROLE, real writes. Nothing here reads the
 * agent's or the controller's internals, so the tests hold whatever the fixes look like inside.
 */

/** The CLI source, run with the same Node as the tests (as LocalCluster does). */
export const CLI = fileURLToPath(new URL("../../src/cli/main.ts", import.meta.url));

/** Raw table access with the plain SDK, straight to DynamoDB (never through a test proxy). */
export function rawTable(): {
  get(pk: string, sk: string): Promise<Record<string, unknown> | undefined>;
  put(item: Record<string, unknown>): Promise<void>;
  destroy(): void;
} {
  const client = dynamoClient();
  const documents = DynamoDBDocumentClient.from(client);
  const table = tableName();
  return {
    async get(pk, sk) {
      const out = await documents.send(
        new GetCommand({ TableName: table, Key: { pk, sk }, ConsistentRead: true }),
      );
      return out.Item as Record<string, unknown> | undefined;
    },
    async put(item) {
      await documents.send(new PutCommand({ TableName: table, Item: item }));
    },
    destroy: () => client.destroy(),
  };
}

/**
 * Overwrites the shard's TOPOLOGY item with a copy that no schema accepts: `patch` applied over
 * the stored item. Returns the item as it was before.
 */
export async function corruptTopology(
  shard: string,
  patch: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  const table = rawTable();
  try {
    const before = await table.get(keys.controlPk(shard), keys.topology);
    if (!before) throw new Error(`shard ${shard} has no TOPOLOGY item to corrupt`);
    await table.put({ ...before, ...patch });
    return before;
  } finally {
    table.destroy();
  }
}

/** The raw heartbeat item of a node (no schema: what is stored), or undefined. */
export async function rawHeartbeat(
  shard: string,
  nodeId: string,
): Promise<Record<string, unknown> | undefined> {
  const table = rawTable();
  try {
    // The node's own partition (docs/coordination.md): only its agent writes there.
    return await table.get(keys.nodePk(shard, nodeId), keys.node(nodeId));
  } finally {
    table.destroy();
  }
}

/** A `shardguard agent` process this test started itself; stop it by its PID. */
export interface SpawnedAgent {
  readonly proc: ManagedProcess;
  readonly stateDir: string;
  readonly logFile: string;
  stop(): Promise<void>;
}

/**
 * Starts `shardguard agent` beside `node` with the cluster's environment (plus `env`), a fresh
 * empty state dir and, unless `nodeId` is given, no `--node-id`: the agent of an ephemeral
 * sidecar that lost its state. Its log goes to `<cluster.logDir>/<logName>`.
 */
export function spawnAgent(
  cluster: LocalCluster,
  node: RedisNode,
  options: { nodeId?: string; env?: NodeJS.ProcessEnv; logName: string; priority?: number },
): SpawnedAgent {
  const stateDir = mkdtempSync(join(tmpdir(), `shardguard-agent-fresh-${node.id}-`));
  const args = [CLI, "agent", "--shard", cluster.shard, "--redis", node.address, "--state-dir", stateDir];
  if (options.nodeId) args.push("--node-id", options.nodeId);
  args.push("--priority", String(options.priority ?? 100));
  const env = { ...cluster.env, ...options.env };
  const proc = startProcess(`agent ${options.logName}`, process.execPath, args, { env });
  const logFile = join(cluster.logDir, options.logName);
  const log = createWriteStream(logFile, { flags: "a" });
  proc.child.stdout?.pipe(log);
  proc.child.stderr?.pipe(log);
  return {
    proc,
    stateDir,
    logFile,
    async stop() {
      if (proc.child.exitCode === null && proc.child.signalCode === null) proc.child.kill("SIGCONT");
      await proc.stop(3000);
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

/** ROLE and one real write on every node, in parallel. */
export function probeAll(cluster: LocalCluster, keyPrefix = "probe"): Promise<WriteProbe[]> {
  return Promise.all(cluster.redis.map((node) => probeWrite(node, `${keyPrefix}:${node.id}`)));
}

/** The nodes that answered ROLE master and acknowledged the write. */
export function writable(probes: readonly WriteProbe[]): string[] {
  return probes.filter((probe) => probe.role === "master" && probe.accepted).map((probe) => probe.node);
}

/** ROLE of every node, with the node it belongs to. */
export async function rolesOf(cluster: LocalCluster): Promise<Array<RoleReply & { node: RedisNode }>> {
  return Promise.all(cluster.redis.map(async (node) => ({ ...(await roleOf(node)), node })));
}

/** Nodes whose ROLE says they replicate from their own port. */
export async function selfReplicating(cluster: LocalCluster): Promise<string[]> {
  return (await rolesOf(cluster))
    .filter((role) => role.role === "slave" && role.primaryPort === role.node.port)
    .map((role) => role.node.id);
}

/** DBSIZE of a node, or -1 when it does not answer. */
export async function dbsize(node: RedisNode): Promise<number> {
  try {
    return await withClient(node, (client) => client.dbsize());
  } catch {
    return -1;
  }
}

/** Which of `keys` a node lacks. */
export async function missingKeys(node: RedisNode, keys: readonly string[]): Promise<string[]> {
  if (keys.length === 0) return [];
  const missing: string[] = [];
  await withClient(node, async (client) => {
    for (let start = 0; start < keys.length; start += 500) {
      const chunk = keys.slice(start, start + 500);
      const values = await client.mget(...chunk);
      chunk.forEach((key, index) => {
        if (values[index] === null) missing.push(key);
      });
    }
  });
  return missing;
}

/** One continuous writer's outcome. */
export interface WriterReport {
  /** Keys acknowledged (and, with `waitReplicas`, acknowledged by that many replicas too). */
  readonly acked: string[];
  /** The node that acknowledged each key. */
  readonly ackedBy: Map<string, string>;
  /** Sum of the gaps between an acknowledgement and the next one after a failed attempt, ms. */
  readonly unavailableMs: number;
  /** The longest such gap, ms. */
  readonly longestGapMs: number;
  readonly attempts: number;
}

/**
 * A client that writes continuously (a new key every `pauseMs`) and measures how long it went
 * without an acknowledged write. With `follow`, a refused write is retried on the other nodes in
 * turn, as a client that looks for the writable primary does; without it, it stays on `start`.
 * With `waitReplicas`, a write counts as acknowledged only once `WAIT waitReplicas` confirms it.
 */
export function continuousWriter(
  cluster: LocalCluster,
  start: string,
  options: { prefix: string; follow?: boolean; waitReplicas?: number; pauseMs?: number },
): { report: () => WriterReport; stop: () => Promise<WriterReport> } {
  const clients = new Map<string, Redis>();
  const clientFor = (id: string): Redis => {
    let client = clients.get(id);
    if (!client) {
      client = cluster.node(id).client({
        maxRetriesPerRequest: 0,
        commandTimeout: 500,
        connectTimeout: 500,
        enableOfflineQueue: false,
        retryStrategy: () => 50,
      });
      client.on("error", () => {});
      clients.set(id, client);
    }
    return client;
  };
  const acked: string[] = [];
  const ackedBy = new Map<string, string>();
  let unavailableMs = 0;
  let longestGapMs = 0;
  let attempts = 0;
  let lastAck = performance.now();
  let failedSinceAck = false;
  let current = start;
  let running = true;
  const order = cluster.redis.map((node) => node.id);

  const tryWrite = async (id: string, key: string): Promise<boolean> => {
    try {
      const client = clientFor(id);
      await client.set(key, `${options.prefix}-${key}`);
      if (options.waitReplicas) {
        const acks = Number(await client.call("WAIT", String(options.waitReplicas), "300"));
        if (acks < options.waitReplicas) return false;
      }
      return true;
    } catch {
      return false;
    }
  };

  const loop = (async () => {
    for (let seq = 0; running; seq++) {
      const key = `${options.prefix}:${seq}`;
      attempts++;
      const candidates = options.follow ? [current, ...order.filter((id) => id !== current)] : [current];
      let by: string | undefined;
      for (const id of candidates) {
        if (await tryWrite(id, key)) {
          by = id;
          break;
        }
      }
      const now = performance.now();
      if (by !== undefined) {
        acked.push(key);
        ackedBy.set(key, by);
        current = by;
        if (failedSinceAck) {
          unavailableMs += now - lastAck;
          longestGapMs = Math.max(longestGapMs, now - lastAck);
        }
        failedSinceAck = false;
        lastAck = now;
      } else {
        failedSinceAck = true;
      }
      await delay(options.pauseMs ?? 10);
    }
  })();

  const report = (): WriterReport => {
    const openGap = failedSinceAck ? performance.now() - lastAck : 0;
    return {
      acked: [...acked],
      ackedBy: new Map(ackedBy),
      unavailableMs: unavailableMs + openGap,
      longestGapMs: Math.max(longestGapMs, openGap),
      attempts,
    };
  };
  return {
    report,
    stop: async () => {
      running = false;
      await loop;
      const final = report();
      for (const client of clients.values()) client.disconnect();
      return final;
    },
  };
}

/**
 * Probes every node (ROLE + a write) every `intervalMs` until stopped and keeps the samples in
 * which more than one node was a writable primary.
 */
export function splitBrainWatch(
  cluster: LocalCluster,
  intervalMs = 100,
): { stop: () => Promise<{ samples: number; split: Array<{ at: number; nodes: string[] }> }> } {
  let running = true;
  let samples = 0;
  const split: Array<{ at: number; nodes: string[] }> = [];
  const started = performance.now();
  const loop = (async () => {
    while (running) {
      const nodes = writable(await probeAll(cluster, "split-probe"));
      samples++;
      if (nodes.length > 1) split.push({ at: Math.round(performance.now() - started), nodes });
      await delay(intervalMs);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return { samples, split };
    },
  };
}
