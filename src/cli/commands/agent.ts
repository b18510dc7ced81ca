import type { Command } from "commander";
import { createAwsAdapters } from "../../adapters/aws-adapters.ts";
import { jsonLineLogger } from "../../adapters/observability.ts";
import { startAgent } from "../../agent/agent.ts";
import { CONFIG_ENV, resolveAdvertisedAddress, resolveAgentOptions } from "../../agent/options.ts";
import { untilSignal } from "../signals.ts";

export function registerAgent(program: Command): void {
  program
    .command("agent")
    .description(
      "run the node agent beside one database node: heartbeats to DynamoDB, commands from its SQS queue; " +
        "every flag also reads from SHARDGUARD_* variables and a JSON --config file (flag > variable > file)",
    )
    .option("--shard <id>", "shard this node belongs to (SHARDGUARD_SHARD)")
    .option(
      "--node-id <id>",
      "node id; default: the one stored in the state dir, else a new one (SHARDGUARD_NODE_ID)",
    )
    .option(
      "--redis <host:port>",
      "the database this agent manages; rediss://host:port also turns on --redis-tls (SHARDGUARD_REDIS)",
    )
    .option(
      "--redis-username <name>",
      "ACL user of every database connection; default the default user (SHARDGUARD_REDIS_USERNAME)",
    )
    .option(
      "--redis-password-file <file>",
      "file holding that user's password, kept out of ps and the environment (SHARDGUARD_REDIS_PASSWORD_FILE; or SHARDGUARD_REDIS_PASSWORD)",
    )
    .option(
      "--redis-tls",
      "TLS on every database connection: own database, probe of the primary, crash watch (SHARDGUARD_REDIS_TLS)",
    )
    .option(
      "--redis-ca <file>",
      "PEM CA bundle that signed the databases' certificates (SHARDGUARD_REDIS_CA)",
    )
    .option(
      "--redis-cert <file>",
      "PEM client certificate, for tls-auth-clients yes; with --redis-key (SHARDGUARD_REDIS_CERT)",
    )
    .option("--redis-key <file>", "PEM key of --redis-cert (SHARDGUARD_REDIS_KEY)")
    .option(
      "--redis-servername <name>",
      "name the databases' certificates carry (SNI, hostname check); default the host dialled (SHARDGUARD_REDIS_SERVERNAME)",
    )
    .option(
      "--redis-tls-insecure",
      "DANGER: skip certificate verification; for a first test only (SHARDGUARD_REDIS_TLS_INSECURE)",
    )
    .option(
      "--address <host:port>",
      "address other nodes reach the database on; default --redis, or with a loopback --redis the task's " +
        "(ECS awsvpc) or instance's (IMDSv2) IPv4 address, else the agent refuses to start (SHARDGUARD_ADDRESS)",
    )
    .option(
      "--priority <n>",
      "promotion priority, 0 = never promote, lower preferred; default 100 (SHARDGUARD_PRIORITY)",
    )
    .option(
      "--state-dir <dir>",
      "keeps the node id, applied epoch and command ids; default $STATE_DIRECTORY or ~/.local/state/shardguard (SHARDGUARD_STATE_DIR)",
    )
    .option(
      "--fence-policy <policy>",
      "fence | keep-serving when cut off from the table; default fence (SHARDGUARD_FENCE_POLICY)",
    )
    .option("--heartbeat-interval-ms <ms>", "default 1000 (SHARDGUARD_HEARTBEAT_INTERVAL_MS)")
    .option("--fence-timeout-ms <ms>", "default 2000 (SHARDGUARD_FENCE_TIMEOUT_MS)")
    .option(
      "--sentinel-port <port>",
      "serve the Sentinel protocol here so Sentinel clients follow failovers; default off (SHARDGUARD_SENTINEL_PORT)",
    )
    .option(
      "--sentinel-bind <host>",
      "address the Sentinel endpoint listens on; default the host of --address (SHARDGUARD_SENTINEL_BIND)",
    )
    .option(
      "--sentinel-tls",
      "serve the Sentinel endpoint over TLS with --redis-cert and --redis-key (SHARDGUARD_SENTINEL_TLS)",
    )
    .option(
      "--log-level <level>",
      "debug | info | warn | error | silent; default info (SHARDGUARD_LOG_LEVEL)",
    )
    .option("--config <file>", `JSON config file with the same settings in camelCase (${CONFIG_ENV})`)
    .action(async (flags: Record<string, string | boolean | undefined>) => {
      const configFile = typeof flags.config === "string" ? flags.config : undefined;
      const resolved = resolveAgentOptions({ flags, env: process.env, configFile });
      // A loopback --redis without --address: derive the address other nodes reach (ECS, EC2) or refuse.
      const advertised = await resolveAdvertisedAddress(resolved.agent, { env: process.env });
      const config = { ...resolved, agent: { ...resolved.agent, address: advertised.address } };
      const adapterLogger = jsonLineLogger(
        { service: "shardguard-agent", shard: config.agent.shard },
        config.logLevel,
      );
      if (advertised.address && advertised.source !== "--address") {
        adapterLogger.info("advertised address derived", {
          address: advertised.address,
          from: advertised.source,
        });
      }
      const aws = createAwsAdapters({
        env: process.env,
        tableName: config.table,
        queuePrefix: config.queuePrefix,
        logger: adapterLogger,
      });
      // Listen before starting: a SIGTERM during start-up must still stop the agent cleanly.
      const signalled = untilSignal();
      try {
        const agent = await startAgent(
          config.agent,
          {
            heartbeats: aws.store.heartbeats,
            replicaSets: aws.store.replicaSets,
            topology: aws.store.topology,
            shards: aws.store.shards,
            commands: aws.bus,
            wake: aws.wake,
            clock: aws.clock,
          },
          { logLevel: config.logLevel },
        );
        await signalled;
        await agent.stop();
      } finally {
        aws.destroy();
      }
    });
}
