import type { Command } from "commander";
import { createAwsAdapters } from "../../adapters/aws-adapters.ts";
import { GENERATED_NODE_ID } from "../../adapters/aws-call-journal.ts";
import { jsonLineLogger } from "../../adapters/observability.ts";
import { startAgent } from "../../agent/agent.ts";
import {
  AGENT_SETTINGS,
  CONFIG_ENV,
  requireNodeIdAgainstAws,
  resolveAdvertisedAddress,
  resolveAgentOptions,
} from "../../agent/options.ts";
import { addSettingOptions } from "../options.ts";
import { untilSignal } from "../signals.ts";

export function registerAgent(program: Command): void {
  const command = program
    .command("agent")
    .description(
      "run the node agent beside one database node: heartbeats to DynamoDB, commands from its SQS queue; " +
        "every flag also reads from SHARDGUARD_* variables and a JSON --config file (flag > variable > file)",
    );
  addSettingOptions(command, AGENT_SETTINGS)
    .option("--config <file>", `JSON config file with the same settings in camelCase (${CONFIG_ENV})`)
    .action(async (flags: Record<string, string | boolean | undefined>) => {
      const configFile = typeof flags.config === "string" ? flags.config : undefined;
      const resolved = resolveAgentOptions({ flags, env: process.env, configFile });
      // Against AWS a generated node id would have no IAM policy: refuse before touching anything.
      requireNodeIdAgainstAws(resolved.agent, process.env);
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
        // A generated id has no IAM policy of its own: the journal names it so a check flags it.
        principal: {
          component: "agent",
          shard: config.agent.shard,
          node: config.agent.nodeId ?? GENERATED_NODE_ID,
        },
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
