import { describeIssues, type FailoverConfig, failoverConfigSchema } from "../core/config.ts";
import { ConfigurationError } from "../core/errors.ts";
import { type PrimaryRecords, primaryRecordsSchema } from "../core/primary-record.ts";
import { DEFAULT_QUEUE_PREFIX, DEFAULT_TABLE_NAME } from "../core/table.ts";
import { loadSettings, type Setting } from "./settings.ts";

/**
 * Environment variables shared by the Lambda controller, the agent, the CLI and the CDK
 * construct that sets them: one list, so the names cannot drift.
 */
export const ENV = {
  table: "SHARDGUARD_TABLE",
  queuePrefix: "SHARDGUARD_QUEUE_PREFIX",
  eventBusName: "SHARDGUARD_EVENT_BUS",
  /** Controller Lambda the CLI invokes for switchover, pause and resume. */
  controllerFunction: "SHARDGUARD_CONTROLLER_FUNCTION",
  heartbeatIntervalMs: "SHARDGUARD_HEARTBEAT_INTERVAL_MS",
  failureTimeoutMs: "SHARDGUARD_FAILURE_TIMEOUT_MS",
  fenceTimeoutMs: "SHARDGUARD_FENCE_TIMEOUT_MS",
  tickIntervalMs: "SHARDGUARD_TICK_INTERVAL_MS",
  lockLeaseMs: "SHARDGUARD_LOCK_LEASE_MS",
  maxLagOnFailover: "SHARDGUARD_MAX_LAG_ON_FAILOVER",
  quorum: "SHARDGUARD_QUORUM",
  cooldownMs: "SHARDGUARD_COOLDOWN_MS",
  // The node agent (docs/agent.md); each also has a flag or config-file key.
  shard: "SHARDGUARD_SHARD",
  nodeId: "SHARDGUARD_NODE_ID",
  redis: "SHARDGUARD_REDIS",
  address: "SHARDGUARD_ADDRESS",
  priority: "SHARDGUARD_PRIORITY",
  stateDir: "SHARDGUARD_STATE_DIR",
  fencePolicy: "SHARDGUARD_FENCE_POLICY",
  primaryKeepaliveMs: "SHARDGUARD_PRIMARY_KEEPALIVE_MS",
  replicaKeepaliveMs: "SHARDGUARD_REPLICA_KEEPALIVE_MS",
  storeTimeoutMs: "SHARDGUARD_STORE_TIMEOUT_MS",
  redisTimeoutMs: "SHARDGUARD_REDIS_TIMEOUT_MS",
  commandWaitSeconds: "SHARDGUARD_COMMAND_WAIT_SECONDS",
  commandSenders: "SHARDGUARD_COMMAND_SENDERS",
  redisUsername: "SHARDGUARD_REDIS_USERNAME",
  redisPassword: "SHARDGUARD_REDIS_PASSWORD",
  redisPasswordFile: "SHARDGUARD_REDIS_PASSWORD_FILE",
  redisTls: "SHARDGUARD_REDIS_TLS",
  redisCa: "SHARDGUARD_REDIS_CA",
  redisCert: "SHARDGUARD_REDIS_CERT",
  redisKey: "SHARDGUARD_REDIS_KEY",
  redisServername: "SHARDGUARD_REDIS_SERVERNAME",
  redisTlsInsecure: "SHARDGUARD_REDIS_TLS_INSECURE",
  logLevel: "SHARDGUARD_LOG_LEVEL",
  sentinelPort: "SHARDGUARD_SENTINEL_PORT",
  sentinelBind: "SHARDGUARD_SENTINEL_BIND",
  sentinelPassword: "SHARDGUARD_SENTINEL_PASSWORD",
  sentinelPasswordFile: "SHARDGUARD_SENTINEL_PASSWORD_FILE",
  sentinelProtectedMode: "SHARDGUARD_SENTINEL_PROTECTED_MODE",
  sentinelTls: "SHARDGUARD_SENTINEL_TLS",
  sentinelCert: "SHARDGUARD_SENTINEL_CERT",
  sentinelKey: "SHARDGUARD_SENTINEL_KEY",
  sentinelCa: "SHARDGUARD_SENTINEL_CA",
  httpPort: "SHARDGUARD_HTTP_PORT",
  httpBind: "SHARDGUARD_HTTP_BIND",
  httpTls: "SHARDGUARD_HTTP_TLS",
  httpCert: "SHARDGUARD_HTTP_CERT",
  httpKey: "SHARDGUARD_HTTP_KEY",
  agentConfig: "SHARDGUARD_AGENT_CONFIG",
  /** JSON: shard id → `{ hostedZoneId, name, ttl }`, the controller's DNS record per shard (docs/clients.md#dns). */
  primaryRecords: "SHARDGUARD_PRIMARY_RECORDS",
  /** A directory: every AWS request a component makes is appended there (src/adapters/aws-call-journal.ts). */
  awsCallLog: "SHARDGUARD_AWS_CALL_LOG",
} as const;

