import { homedir } from "node:os";
import { join } from "node:path";
import { z } from "zod";
import { ENV } from "../adapters/env.ts";
import { commandSendersSchema, queuePrefixSchema } from "../adapters/queue-names.ts";
import {
  settingLabel as labelOf,
  loadSettings,
  readJsonConfigFile,
  type Setting,
} from "../adapters/settings.ts";
import { parseAddress } from "../core/address.ts";
import { checkTimings, describeIssues, keepalives } from "../core/config.ts";
import { ConfigurationError, errorMessage } from "../core/errors.ts";
import { addressSchema, idSchema } from "../core/model.ts";
import { LOG_LEVELS } from "../core/observability.ts";
import { DEFAULT_QUEUE_PREFIX, DEFAULT_TABLE_NAME } from "../core/table.ts";
import { FENCE_POLICIES } from "../core/write-guard.ts";

export { FENCE_POLICIES, type FencePolicy } from "../core/write-guard.ts";

/**
 * Where the agent keeps its node id when neither a flag nor a variable names a directory: an
 * absolute path, so that an agent started from another working directory finds its identity.
 */
export const DEFAULT_STATE_DIR = join(homedir(), ".local", "state", "shardguard");

/** `host:port`, or `rediss://host:port` (TLS) and `redis://host:port` as client libraries spell them. */
const REDIS_URL = /^(rediss?:\/\/)?([^\s:/@]+:\d{1,5})$/;

/**
 * Every agent setting, declared once: the loader, the `agent` command's flags (src/cli/commands/
 * agent.ts) and the table in docs/agent.md (`npm run docs:settings`) are made from this list.
 * Passwords have no flag so that they never show in `ps`.
 */
