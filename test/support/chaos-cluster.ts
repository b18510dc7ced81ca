import type { Redis } from "ioredis";
import { parseReplicationInfo, type ReplicationInfo } from "../../src/agent/redis-info.ts";
import type { FailoverConfigInput } from "../../src/core/config.ts";
import type { Heartbeat, HistoryRecord, Topology } from "../../src/core/model.ts";
import { LocalCluster, type LocalClusterOptions } from "../../src/dev/local-cluster.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { uniqueName } from "./aws.ts";
import { shardguard } from "./cli.ts";

/**
 * Timings for the chaos tests: a failover within a few seconds, while leaving room for the
 * scheduling noise of many processes on two shared cores (the tests assert outcomes, not speed).
 * No cool-down, so a second, unwanted failover would be visible instead of suppressed; a short
 * lease, so a controller killed while holding the lock delays the next one by 3 s only.
 */
export const CHAOS_CONFIG = {
  heartbeatIntervalMs: 250,
  failureTimeoutMs: 1000,
  fenceTimeoutMs: 600,
  tickIntervalMs: 200,
  lockLeaseMs: 3000,
  cooldownMs: 0,
} as const satisfies FailoverConfigInput;

/** Generous bound for anything that waits on processes (start, failover, rejoin). */
export const WAIT_MS = 30_000;

/** A cluster of real processes on its own shard; the caller stops it (afterEach). */
export function startChaosCluster(options: LocalClusterOptions = {}): Promise<LocalCluster> {
  return LocalCluster.start({
    shard: uniqueName("chaos"),
    config: CHAOS_CONFIG,
    readyTimeoutMs: WAIT_MS,
    ...options,
  });
}

/** Waits until the shard is online again at an epoch above `fromEpoch` and returns that topology. */
export async function waitForNewPrimary(
  cluster: LocalCluster,
  fromEpoch: number,
  withinMs: number = WAIT_MS,
): Promise<Topology> {
  let found: Topology | undefined;
  await cluster.waitFor(
    `the shard online at an epoch above ${fromEpoch}`,
    async () => {
      const topology = await cluster.topology();
      if (topology?.status === "online" && topology.epoch > fromEpoch) found = topology;
      return found !== undefined;
    },
    withinMs,
  );
  return found as Topology;
}

/** Waits until the shard is offline and returns that topology. */
export async function waitForOffline(cluster: LocalCluster): Promise<Topology> {
  let found: Topology | undefined;
  await cluster.waitFor(
    "the shard offline",
    async () => {
      const topology = await cluster.topology();
      if (topology?.status === "offline") found = topology;
      return found !== undefined;
    },
    WAIT_MS,
  );
  return found as Topology;
}

/** Waits until each of `ids` reports itself a linked replica of `primaryId` (heartbeat and ROLE). */
export async function waitForFollowers(
  cluster: LocalCluster,
  primaryId: string,
  ids: readonly string[],
): Promise<void> {
  const primary = cluster.node(primaryId);
  await cluster.waitFor(
    `${ids.join(", ")} following ${primaryId}`,
    async () => {
      const snapshot = await cluster.snapshot();
      for (const id of ids) {
        const heartbeat = cluster.heartbeatOf(snapshot, id);
        if (heartbeat?.role !== "replica" || heartbeat.primary_node_id !== primaryId) return false;
        if (heartbeat.primary_link !== "up") return false;
        const role = await roleOf(cluster.node(id));
        if (role.role !== "slave" || role.primaryPort !== primary.port || role.state !== "connected")
          return false;
      }
      return true;
    },
    WAIT_MS,
  );
}

/** Waits until `primaryId`'s stored replica set holds every one of `members`. */
export async function waitForMembers(
  cluster: LocalCluster,
  primaryId: string,
  members: readonly string[],
): Promise<void> {
  await cluster.waitFor(
    `${members.join(" and ")} in ${primaryId}'s replica set`,
    async () => {
      const stored = (await cluster.snapshot()).replicaSets[primaryId] ?? [];
      return members.every((id) => stored.includes(id));
    },
    WAIT_MS,
  );
}

/** Waits until a controller logged a decision with \`code\` (a hold) and returns that line. */
export async function waitForHold(
  cluster: LocalCluster,
  code: string,
  what: string,
): Promise<Record<string, unknown>> {
  let held: Record<string, unknown> | undefined;
  await cluster.waitFor(
    what,
    () => {
      held = cluster.controllerLogLines().find((line) => line.code === code);
      return held !== undefined;
    },
    WAIT_MS,
  );
  return held as Record<string, unknown>;
}

