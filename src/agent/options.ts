import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { z } from "zod";
import { queuePrefixSchema } from "../adapters/queue-names.ts";
import { ENV } from "../config/env.ts";
import { describeIssues, parseFailoverConfig } from "../core/config.ts";
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

/** The agent's own fields, before the cross-field checks (the loader lists its keys). */
const agentOptionFields = z.object({
  shard: idSchema,
  /** Must match the stored id; when absent the stored id is used, or a new one is generated. */
  nodeId: idSchema.optional(),
  /** host:port the agent uses to reach its own database; `rediss://host:port` also turns on `redisTls`. */
  redis: z.string().regex(REDIS_URL, "must be host:port or rediss://host:port"),
  /** host:port other nodes use to reach this database. @default redis */
  address: addressSchema.optional(),
  /** 0 = never promote; otherwise lower is preferred. @default 100 */
  priority: z.number().int().min(0).max(1_000_000).default(100),
  /** @default ~/.local/state/shardguard */
  stateDir: z.string().min(1).default(DEFAULT_STATE_DIR),
  /** How a primary guards its writes (docs/agent.md#fence-policies). @default "failsafe" */
  fencePolicy: z.enum(FENCE_POLICIES).default("failsafe"),
  /** @default 1000 */
  heartbeatIntervalMs: z.number().int().min(100).default(1000),
  /** @default 2000 */
  fenceTimeoutMs: z.number().int().min(100).default(2000),
  /** The controller's failure timeout; the fence timeout must be below it. @default 3000 */
  failureTimeoutMs: z.number().int().min(200).default(3000),
  /** Longest a coordination-store call may take before the cycle counts it failed. @default max(heartbeatIntervalMs, 1000) */
  storeTimeoutMs: z.number().int().min(50).optional(),
  /** Longest a database command may take. @default max(heartbeatIntervalMs, 1000) */
  redisTimeoutMs: z.number().int().min(50).optional(),
  /** SQS long-poll wait. @default 20 */
  commandWaitSeconds: z.number().int().min(0).max(20).default(20),
  redisUsername: z.string().min(1).optional(),
  redisPassword: z.string().min(1).optional(),
  /** A file holding the password (a trailing newline is ignored): kept out of `ps` and of the environment. */
  redisPasswordFile: z.string().min(1).optional(),
  /** TLS on every connection to a database: its own, the probe of its primary, the crash watch. @default false */
  redisTls: z.boolean().default(false),
  /** PEM file of the CA(s) that signed the databases' certificates. @default Node's trusted roots */
  redisCa: z.string().min(1).optional(),
  /** PEM client certificate, for servers with `tls-auth-clients yes` (with `redisKey`). */
  redisCert: z.string().min(1).optional(),
  /** PEM private key of `redisCert`. */
  redisKey: z.string().min(1).optional(),
  /** Name the databases' certificates must carry (SNI and hostname check). @default the host dialled */
  redisServername: z.string().min(1).optional(),
  /** Skips certificate verification (never in production; the agent warns at every start). @default false */
  redisTlsInsecure: z.boolean().default(false),
  /** Serve the Sentinel protocol on this port (docs/sentinel.md); 0 = a free port. @default off */
  sentinelPort: z.number().int().min(0).max(65535).optional(),
  /** Address the Sentinel endpoint listens on. @default the host of `address` */
  sentinelBind: z.string().min(1).optional(),
  /** Password Sentinel clients must give (AUTH / HELLO AUTH). @default none */
  sentinelPassword: z.string().min(1).optional(),
  /** Serve the Sentinel protocol over TLS with `redisCert`/`redisKey`. @default false */
  sentinelTls: z.boolean().default(false),
});

/**
 * The agent's options as `startAgent` takes them (in-process callers: the demo and chaos
 * tests). Every field but shard and redis has a default.
 */