export const AGENT_SETTINGS = [
  {
    key: "shard",
    kind: "string",
    flag: "--shard",
    placeholder: "<id>",
    env: ENV.shard,
    default: "required",
    description: "Shard id (1–24 letters, digits, `-`, `_`).",
  },
  {
    key: "nodeId",
    kind: "string",
    flag: "--node-id",
    placeholder: "<id>",
    env: ENV.nodeId,
    default: "stored, else generated",
    description:
      "This node's id; it must match the one stored in the state dir ([node id](#state-dir-and-node-id)).",
  },
  {
    key: "redis",
    kind: "string",
    flag: "--redis",
    placeholder: "<host:port>",
    env: ENV.redis,
    default: "required",
    description:
      "`host:port` the agent uses to reach its own database; `rediss://host:port` also turns on `--redis-tls`.",
  },
  {
    key: "address",
    kind: "string",
    flag: "--address",
    placeholder: "<host:port>",
    env: ENV.address,
    default:
      "`--redis`; for a loopback `--redis`, the task's (ECS `awsvpc`) or instance's (IMDSv2) IPv4 with its port, kept loopback only when every AWS endpoint is local, else the agent refuses to start",
    description:
      "`host:port` *other nodes* reach this database on (written as `node_address`, used in `REPLICAOF`).",
  },
  {
    key: "priority",
    kind: "integer",
    flag: "--priority",
    placeholder: "<n>",
    env: ENV.priority,
    default: "`100`",
    description:
      "`0` = never promote; otherwise lower is preferred — among the nodes holding the most data only (a failover never gives up writes for a preference; a switchover goes to the preferred node).",
  },
  {
    key: "stateDir",
    kind: "string",
    flag: "--state-dir",
    placeholder: "<dir>",
    env: ENV.stateDir,
    default: "`$STATE_DIRECTORY`, else `~/.local/state/shardguard` (absolute: never the working directory)",
    description: "Durable agent state: node id, applied epoch, command ids.",
  },
  {
    key: "fencePolicy",
    kind: "string",
    flag: "--fence-policy",
    placeholder: "<policy>",
    env: ENV.fencePolicy,
    default: "`failsafe`",
    description: "`failsafe`, `fence` or `keep-serving`, see [fence policies](#fence-policies).",
  },
  {
    key: "heartbeatIntervalMs",
    kind: "integer",
    flag: "--heartbeat-interval-ms",
    placeholder: "<ms>",
    env: ENV.heartbeatIntervalMs,
    default: "`1000`",
    description:
      "The agent's cycle: it reads its database's INFO and probes its primary this often, and writes its heartbeat on a change, every cycle while in doubt, and otherwise at its keepalive.",
  },
  {
    key: "primaryKeepaliveMs",
    kind: "integer",
    flag: "--primary-keepalive-ms",
    placeholder: "<ms>",
    env: ENV.primaryKeepaliveMs,
    default: "`max(heartbeat, min(2 × heartbeat, fence timeout − heartbeat / 2))`: 2000",
    description:
      "The longest a primary goes without writing its heartbeat (and reading the topology). Must be ≥ `heartbeatIntervalMs` and < `fenceTimeoutMs`.",
  },
  {
    key: "replicaKeepaliveMs",
    kind: "integer",
    flag: "--replica-keepalive-ms",
    placeholder: "<ms>",
    env: ENV.replicaKeepaliveMs,
    default: "`20 × heartbeat`: 20000",
    description:
      "The longest a quiet replica (following a fresh primary, link up, probe ok) goes without writing its heartbeat and reading the topology. The controller waits up to this long for a silent replica's report before it acts without it. Must be ≥ `primaryKeepaliveMs`.",
  },
  {
    key: "fenceTimeoutMs",
    kind: "integer",
    flag: "--fence-timeout-ms",
    placeholder: "<ms>",
    env: ENV.fenceTimeoutMs,
    default: "`2500`",
    description:
      "A primary that wrote no heartbeat for this long applies its fence policy. A fence is lifted only in a cycle that read the topology too (it may have named another primary meanwhile). Must be < `failureTimeoutMs`.",
  },
  {
    key: "failureTimeoutMs",
    kind: "integer",
    env: ENV.failureTimeoutMs,
    default: "`3000`",
    description: "The controller's failure timeout; only checked against the fence timeout.",
  },
  {
    key: "storeTimeoutMs",
    kind: "integer",
    env: ENV.storeTimeoutMs,
    default: "`max(heartbeat, 1000)`",
    description: "A table call slower than this counts as failed.",
  },
  {
    key: "redisTimeoutMs",
    kind: "integer",
    env: ENV.redisTimeoutMs,
    default: "`max(heartbeat, 1000)`",
    description: "A database command slower than this counts as failed.",
  },
  {
    key: "commandWaitSeconds",
    kind: "integer",
    env: ENV.commandWaitSeconds,
    default: "`20`",
    description: "SQS long-poll wait (0–20).",
  },
  {
    key: "commandSenders",
    kind: "string",
    flag: "--command-senders",
    placeholder: "<arns>",
    env: ENV.commandSenders,
    default: "none: any principal the account's IAM lets send",
    description:
      "Comma-separated ARNs of the roles that may send commands (the controller's, the operators'): the node queue's policy denies `sqs:SendMessage` to every other principal ([commands](#commands)).",
  },
  {
    key: "redisUsername",
    kind: "string",
    flag: "--redis-username",
    placeholder: "<name>",
    env: ENV.redisUsername,
    default: "`default`",
    description: "ACL user of every database connection ([TLS and ACL users](#tls-and-acl-users)).",
  },
  {
    key: "redisPassword",
    kind: "string",
    env: ENV.redisPassword,
    default: "none",
    description: "Its password; deliberately no flag, so it never shows in `ps`.",
  },
  {
    key: "redisPasswordFile",
    kind: "string",
    flag: "--redis-password-file",
    placeholder: "<file>",
    env: ENV.redisPasswordFile,
    default: "none",
    description:
      "A file holding the password (one trailing newline ignored), read at start: out of `ps` *and* the environment. Exclusive with `redisPassword`.",
  },
  {
    key: "redisTls",
    kind: "boolean",
    flag: "--redis-tls",
    env: ENV.redisTls,
    default: "`false`",
    description:
      "TLS on every database connection: its own, the probe of its primary, the crash watch, the Sentinel endpoint's eviction.",
  },
  {
    key: "redisCa",
    kind: "string",
    flag: "--redis-ca",
    placeholder: "<file>",
    env: ENV.redisCa,
    default: "Node's trusted roots",
    description: "PEM CA bundle the databases' certificates are checked against.",
  },
  {
    key: "redisCert",
    kind: "string",
    flag: "--redis-cert",
    placeholder: "<file>",
    env: ENV.redisCert,
    default: "none",
    description:
      "PEM client certificate, for `tls-auth-clients yes` (the Redis default); with `--redis-key`.",
  },
  {
    key: "redisKey",
    kind: "string",
    flag: "--redis-key",
    placeholder: "<file>",
    env: ENV.redisKey,
    default: "none",
    description: "PEM private key of `--redis-cert`. Both or neither.",
  },
  {
    key: "redisServername",
    kind: "string",
    flag: "--redis-servername",
    placeholder: "<name>",
    env: ENV.redisServername,
    default: "the host dialled",
    description:
      "Name the databases' certificates must carry (SNI and hostname check), when they are dialled by an address they do not name.",
  },
  {
    key: "redisTlsInsecure",
    kind: "boolean",
    flag: "--redis-tls-insecure",
    env: ENV.redisTlsInsecure,
    default: "`false`",
    description:
      "Skips certificate verification. Never in production: anyone on the path can pose as the database and receive `REPLICAOF`; the agent warns at every start.",
  },
  {
    key: "table",
    kind: "string",
    env: ENV.table,
    default: "`shardguard`",
    description: "Coordination table.",
  },
  {
    key: "queuePrefix",
    kind: "string",
    env: ENV.queuePrefix,
    default: "`shardguard`",
    description:
      "Queue names are `<prefix>_<shard>_<node>`; the installation's dead-letter queue is `<prefix>_dlq`.",
  },
  {
    key: "logLevel",
    kind: "string",
    flag: "--log-level",
    placeholder: "<level>",
    env: ENV.logLevel,
    default: "`info`",
    description: "`debug`, `info`, `warn`, `error`, `silent`.",
  },
  {
    key: "sentinelPort",
    kind: "integer",
    flag: "--sentinel-port",
    placeholder: "<port>",
    env: ENV.sentinelPort,
    default: "off",
    description:
      "Serve the Sentinel protocol so Sentinel clients follow failovers ([docs/sentinel.md](sentinel.md)); `0` = a free port.",
  },
  {
    key: "sentinelBind",
    kind: "string",
    flag: "--sentinel-bind",
    placeholder: "<host>",
    env: ENV.sentinelBind,
    default:
      "host of `--address`; `127.0.0.1` when no Sentinel password is set ([protected mode](sentinel.md#protected-mode))",
    description: "Address the Sentinel endpoint listens on; giving it turns protected mode off.",
  },
  {
    key: "sentinelPassword",
    kind: "string",
    env: ENV.sentinelPassword,
    default: "none",
    description: "Password Sentinel clients must give; deliberately no flag.",
  },
  {
    key: "sentinelPasswordFile",
    kind: "string",
    flag: "--sentinel-password-file",
    placeholder: "<file>",
    env: ENV.sentinelPasswordFile,
    default: "none",
    description:
      "A file holding the Sentinel password (one trailing newline ignored), read at start. Exclusive with `sentinelPassword`.",
  },
  {
    key: "sentinelProtectedMode",
    kind: "boolean",
    flag: "--sentinel-protected-mode",
    placeholder: "<yes|no>",
    env: ENV.sentinelProtectedMode,
    default: "`true`",
    description:
      "With no Sentinel password and no `--sentinel-bind`, listen on `127.0.0.1` only ([protected mode](sentinel.md#protected-mode)); `no` serves the default address without a password.",
  },
  {
    key: "sentinelTls",
    kind: "boolean",
    flag: "--sentinel-tls",
    env: ENV.sentinelTls,
    default: "`false`",
    description: "Serve the Sentinel endpoint over TLS with `--sentinel-cert` / `--sentinel-key`.",
  },
  {
    key: "sentinelCert",
    kind: "string",
    flag: "--sentinel-cert",
    placeholder: "<file>",
    env: ENV.sentinelCert,
    default: "none",
    description:
      "PEM server certificate of the Sentinel endpoint (it must name the address clients dial); with `--sentinel-key`.",
  },
  {
    key: "sentinelKey",
    kind: "string",
    flag: "--sentinel-key",
    placeholder: "<file>",
    env: ENV.sentinelKey,
    default: "none",
    description: "PEM private key of `--sentinel-cert`.",
  },
  {
    key: "sentinelCa",
    kind: "string",
    flag: "--sentinel-ca",
    placeholder: "<file>",
    env: ENV.sentinelCa,
    default: "none: no client certificate asked",
    description: "PEM CA bundle: Sentinel clients must present a certificate it signed (mutual TLS).",
  },
  {
    key: "httpPort",
    kind: "integer",
    flag: "--http-port",
    placeholder: "<port>",
    env: ENV.httpPort,
    default: "off",
    description:
      "Serve the HTTP role checks (`/primary`, `/replica`, `/health`, `/status`) and Prometheus `/metrics` ([docs/http.md](http.md)); `0` = a free port.",
  },
  {
    key: "httpBind",
    kind: "string",
    flag: "--http-bind",
    placeholder: "<host>",
    env: ENV.httpBind,
    default: "host of `--address`",
    description: "Address the HTTP endpoint listens on (`0.0.0.0` for every interface).",
  },
  {
    key: "httpTls",
    kind: "boolean",
    flag: "--http-tls",
    env: ENV.httpTls,
    default: "`false`",
    description: "Serve the HTTP endpoint over TLS with `--http-cert` / `--http-key`.",
  },
  {
    key: "httpCert",
    kind: "string",
    flag: "--http-cert",
    placeholder: "<file>",
    env: ENV.httpCert,
    default: "none",
    description: "PEM server certificate of the HTTP endpoint; with `--http-key`.",
  },
  {
    key: "httpKey",
    kind: "string",
    flag: "--http-key",
    placeholder: "<file>",
    env: ENV.httpKey,
    default: "none",
    description: "PEM private key of `--http-cert`.",
  },
] as const satisfies readonly Setting[];