/** Waits until node `id`'s agent wrote a heartbeat more than `afterMs` (epoch ms) past `sinceMs`. */
export async function waitForAgentWrite(
  cluster: LocalCluster,
  id: string,
  sinceMs: number,
  afterMs: number,
): Promise<void> {
  await cluster.waitFor(
    `${id}'s agent writing after ${afterMs} ms`,
    async () => {
      const heartbeat = cluster.heartbeatOf(await cluster.snapshot(), id);
      return (heartbeat?.agent_updated ?? 0) / 1000 > sinceMs + afterMs;
    },
    WAIT_MS,
  );
}

export interface RoleReply {
  readonly role: "master" | "slave" | "unreachable";
  /** Replica: the port of the primary it follows. */
  readonly primaryPort?: number;
  /** Replica: connect, connecting, sync or connected. */
  readonly state?: string;
  /** Primary: its replication offset; replica: the offset it processed. */
  readonly offset?: number;
}

/** One short-lived client for one question: the real answer of the server, no cached state. */
export async function withClient<T>(node: RedisNode, use: (client: Redis) => Promise<T>): Promise<T> {
  const client = node.client({
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: 2000,
    commandTimeout: 2000,
  });
  client.on("error", () => {});
  try {
    await client.connect();
    return await use(client);
  } finally {
    client.disconnect();
  }
}

/** A heartbeat in one line for a diagnostic: role, database state, epoch, lineage and its links. */
export function describeReport(node: Heartbeat | undefined): string {
  if (node === undefined) return "no report";
  const prior = node.prior_lineage;
  const answered = node.answered_prior_lineage;
  return (
    `${node.node_id}: ${node.role} db ${node.db_status}${node.db_crash ? ` (${node.db_crash.state})` : ""}, ` +
    `epoch ${node.epoch}, ${node.repl_id?.slice(0, 6)}@${node.last_txn_id}` +
    `${prior ? `, prior ${prior.repl_id.slice(0, 6)}@${prior.last_txn_id}` : ""}` +
    `${answered ? `, answered prior ${answered.repl_id.slice(0, 6)}@${answered.last_txn_id}` : ""}`
  );
}

/** One line of a node's replication for a test's diagnostics: role, link, id@offset, prior id@offset. */
export function describeInfo(id: string, info: ReplicationInfo | string): string {
  if (typeof info === "string") return `${id}: ${info}`;
  const link = info.primary ? ` of :${info.primary.port} link ${info.primary.link}` : "";
  const prior = info.prior ? `, prior ${info.prior.replId.slice(0, 6)}@${info.prior.offset}` : "";
  return `${id}: ${info.role}${link} ${info.replId.slice(0, 6)}@${info.offset}${prior}`;
}

/** `INFO replication` of \`node\`, read by the agent's own parser. */
export async function replicationOf(node: RedisNode): Promise<ReplicationInfo> {
  return parseReplicationInfo(await withClient(node, (client) => client.info("replication")));
}

/** `ROLE` as the server answers it. */
export async function roleOf(node: RedisNode): Promise<RoleReply> {
  try {
    const reply = (await withClient(node, (client) => client.call("ROLE"))) as unknown[];
    if (reply[0] === "master") return { role: "master", offset: Number(reply[1]) };
    return {
      role: "slave",
      primaryPort: Number(reply[2]),
      state: String(reply[3]),
      offset: Number(reply[4]),
    };
  } catch {
    return { role: "unreachable" };
  }
}

export interface WriteProbe {
  readonly node: string;
  readonly role: RoleReply["role"];
  /** The server acknowledged the write. */
  readonly accepted: boolean;
  /** Why it refused (READONLY, NOREPLICAS, connection error). */
  readonly refusal?: string;
}

/** Asks a node's role and tries one real write on it. */
export async function probeWrite(node: RedisNode, key: string): Promise<WriteProbe> {
  const { role } = await roleOf(node);
  try {
    await withClient(node, (client) => client.set(key, String(Date.now())));
    return { node: node.id, role, accepted: true };
  } catch (error) {
    return {
      node: node.id,
      role,
      accepted: false,
      refusal: error instanceof Error ? error.message : String(error),
    };
  }
}