/**
 * The failover timing and policy, as the controller (Lambda or `shardguard controller`) and the CLI
 * read them from the environment; the CDK construct sets them from its props. The agent reads the
 * timing settings too (src/agent/options.ts). Docs: the table in docs/controller.md.
 */
export const FAILOVER_SETTINGS = [
  {
    key: "heartbeatIntervalMs",
    kind: "integer",
    env: ENV.heartbeatIntervalMs,
    default: "`1000`",
    description:
      "How often each agent checks its database (and writes its heartbeat while in doubt); agents and controller must agree.",
  },
  {
    key: "failureTimeoutMs",
    kind: "integer",
    env: ENV.failureTimeoutMs,
    default: "`3000`",
    description: "A primary whose heartbeat is older than this is stale. Must be > the heartbeat interval.",
  },
  {
    key: "fenceTimeoutMs",
    kind: "integer",
    env: ENV.fenceTimeoutMs,
    default: "`2500`",
    description:
      "A primary whose agent wrote no heartbeat for this long applies its fence policy. Must be < the failure timeout.",
  },
  {
    key: "tickIntervalMs",
    kind: "integer",
    env: ENV.tickIntervalMs,
    default: "`1000`",
    description: "Pause between two controller passes over its shards.",
  },
  {
    key: "lockLeaseMs",
    kind: "integer",
    env: ENV.lockLeaseMs,
    default: "`60000`",
    description: "Lease of a shard's failover lock; a crashed orchestrator's lock is taken over after it.",
  },
  {
    key: "maxLagOnFailover",
    kind: "integer",
    env: ENV.maxLagOnFailover,
    default: "`1048576`",
    description:
      "A replica further behind the old primary than this (replication offset, bytes) is not promoted.",
  },
  {
    key: "quorum",
    kind: "string",
    env: ENV.quorum,
    default: "`majority`",
    description:
      "How many fresh replicas must report the primary down before a failover: `none`, `majority` or `all`.",
  },
  {
    key: "cooldownMs",
    kind: "integer",
    env: ENV.cooldownMs,
    default: "`300000`",
    description:
      "No automatic failover for this long after one completed, unless the primary's own agent confirms its database died (a crash report).",
  },
] as const satisfies readonly Setting[];

/** Reads the failover configuration from the environment; errors name the bad variable. */
export function failoverConfigFromEnv(env: NodeJS.ProcessEnv): FailoverConfig {
  return loadSettings(FAILOVER_SETTINGS, failoverConfigSchema, { env }, "invalid configuration");
}

export function tableNameFromEnv(env: NodeJS.ProcessEnv): string {
  return env[ENV.table] || DEFAULT_TABLE_NAME;
}

export function queuePrefixFromEnv(env: NodeJS.ProcessEnv): string {
  return env[ENV.queuePrefix] || DEFAULT_QUEUE_PREFIX;
}

/** The controller's DNS records per shard (`SHARDGUARD_PRIMARY_RECORDS`), or none when unset. */
export function primaryRecordsFromEnv(env: NodeJS.ProcessEnv): PrimaryRecords | undefined {
  const text = env[ENV.primaryRecords];
  if (text === undefined || text.trim() === "") return undefined;
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new ConfigurationError(
      `${ENV.primaryRecords}: not JSON (a map of shard id to { hostedZoneId, name, ttl })`,
    );
  }
  const result = primaryRecordsSchema.safeParse(parsed);
  if (!result.success) throw new ConfigurationError(`${ENV.primaryRecords}: ${describeIssues(result.error)}`);
  return result.data;
}