export type AgentSettingKey = (typeof AGENT_SETTINGS)[number]["key"];

/** The agent's own fields, before the cross-field checks. */
const agentOptionFields = z.object({
  shard: idSchema,
  /** Must match the stored id; when absent the stored id is used, or a new one is generated. */
  nodeId: idSchema.optional(),
  redis: z.string().regex(REDIS_URL, "must be host:port or rediss://host:port"),
  address: addressSchema.optional(),
  priority: z.number().int().min(0).max(1_000_000).default(100),
  stateDir: z.string().min(1).default(DEFAULT_STATE_DIR),
  fencePolicy: z.enum(FENCE_POLICIES).default("failsafe"),
  heartbeatIntervalMs: z.number().int().min(100).default(1000),
  fenceTimeoutMs: z.number().int().min(100).default(2500),
  failureTimeoutMs: z.number().int().min(200).default(3000),
  /** @default max(heartbeatIntervalMs, min(2 × heartbeatIntervalMs, fenceTimeoutMs − heartbeatIntervalMs / 2)) */
  primaryKeepaliveMs: z.number().int().min(100).optional(),
  /** @default 20 × heartbeatIntervalMs */
  replicaKeepaliveMs: z.number().int().min(100).optional(),
  /** @default max(heartbeatIntervalMs, 1000) */
  storeTimeoutMs: z.number().int().min(50).optional(),
  /** @default max(heartbeatIntervalMs, 1000) */
  redisTimeoutMs: z.number().int().min(50).optional(),
  commandWaitSeconds: z.number().int().min(0).max(20).default(20),
  /** Who may send to this node's queue (its policy); empty: whoever the account's IAM lets. */
  commandSenders: commandSendersSchema.default([]),
  redisUsername: z.string().min(1).optional(),
  redisPassword: z.string().min(1).optional(),
  redisPasswordFile: z.string().min(1).optional(),
  redisTls: z.boolean().default(false),
  redisCa: z.string().min(1).optional(),
  redisCert: z.string().min(1).optional(),
  redisKey: z.string().min(1).optional(),
  redisServername: z.string().min(1).optional(),
  redisTlsInsecure: z.boolean().default(false),
  sentinelPort: z.number().int().min(0).max(65535).optional(),
  sentinelBind: z.string().min(1).optional(),
  sentinelPassword: z.string().min(1).optional(),
  sentinelPasswordFile: z.string().min(1).optional(),
  sentinelProtectedMode: z.boolean().default(true),
  sentinelTls: z.boolean().default(false),
  sentinelCert: z.string().min(1).optional(),
  sentinelKey: z.string().min(1).optional(),
  sentinelCa: z.string().min(1).optional(),
  httpPort: z.number().int().min(0).max(65535).optional(),
  httpBind: z.string().min(1).optional(),
  httpTls: z.boolean().default(false),
  httpCert: z.string().min(1).optional(),
  httpKey: z.string().min(1).optional(),
});