/** One write to `client` and `WAIT 1`: "acked" when a replica acknowledged it, else why not (the error's code). */
export async function tryAcknowledgedWrite(client: Redis, key: string): Promise<"acked" | string> {
  try {
    await client.set(key, "v");
    const acked = Number(await client.call("WAIT", "1", "200"));
    return acked >= 1 ? "acked" : "unacknowledged";
  } catch (error) {
    return error instanceof Error ? (error.message.split(" ")[0] ?? "error") : String(error);
  }
}

/**
 * Writes `count` keys `<prefix>:<n>` to a node and waits until `replicas` replicas acknowledged
 * them (Redis WAIT), so that exactly what the test expects to survive has reached them.
 */
export async function writeKeys(
  node: RedisNode,
  prefix: string,
  count: number,
  replicas: number,
): Promise<void> {
  await withClient(node, async (client) => {
    const pipeline = client.pipeline();
    for (let index = 0; index < count; index++)
      pipeline.set(`${prefix}:${index}`, `${prefix}-value-${index}`.padEnd(100, "."));
    // A refused SET (NOREPLICAS while the write guard fences, READONLY) is an error in its slot,
    // not a rejection: without this check WAIT would "acknowledge" writes that never happened.
    const refused = (await pipeline.exec())?.find(([error]) => error !== null)?.[0];
    if (refused) throw new Error(`${prefix} writes refused: ${refused.message}`);
    if (replicas > 0) {
      const acked = Number(await client.call("WAIT", String(replicas), "5000"));
      if (acked < replicas) throw new Error(`only ${acked} of ${replicas} replicas acknowledged ${prefix}`);
    }
  });
}

/** How many of the keys `<prefix>:0..count-1` a node holds. */
export async function countKeys(node: RedisNode, prefix: string, count: number): Promise<number> {
  return withClient(node, async (client) => {
    const keys = Array.from({ length: count }, (_, index) => `${prefix}:${index}`);
    const values = await client.mget(...keys);
    return values.filter((value) => value !== null).length;
  });
}

/**
 * Waits until the shard is online and every node but its primary reports itself its replica with
 * the link up: whichever primary the controller kept or chose (the tests judge it by the data).
 */
export async function waitForSettled(
  cluster: LocalCluster,
  ids: readonly string[] = ["node-1", "node-2", "node-3"],
): Promise<void> {
  await cluster.waitFor(
    "every node following the shard's primary",
    async () => {
      const topology = await cluster.topology();
      const primary = topology?.primary_node_id;
      if (topology?.status !== "online" || primary === undefined) return false;
      const snapshot = await cluster.snapshot();
      const reported = ids
        .filter((id) => id !== primary)
        .every((id) => {
          const heartbeat = cluster.heartbeatOf(snapshot, id);
          return (
            heartbeat?.role === "replica" &&
            heartbeat.primary_node_id === primary &&
            heartbeat.primary_link === "up"
          );
        });
      if (!reported) return false;
      // The stored reports may predate a fault (a quiet replica writes on a change): the databases
      // themselves must agree.
      if ((await roleOf(cluster.node(primary))).role !== "master") return false;
      for (const id of ids.filter((other) => other !== primary)) {
        const role = await roleOf(cluster.node(id));
        if (
          role.role !== "slave" ||
          role.primaryPort !== cluster.node(primary).port ||
          role.state !== "connected"
        ) {
          return false;
        }
      }
      return true;
    },
    WAIT_MS,
  );
}

/** Asserts that each of \`ids\` holds every key \`<prefix>:0..count-1\` of each \`[prefix, count]\`. */
export async function expectKeysEverywhere(
  cluster: LocalCluster,
  sets: ReadonlyArray<readonly [string, number]>,
  ids: readonly string[] = ["node-1", "node-2", "node-3"],
): Promise<void> {
  for (const id of ids) {
    for (const [prefix, count] of sets) {
      const held = await countKeys(cluster.node(id), prefix, count);
      if (held !== count) throw new Error(`${id} holds ${held} of ${count} ${prefix} keys`);
    }
  }
}

/** `shardguard pause` (an operator's maintenance), then waits for the topology to say so. */
export async function pauseShard(cluster: LocalCluster, reason = "maintenance"): Promise<void> {
  const paused = await shardguard(cluster, "pause", "--shard", cluster.shard, "--reason", reason);
  if (paused.code !== 0) throw new Error(`pause exited ${paused.code}: ${paused.stderr}${paused.stdout}`);
  await cluster.waitFor(
    "the shard paused",
    async () => (await cluster.topology())?.status === "paused",
    WAIT_MS,
  );
}

