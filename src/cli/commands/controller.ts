import { Logger } from "@aws-lambda-powertools/logger";
import { Metrics } from "@aws-lambda-powertools/metrics";
import { type Command, InvalidArgumentError } from "commander";
import { powertoolsLogger, powertoolsMetrics } from "../../adapters/observability.ts";
import { ControllerLoop } from "../../controller/loop.ts";
import { createControllerRuntime } from "../../controller/runtime.ts";
import { errorMessage } from "../../core/errors.ts";
import { METRICS_NAMESPACE } from "../../core/observability.ts";
import { type Partition, parsePartitionText } from "../../core/partition.ts";
import { abortOnSignal } from "../signals.ts";

/**
 * `shardguard controller`: the Lambda's loop as a local process (same code), for the local stack,
 * a demo, or a controller beside the Lambda (overlap is safe). Logs are Powertools JSON lines
 * on stdout; events become log lines unless SHARDGUARD_EVENT_BUS names a bus.
 */
export function registerController(program: Command): void {
  program
    .command("controller")
    .description(
      "run the failover controller loop locally (the Lambda's code): a pass over every shard each " +
        "tick interval until Ctrl-C; configuration from SHARDGUARD_* variables",
    )
    .option("--once", "one pass over the shards, then exit")
    .option("--shard <id...>", "only these shards instead of the shard index")
    .option("--log-level <level>", "DEBUG | INFO | WARN | ERROR", "INFO")
    .option(
      "--partition <index/count>",
      "only the shards of this partition (0-based), e.g. 2/5 for the third of five controllers",
      (value: string) => {
        try {
          return parsePartitionText(value);
        } catch (error) {
          throw new InvalidArgumentError(errorMessage(error));
        }
      },
    )
    .action(
      async (options: { once?: boolean; shard?: string[]; logLevel: string; partition?: Partition }) => {
        const logger = new Logger({
          serviceName: "shardguard-controller",
          logLevel: options.logLevel.toUpperCase() as "INFO",
          persistentKeys: { component: "controller" },
        });
        // EMF lines on stdout, as in Lambda: a CloudWatch agent that ships the log makes them metrics.
        const metrics = new Metrics({ namespace: METRICS_NAMESPACE, serviceName: "shardguard-controller" });
        const runtime = createControllerRuntime(process.env, {
          log: powertoolsLogger(logger),
          metrics: powertoolsMetrics(metrics),
          createWakeQueue: true,
        });
        const abort = options.once ? undefined : abortOnSignal();
        try {
          const summary = await new ControllerLoop(runtime.deps).run({
            once: options.once,
            shards: options.shard,
            partition: options.partition,
            signal: abort?.signal,
            wake: runtime.wake,
          });
          logger.info("controller stopped", { ...summary });
        } finally {
          runtime.destroy();
        }
      },
    );
}