type AgentFields = z.output<typeof agentOptionFields>;

/**
 * The checks across settings. Each issue sits on the setting to change and names the others as
 * `{key}`, which the loader spells as the operator did (a flag, a variable, a config key).
 */
function checkAgentOptions(options: AgentFields, ctx: z.RefinementCtx): void {
  const tls = options.redisTls || options.redis.startsWith("rediss://");
  const problem = (key: keyof AgentFields, message: string) =>
    ctx.addIssue({ code: "custom", path: [key], message });
  if (options.redisPassword !== undefined && options.redisPasswordFile !== undefined)
    problem("redisPasswordFile", "names a second password beside {redisPassword}: give only one");
  if (!tls) {
    for (const key of ["redisCa", "redisCert", "redisKey", "redisServername", "redisTlsInsecure"] as const) {
      if (options[key] !== undefined && options[key] !== false)
        problem(key, "needs {redisTls} true (or a rediss:// address in {redis})");
    }
  }
  checkSentinelOptions(options, problem);
  if (options.httpTls && options.httpPort === undefined) problem("httpTls", "needs {httpPort}");
  if (options.httpTls && (options.httpCert === undefined || options.httpKey === undefined))
    problem("httpTls", "needs {httpCert} and {httpKey}");
  if (!options.httpTls) {
    for (const key of ["httpCert", "httpKey"] as const) {
      if (options[key] !== undefined) problem(key, "needs {httpTls} true");
    }
  }
  if (options.redisCert !== undefined && options.redisKey === undefined)
    problem("redisCert", "needs {redisKey} (a client certificate and its key go together)");
  if (options.redisKey !== undefined && options.redisCert === undefined)
    problem("redisKey", "needs {redisCert} (a client certificate and its key go together)");
  checkTimings(options, ctx);
  if (
    options.failureTimeoutMs <= options.heartbeatIntervalMs ||
    options.fenceTimeoutMs >= options.failureTimeoutMs
  )
    problem(
      "failureTimeoutMs",
      "the agent's timings must be the controller's: set {heartbeatIntervalMs}, {failureTimeoutMs} and {fenceTimeoutMs} as the stack's AgentEnvironment output lists them (docs/deploy.md#agent-timings)",
    );
  const { primaryKeepaliveMs, replicaKeepaliveMs } = keepalives(options);
  if (primaryKeepaliveMs < options.heartbeatIntervalMs)
    problem(
      "primaryKeepaliveMs",
      `must be at least {heartbeatIntervalMs} (${options.heartbeatIntervalMs} ms)`,
    );
  if (primaryKeepaliveMs >= options.fenceTimeoutMs)
    problem(
      "primaryKeepaliveMs",
      `must be less than {fenceTimeoutMs} (${options.fenceTimeoutMs} ms): a primary that merely waits for its keepalive must not look cut off`,
    );
  if (replicaKeepaliveMs < primaryKeepaliveMs)
    problem("replicaKeepaliveMs", `must be at least {primaryKeepaliveMs} (${primaryKeepaliveMs} ms)`);
}