/** `shardguard resume`. */
export async function resumeShard(cluster: LocalCluster): Promise<void> {
  const resumed = await shardguard(cluster, "resume", "--shard", cluster.shard);
  if (resumed.code !== 0)
    throw new Error(`resume exited ${resumed.code}: ${resumed.stderr}${resumed.stdout}`);
}

/** Log records (from `LocalCluster.logLines`) whose `message` matches. */
export function linesWith(
  lines: ReadonlyArray<Record<string, unknown>>,
  message: string | RegExp,
): Array<Record<string, unknown>> {
  return lines.filter((line) => {
    const text = String(line.message ?? "");
    return typeof message === "string" ? text === message : message.test(text);
  });
}

/** The one history record of `epoch`, or a clear failure. */
export async function historyAt(cluster: LocalCluster, epoch: number): Promise<HistoryRecord> {
  const records = await cluster.aws.store.history.list(cluster.shard, 100);
  const record = records.find((candidate) => candidate.epoch === epoch);
  if (!record)
    throw new Error(`no history record at epoch ${epoch}; have ${records.map((r) => r.epoch).join(", ")}`);
  return record;
}

/**
 * A replica notices a frozen (not crashed) primary only after its `repl-timeout` (Redis default
 * 60 s): the TCP connection stays open, so `master_link_status` stays `up` and, under the majority
 * quorum, no failover happens before that (measured: 58.5 s with the defaults). These settings
 * bound it to ~2 s; the primary pings its replicas every second so an idle link never times out.
 * Set on every node, as any of them may become the primary.
 */
export async function shortenReplicationTimeout(cluster: LocalCluster): Promise<void> {
  for (const node of cluster.redis) {
    await withClient(node, async (client) => {
      await client.config("SET", "repl-ping-replica-period", "1");
      await client.config("SET", "repl-timeout", "2");
    });
  }
}

/**
 * Waits until the topology names an online primary past \`afterEpoch\` that takes a write: its id
 * and how long after \`since\` (a \`performance.now()\`) that was. Fails after \`withinMs\`.
 */
export async function waitForWritablePrimary(
  cluster: LocalCluster,
  afterEpoch: number,
  since: number,
  withinMs: number,
): Promise<{ primary: string; afterMs: number }> {
  let found: { primary: string; afterMs: number } | undefined;
  await cluster.waitFor(
    "a writable primary named by the topology",
    async () => {
      const topology = await cluster.topology();
      if (topology?.status !== "online" || topology.epoch <= afterEpoch) return false;
      const named = topology.primary_node_id ?? "";
      if (!(await probeWrite(cluster.node(named), "writable-probe")).accepted) return false;
      found = { primary: named, afterMs: performance.now() - since };
      return true;
    },
    withinMs,
  );
  if (found === undefined) throw new Error("no writable primary");
  return found;
}

/** Read-only: spins on TIME for ARGV[1] microseconds (Redis flushes replica output only after it). */
const BUSY_SCRIPT = `
local start = redis.call('TIME')
local now = start
repeat now = redis.call('TIME') until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) > tonumber(ARGV[1])
return 1`;

/**
 * Has `node` take one more write (`key`, no WAIT) and hang before sending it to its replicas: the
 * write is pipelined ahead of a script busy for `busyMs`, and the process is SIGSTOPped once
 * another connection's PING goes unanswered for 100 ms (it is inside the script). Its offset is
 * then past its replicas'. The caller continues it (SIGCONT).
 */
export async function hangAfterUnsentWrite(
  cluster: LocalCluster,
  node: RedisNode,
  key: string,
  busyMs: number,
): Promise<void> {
  const busy = node.client({ lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  busy.on("error", () => {});
  const probe = node.client({
    commandTimeout: 100,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  probe.on("error", () => {});
  try {
    await busy.connect();
    await probe.connect();
    void busy
      .pipeline()
      .set(key, "v")
      .eval(BUSY_SCRIPT, 0, String(busyMs * 1000))
      .exec()
      .catch(() => undefined);
    await cluster.waitFor(
      `${node.id} busy in the script`,
      async () =>
        probe.ping().then(
          () => false,
          () => true,
        ),
      busyMs,
    );
    node.signal("SIGSTOP");
  } finally {
    probe.disconnect();
    busy.disconnect();
  }
}