export const agentOptionsSchema = agentOptionFields
  .superRefine((options, ctx) => {
    const tls = options.redisTls || options.redis.startsWith("rediss://");
    const problem = (message: string) => ctx.addIssue({ code: "custom", path: [], message });
    if (options.redisPassword !== undefined && options.redisPasswordFile !== undefined)
      problem("redisPassword: and redisPasswordFile: name two passwords; give one");
    if (!tls) {
      for (const key of [
        "redisCa",
        "redisCert",
        "redisKey",
        "redisServername",
        "redisTlsInsecure",
      ] as const) {
        if (options[key] !== undefined && options[key] !== false)
          problem(`${key}: needs redisTls: true (or a rediss:// address in redis:)`);
      }
    }
    if (options.sentinelTls && (options.sentinelPort === undefined || options.redisCert === undefined))
      problem("sentinelTls: needs sentinelPort: and redisCert: with redisKey: (the certificate it serves)");
    if ((options.redisCert === undefined) !== (options.redisKey === undefined))
      problem("redisCert: and redisKey: go together (a client certificate and its key)");
    try {
      parseFailoverConfig({
        heartbeatIntervalMs: options.heartbeatIntervalMs,
        failureTimeoutMs: options.failureTimeoutMs,
        fenceTimeoutMs: options.fenceTimeoutMs,
      });
    } catch (error) {
      ctx.addIssue({ code: "custom", path: [], message: errorMessage(error) });
    }
  })
  .transform(({ redis, ...options }) => {
    const [, scheme, address] = REDIS_URL.exec(redis) ?? [];
    return { ...options, redis: address ?? redis, redisTls: options.redisTls || scheme === "rediss://" };
  });

export type AgentOptionsInput = z.input<typeof agentOptionsSchema>;
export type AgentOptions = z.output<typeof agentOptionsSchema>;

/** Options of the agent process: the agent's own, plus where its table and queues are. */
export interface AgentProcessConfig {
  readonly agent: AgentOptions;
  readonly table: string;
  readonly queuePrefix: string;
  readonly logLevel: (typeof LOG_LEVELS)[number];
}

type Kind = "string" | "integer" | "boolean";

interface Field {
  readonly key: string;
  readonly kind: Kind;
  /** commander's camelCase attribute and the flag's spelling; absent for file/env-only settings. */
  readonly flag?: string;
  readonly env?: string;
}

/**
 * Every setting with its three spellings. Precedence: flag > environment > config file > default.
 * Passwords have no flag so that they never show in `ps`.
 */
export const AGENT_FIELDS = [
  { key: "shard", kind: "string", flag: "--shard", env: ENV.shard },
  { key: "nodeId", kind: "string", flag: "--node-id", env: ENV.nodeId },
  { key: "redis", kind: "string", flag: "--redis", env: ENV.redis },
  { key: "address", kind: "string", flag: "--address", env: ENV.address },
  { key: "priority", kind: "integer", flag: "--priority", env: ENV.priority },
  { key: "stateDir", kind: "string", flag: "--state-dir", env: ENV.stateDir },
  { key: "fencePolicy", kind: "string", flag: "--fence-policy", env: ENV.fencePolicy },
  {
    key: "heartbeatIntervalMs",
    kind: "integer",
    flag: "--heartbeat-interval-ms",
    env: ENV.heartbeatIntervalMs,
  },
  { key: "fenceTimeoutMs", kind: "integer", flag: "--fence-timeout-ms", env: ENV.fenceTimeoutMs },
  { key: "failureTimeoutMs", kind: "integer", env: ENV.failureTimeoutMs },
  { key: "storeTimeoutMs", kind: "integer", env: ENV.storeTimeoutMs },
  { key: "redisTimeoutMs", kind: "integer", env: ENV.redisTimeoutMs },
  { key: "commandWaitSeconds", kind: "integer", env: ENV.commandWaitSeconds },
  { key: "redisUsername", kind: "string", flag: "--redis-username", env: ENV.redisUsername },
  { key: "redisPassword", kind: "string", env: ENV.redisPassword },
  {
    key: "redisPasswordFile",
    kind: "string",
    flag: "--redis-password-file",
    env: ENV.redisPasswordFile,
  },
  { key: "redisTls", kind: "boolean", flag: "--redis-tls", env: ENV.redisTls },
  { key: "redisCa", kind: "string", flag: "--redis-ca", env: ENV.redisCa },
  { key: "redisCert", kind: "string", flag: "--redis-cert", env: ENV.redisCert },
  { key: "redisKey", kind: "string", flag: "--redis-key", env: ENV.redisKey },
  { key: "redisServername", kind: "string", flag: "--redis-servername", env: ENV.redisServername },
  { key: "redisTlsInsecure", kind: "boolean", flag: "--redis-tls-insecure", env: ENV.redisTlsInsecure },
  { key: "sentinelPort", kind: "integer", flag: "--sentinel-port", env: ENV.sentinelPort },
  { key: "sentinelBind", kind: "string", flag: "--sentinel-bind", env: ENV.sentinelBind },
  { key: "sentinelPassword", kind: "string", env: ENV.sentinelPassword },
  { key: "sentinelTls", kind: "boolean", flag: "--sentinel-tls", env: ENV.sentinelTls },
  { key: "table", kind: "string", env: ENV.table },
  { key: "queuePrefix", kind: "string", env: ENV.queuePrefix },
  { key: "logLevel", kind: "string", flag: "--log-level", env: ENV.logLevel },
] as const satisfies readonly Field[];