function checkSentinelOptions(
  options: AgentFields,
  problem: (key: keyof AgentFields, message: string) => void,
): void {
  if (options.sentinelPassword !== undefined && options.sentinelPasswordFile !== undefined)
    problem("sentinelPasswordFile", "names a second password beside {sentinelPassword}: give only one");
  if (options.sentinelTls && options.sentinelPort === undefined)
    problem("sentinelTls", "needs {sentinelPort}");
  if (options.sentinelTls && (options.sentinelCert === undefined || options.sentinelKey === undefined))
    problem(
      "sentinelTls",
      "needs {sentinelCert} and {sentinelKey}, the endpoint's own server certificate (the agent's --redis-cert is a client certificate)",
    );
  if (!options.sentinelTls) {
    for (const key of ["sentinelCert", "sentinelKey", "sentinelCa"] as const) {
      if (options[key] !== undefined) problem(key, "needs {sentinelTls} true");
    }
  }
}

function toAgentOptions({ redis, ...options }: AgentFields) {
  const [, scheme, address] = REDIS_URL.exec(redis) ?? [];
  return {
    ...options,
    ...keepalives(options),
    redis: address ?? redis,
    redisTls: options.redisTls || scheme === "rediss://",
  };
}

/**
 * The agent's options as `startAgent` takes them (in-process callers: the demo and chaos
 * tests). Every field but shard and redis has a default.
 */
