import { type FailoverConfig, type FailoverConfigInput, parseFailoverConfig } from "../core/config.ts";
import { ConfigurationError } from "../core/errors.ts";
import { DEFAULT_QUEUE_PREFIX, DEFAULT_TABLE_NAME } from "../core/table.ts";

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
  storeTimeoutMs: "SHARDGUARD_STORE_TIMEOUT_MS",
  redisTimeoutMs: "SHARDGUARD_REDIS_TIMEOUT_MS",
  commandWaitSeconds: "SHARDGUARD_COMMAND_WAIT_SECONDS",
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
  sentinelTls: "SHARDGUARD_SENTINEL_TLS",
  agentConfig: "SHARDGUARD_AGENT_CONFIG",
} as const;

const NUMERIC_KEYS = [
  "heartbeatIntervalMs",
  "failureTimeoutMs",
  "fenceTimeoutMs",
  "tickIntervalMs",
  "lockLeaseMs",
  "maxLagOnFailover",
  "cooldownMs",
] as const;

/** Reads the failover configuration from the environment; errors name the bad variable. */
export function failoverConfigFromEnv(env: NodeJS.ProcessEnv): FailoverConfig {
  const input: Record<string, unknown> = {};
  for (const key of NUMERIC_KEYS) {
    const raw = env[ENV[key]];
    if (raw === undefined || raw === "") continue;
    const value = Number(raw);
    if (!Number.isInteger(value)) {
      throw new ConfigurationError(`${ENV[key]} must be an integer, got "${raw}"`);
    }
    input[key] = value;
  }
  const quorum = env[ENV.quorum];
  if (quorum) input.quorum = quorum;
  try {
    return parseFailoverConfig(input as FailoverConfigInput);
  } catch (error) {
    if (!(error instanceof ConfigurationError)) throw error;
    // Map field names back to the variables the operator set.
    let message = error.message;
    for (const [field, variable] of Object.entries(ENV)) {
      message = message.replaceAll(`${field}:`, `${variable}:`);
    }
    throw new ConfigurationError(message);
  }
}

export function tableNameFromEnv(env: NodeJS.ProcessEnv): string {
  return env[ENV.table] || DEFAULT_TABLE_NAME;
}

export function queuePrefixFromEnv(env: NodeJS.ProcessEnv): string {
  return env[ENV.queuePrefix] || DEFAULT_QUEUE_PREFIX;
}