/** The variable that names a JSON config file when `--config` is not given. */
export const CONFIG_ENV = ENV.agentConfig;

const processOnlySchema = z.object({
  table: z.string().min(3).max(255).default(DEFAULT_TABLE_NAME),
  queuePrefix: queuePrefixSchema.default(DEFAULT_QUEUE_PREFIX),
  logLevel: z.enum(LOG_LEVELS).default("info"),
});

export interface OptionSources {
  /** commander's parsed flags (camelCase keys, string values; `true` for a switch such as --redis-tls). */
  readonly flags: Readonly<Record<string, string | boolean | undefined>>;
  readonly env: NodeJS.ProcessEnv;
  /** `--config`; falls back to SHARDGUARD_AGENT_CONFIG. */
  readonly configFile?: string | undefined;
  /** Reads the config file; injectable for tests. @default readFileSync utf8 */
  readonly readFile?: (path: string) => string;
}

interface Located {
  readonly value: unknown;
  /** How the operator spelled it: "--priority", "SHARDGUARD_PRIORITY", "priority in /etc/agent.json". */
  readonly label: string;
}

function readConfigFile(path: string, readFile: (path: string) => string): Record<string, unknown> {
  let text: string;
  try {
    text = readFile(path);
  } catch (error) {
    throw new ConfigurationError(`config file ${path} cannot be read: ${errorMessage(error)}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new ConfigurationError(`config file ${path} is not valid JSON: ${errorMessage(error)}`);
  }
  if (json === null || typeof json !== "object" || Array.isArray(json)) {
    throw new ConfigurationError(`config file ${path} must hold one JSON object`);
  }
  return json as Record<string, unknown>;
}

function coerce(raw: unknown, kind: Kind, label: string, errors: string[]): unknown {
  if (kind === "integer" && typeof raw === "string") {
    const value = Number(raw.trim());
    if (raw.trim() === "" || !Number.isInteger(value)) {
      errors.push(`${label}: must be an integer, got "${raw}"`);
      return undefined;
    }
    return value;
  }
  if (kind === "boolean" && typeof raw === "string") {
    const word = raw.trim().toLowerCase();
    if (["true", "1", "yes", "on"].includes(word)) return true;
    if (["false", "0", "no", "off"].includes(word)) return false;
    errors.push(`${label}: must be true or false, got "${raw}"`);
    return undefined;
  }
  return raw;
}

/** How an operator names a setting in a message the agent prints at run time: "--redis-ca (SHARDGUARD_REDIS_CA)". */
export function settingLabel(key: (typeof AGENT_FIELDS)[number]["key"]): string {
  const field = AGENT_FIELDS.find((candidate) => candidate.key === key);
  if (!field) return key;
  return "flag" in field ? `${field.flag} (${field.env})` : field.env;
}

/**
 * Merges flags, environment and a JSON config file into validated agent options. Every
 * problem is reported at once, each naming the flag, variable or config key that caused it.
 */
export function resolveAgentOptions(sources: OptionSources): AgentProcessConfig {
  const errors: string[] = [];
  const configPath = sources.configFile || sources.env[CONFIG_ENV] || undefined;
  const file = configPath
    ? readConfigFile(configPath, sources.readFile ?? ((p) => readFileSync(p, "utf8")))
    : {};
  const known = new Set<string>(AGENT_FIELDS.map((field) => field.key));
  for (const key of Object.keys(file)) {
    if (!known.has(key))
      errors.push(`${key} in ${configPath}: unknown setting (known: ${[...known].join(", ")})`);
  }

  const located = new Map<string, Located>();
  const values: Record<string, unknown> = {};
  for (const field of AGENT_FIELDS) {
    const flagKey = "flag" in field ? camelCase(field.flag) : undefined;
    const flagValue = flagKey === undefined ? undefined : sources.flags[flagKey];
    const envValue = sources.env[field.env];
    let found: Located | undefined;
    if (flagValue !== undefined && "flag" in field) found = { value: flagValue, label: field.flag };
    else if (envValue !== undefined && envValue !== "") found = { value: envValue, label: field.env };
    else if (file[field.key] !== undefined)
      found = { value: file[field.key], label: `${field.key} in ${configPath}` };
    if (found === undefined) continue;
    located.set(field.key, found);
    values[field.key] = coerce(found.value, field.kind, found.label, errors);
  }
  // systemd's StateDirectory= exports STATE_DIRECTORY: use it when nothing else names one.
  if (values.stateDir === undefined && sources.env.STATE_DIRECTORY) {
    values.stateDir = sources.env.STATE_DIRECTORY.split(":")[0];
    located.set("stateDir", { value: values.stateDir, label: "STATE_DIRECTORY" });
  }

  const labelOf = (path: PropertyKey[]): string => {
    const key = String(path[0] ?? "");
    const source = located.get(key);
    if (source) return source.label;
    const field = AGENT_FIELDS.find((candidate) => candidate.key === key);
    if (!field) return key || "(options)";
    return "flag" in field ? `${field.flag} (or ${field.env})` : field.env;
  };
  const collect = (error: z.ZodError) => {
    for (const issue of error.issues) {
      if (issue.path.length === 0) {
        // Cross-field checks carry the field names in their message: name the sources instead.
        let message = issue.message.replace(/^invalid configuration: /, "");
        for (const [key, source] of located) message = message.replaceAll(`${key}:`, `${source.label}:`);
        errors.push(message);
      } else {
        const missing = issue.code === "invalid_type" && issue.message.endsWith("received undefined");
        errors.push(`${labelOf(issue.path)}: ${missing ? "required" : issue.message}`);
      }
    }
  };

  const agentKeys = Object.keys(agentOptionFields.shape);
  const agentInput = Object.fromEntries(Object.entries(values).filter(([key]) => agentKeys.includes(key)));
  const processInput = Object.fromEntries(Object.entries(values).filter(([key]) => !agentKeys.includes(key)));
  const agent = agentOptionsSchema.safeParse(agentInput);
  const processOnly = processOnlySchema.safeParse(processInput);
  if (!agent.success) {
    // Per-field issues first; the cross-field check only runs when every field parsed.
    collect(agent.error);
  }
  if (!processOnly.success) collect(processOnly.error);
  if (errors.length > 0 || !agent.success || !processOnly.success) {
    throw new ConfigurationError(`invalid agent options: ${errors.join("; ")}`);
  }
  return { agent: agent.data, ...processOnly.data };
}

/** "--node-id" -> "nodeId", as commander names parsed flags. */
function camelCase(flag: string): string {
  return flag.replace(/^--/, "").replace(/-([a-z])/g, (_, letter: string) => letter.toUpperCase());
}

/** For error messages of in-process callers: validates `startAgent` options. */
export function parseAgentOptions(input: AgentOptionsInput): AgentOptions {
  const result = agentOptionsSchema.safeParse(input);
  if (!result.success) throw new ConfigurationError(`invalid agent options: ${describeIssues(result.error)}`);
  return result.data;
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

/** `host:port` of `--redis` (after the rediss:// scheme was taken off). */
function splitHostPort(address: string): { host: string; port: string } {
  const index = address.lastIndexOf(":");
  return { host: address.slice(0, index), port: address.slice(index + 1) };
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
  const { host, port } = splitHostPort(agent.redis);
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