export const agentOptionsSchema = agentOptionFields.superRefine(checkAgentOptions).transform(toAgentOptions);

export type AgentOptionsInput = z.input<typeof agentOptionsSchema>;
export type AgentOptions = z.output<typeof agentOptionsSchema>;

/** The agent process's settings: the agent's own, plus where its table and queues are and how it logs. */
export const agentProcessFields = agentOptionFields.extend({
  table: z.string().min(3).max(255).default(DEFAULT_TABLE_NAME),
  queuePrefix: queuePrefixSchema.default(DEFAULT_QUEUE_PREFIX),
  logLevel: z.enum(LOG_LEVELS).default("info"),
});

const agentProcessSchema = agentProcessFields
  .superRefine(checkAgentOptions)
  .transform(({ table, queuePrefix, logLevel, ...agent }) => ({
    agent: toAgentOptions(agent),
    table,
    queuePrefix,
    logLevel,
  }));

/** Options of the agent process: the agent's own, plus where its table and queues are. */
export type AgentProcessConfig = z.output<typeof agentProcessSchema>;

/** The variable that names a JSON config file when `--config` is not given. */
export const CONFIG_ENV = ENV.agentConfig;

export interface OptionSources {
  /** commander's parsed flags (camelCase keys, string values; `true` for a switch such as --redis-tls). */
  readonly flags: Readonly<Record<string, string | boolean | undefined>>;
  readonly env: NodeJS.ProcessEnv;
  /** `--config`; falls back to SHARDGUARD_AGENT_CONFIG. */
  readonly configFile?: string | undefined;
  /** Reads the config file; injectable for tests. @default readFileSync utf8 */
  readonly readFile?: (path: string) => string;
}

/** How an operator names a setting in a message the agent prints at run time: "--redis-ca (SHARDGUARD_REDIS_CA)". */
export function settingLabel(key: AgentSettingKey): string {
  return labelOf(AGENT_SETTINGS, key);
}

/**
 * Merges flags, environment and a JSON config file into validated agent options. Every
 * problem is reported at once, each naming the flag, variable or config key that caused it.
 */
export function resolveAgentOptions(sources: OptionSources): AgentProcessConfig {
  const configPath = sources.configFile || sources.env[CONFIG_ENV] || undefined;
  const file = configPath
    ? { path: configPath, values: readJsonConfigFile(configPath, sources.readFile) }
    : undefined;
  // systemd's StateDirectory= exports STATE_DIRECTORY: used when nothing else names one.
  const systemd = sources.env.STATE_DIRECTORY?.split(":")[0];
  const fallbacks: Record<string, { value: unknown; label: string }> = systemd
    ? { stateDir: { value: systemd, label: "STATE_DIRECTORY" } }
    : {};
  return loadSettings(
    AGENT_SETTINGS,
    agentProcessSchema,
    { flags: sources.flags, env: sources.env, file },
    "invalid agent options",
    fallbacks,
  );
}

/** For error messages of in-process callers: validates `startAgent` options. */
export function parseAgentOptions(input: AgentOptionsInput): AgentOptions {
  const result = agentOptionsSchema.safeParse(input);
  if (!result.success) throw new ConfigurationError(`invalid agent options: ${describeIssues(result.error)}`);
  return result.data;
}

/**
 * Against AWS the agent must be told its node id: each node's IAM policy (the construct's `nodes`
 * entry, `addNode`, `grantAgent`) names the queue `<prefix>_<shard>_<node>`, so a generated
 * `node-<hex>` has no rights there. Only with every endpoint on this host (the local stack,
 * LocalStack on loopback), where no IAM applies, may the agent generate one.
 */
export function requireNodeIdAgainstAws(
  agent: Pick<AgentOptions, "shard" | "nodeId">,
  env: NodeJS.ProcessEnv,
): void {
  if (agent.nodeId !== undefined || localEndpoints(env)) return;
  throw new ConfigurationError(
    `--node-id (${ENV.nodeId}) is required against AWS: the agent policy of each node names its id ` +
      `(the \`nodes\` context entry ${agent.shard}:<node-id>, or addNode / grantAgent), and a generated id has none. ` +
      "Give the id the node's policy was deployed with (docs/ec2.md)",
  );
}

/** Where `resolveAdvertisedAddress` may look; injectable for tests. */
export interface AddressSources {
  readonly env: NodeJS.ProcessEnv;
  /** @default globalThis.fetch */
  readonly fetch?: typeof fetch;
  /** Per metadata request. @default 1000 */
  readonly timeoutMs?: number;
}

/** The advertised address and where it came from, for the agent's start-up log. */
export interface AdvertisedAddress {
  /** undefined: other nodes use `--redis` as it is (it is not a loopback address, or all runs on this host). */
  readonly address: string | undefined;
  readonly source:
    | "--address"
    | "--redis"
    | "local endpoints"
    | "ECS task metadata"
    | "EC2 instance metadata";
}

const IMDS_DEFAULT_ENDPOINT = "http://169.254.169.254";

function isLoopbackHost(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "").toLowerCase();
  return bare === "localhost" || bare === "::1" || /^127\.\d+\.\d+\.\d+$/.test(bare);
}

/** Every AWS endpoint the agent uses is on this host: the local stack, LocalStack in Docker. */
function localEndpoints(env: NodeJS.ProcessEnv): boolean {
  const urls = [
    env.AWS_ENDPOINT_URL_DYNAMODB ?? env.AWS_ENDPOINT_URL,
    env.AWS_ENDPOINT_URL_SQS ?? env.AWS_ENDPOINT_URL,
  ];
  return urls.every((url) => {
    if (!url) return false;
    try {
      return isLoopbackHost(new URL(url).hostname);
    } catch {
      return false;
    }
  });
}

/**
 * The address other nodes replicate from (`REPLICAOF host port`), when `--address` is absent and
 * `--redis` is a loopback address that no other host can reach (an ECS sidecar or a systemd unit
 * talking to its database on 127.0.0.1):
 *
 * - ECS (`ECS_CONTAINER_METADATA_URI_V4`): the task's IPv4 address in `awsvpc` mode; in `host` mode
 *   the instance's, from IMDSv2; `bridge` mode is refused (the host port mapping is not the
 *   container's port, so it must be given as --address);
 * - EC2: `local-ipv4` from IMDSv2 (`AWS_EC2_METADATA_SERVICE_ENDPOINT`, as the SDK reads it);
 * - endpoints all on loopback (the local stack): every node runs on this host, loopback is right.
 *
 * Anything else is refused with what to set, rather than advertising 127.0.0.1 to other hosts.
 */
export async function resolveAdvertisedAddress(
  agent: Pick<AgentOptions, "redis" | "address">,
  sources: AddressSources,
): Promise<AdvertisedAddress> {
  if (agent.address) return { address: agent.address, source: "--address" };
  // `--redis` passed the schema's host:port check (its rediss:// scheme is off by now).
  const { host, port } = parseAddress(agent.redis);
  if (!isLoopbackHost(host)) return { address: undefined, source: "--redis" };
  const { env } = sources;
  const get = metadataClient(sources);
  const tried: string[] = [];
  const ecs = env.ECS_CONTAINER_METADATA_URI_V4;
  let imdsWanted = !ecs;
  if (ecs) {
    try {
      const container = (await get(ecs)).json as {
        Networks?: { NetworkMode?: string; IPv4Addresses?: string[] }[];
      };
      const network = container.Networks?.[0];
      const ip = network?.IPv4Addresses?.find((candidate) => candidate.length > 0);
      if (network?.NetworkMode === "awsvpc" && ip)
        return { address: `${ip}:${port}`, source: "ECS task metadata" };
      if (network?.NetworkMode === "host") imdsWanted = true;
      else
        tried.push(
          `ECS task metadata: network mode ${network?.NetworkMode ?? "unknown"}` +
            (network?.NetworkMode === "bridge"
              ? " maps ports, so the address other hosts reach is not derivable"
              : ""),
        );
    } catch (error) {
      tried.push(`ECS task metadata ${ecs}: ${errorMessage(error)}`);
    }
  }
  if (imdsWanted && !ecs && localEndpoints(env)) return { address: undefined, source: "local endpoints" };
  if (imdsWanted) {
    if (String(env.AWS_EC2_METADATA_DISABLED).toLowerCase() === "true") {
      tried.push("EC2 instance metadata: AWS_EC2_METADATA_DISABLED=true");
    } else {
      const endpoint = (env.AWS_EC2_METADATA_SERVICE_ENDPOINT || IMDS_DEFAULT_ENDPOINT).replace(/\/+$/, "");
      try {
        const token = (
          await get(`${endpoint}/latest/api/token`, {
            method: "PUT",
            headers: { "X-aws-ec2-metadata-token-ttl-seconds": "60" },
          })
        ).text;
        const ip = (
          await get(`${endpoint}/latest/meta-data/local-ipv4`, {
            headers: { "X-aws-ec2-metadata-token": token },
          })
        ).text.trim();
        if (/^\d+\.\d+\.\d+\.\d+$/.test(ip))
          return { address: `${ip}:${port}`, source: "EC2 instance metadata" };
        tried.push(`EC2 instance metadata: local-ipv4 "${ip}" is not an IPv4 address`);
      } catch (error) {
        tried.push(`EC2 instance metadata ${endpoint}: ${errorMessage(error)}`);
      }
    }
  }
  throw new ConfigurationError(
    `--redis ${agent.redis} is a loopback address and no --address (${ENV.address}) was given: other nodes ` +
      "would be told to replicate from this host's loopback. Set --address to host:port other nodes reach this " +
      `database on (the ECS example in docs/deploy.md derives it in awsvpc mode). Tried: ${tried.join("; ")}`,
  );
}

function metadataClient(sources: AddressSources) {
  const fetchFn = sources.fetch ?? globalThis.fetch;
  const timeoutMs = sources.timeoutMs ?? 1000;
  return async (url: string, init: RequestInit = {}): Promise<{ text: string; json: unknown }> => {
    const response = await fetchFn(url, { ...init, signal: AbortSignal.timeout(timeoutMs) });
    const text = await response.text();
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { text, json };
  };
}
