import type { Logger } from "../core/observability.ts";
import type { CommandBus, CoordinationStore } from "../core/ports.ts";
import { ApiCallCounter } from "./api-call-counter.ts";
import { AwsCallJournal, type AwsPrincipal } from "./aws-call-journal.ts";
import { type AwsClientOptions, type AwsClients, createAwsClients } from "./aws-clients.ts";
import { AwsClock } from "./clock.ts";
import { createDynamoCoordinationStore } from "./dynamo-coordination-store.ts";
import { ENV, queuePrefixFromEnv, tableNameFromEnv } from "./env.ts";
import { SqsCommandBus } from "./sqs-command-bus.ts";
import { SqsWakeQueue, wakeQueueName } from "./sqs-wake-queue.ts";

export interface AwsAdaptersOptions extends AwsClientOptions {
  /** Standard SDK variables (endpoints, region, keys) and SHARDGUARD_* are read from it. @default process.env */
  readonly env?: NodeJS.ProcessEnv;
  /** @default SHARDGUARD_TABLE, else "shardguard" */
  readonly tableName?: string;
  /** @default SHARDGUARD_QUEUE_PREFIX, else "shardguard" */
  readonly queuePrefix?: string;
  /** Receives of an unparseable command before it moves to the dead-letter queue. @default 3 */
  readonly maxReceiveCount?: number;
  /** Visibility timeout of a node's queue in seconds. @default 10 */
  readonly visibilityTimeoutSeconds?: number;
  /** SQS-managed server-side encryption on the queues. @default true */
  readonly managedSse?: boolean;
  /** Where malformed items and commands are reported. @default one JSON line on stderr */
  readonly logger?: Logger;
  /** Create the wake-up queue when missing (the local controller). @default false */
  readonly createWakeQueue?: boolean;
  /**
   * The IAM principal these adapters run as in a deployment. With `SHARDGUARD_AWS_CALL_LOG` set in
   * `env`, every request is journaled under it (src/adapters/aws-call-journal.ts).
   * @default - no journal
   */
  readonly principal?: AwsPrincipal;
}

export interface AwsAdapters {
  /** Heartbeats, replica sets, lock, topology, history and shard index on the table. */
  readonly store: CoordinationStore;
  readonly bus: CommandBus;
  /** The controller's wake-up queue (`<prefix>_wake`): agents send, the controller receives. */
  readonly wake: SqsWakeQueue;
  /** AWS-aligned clock: stamp heartbeats and measure their age with it. */
  readonly clock: AwsClock;
  /** AWS API calls made through these adapters, per operation. */
  readonly counter: ApiCallCounter;
  /** The underlying SDK clients, for tools that need a call the ports do not offer. */
  readonly clients: AwsClients;
  /** Closes the SDK clients' sockets. */
  destroy(): void;
}

/**
 * The one place that builds the AWS adapters, for the controller, the agent and the CLI:
 *
 * ```ts
 * const aws = createAwsAdapters({ env: process.env, logger });
 * const snapshot = await aws.store.heartbeats.snapshot("shard-1");
 * aws.destroy();
 * ```
 */
export function createAwsAdapters(options: AwsAdaptersOptions = {}): AwsAdapters {
  const env = options.env ?? process.env;
  const counter = new ApiCallCounter();
  let clients: AwsClients | undefined;
  const clock = new AwsClock({ sdkOffset: () => clients?.sdkClockOffset() ?? 0 });
  const tableName = options.tableName ?? tableNameFromEnv(env);
  const queuePrefix = options.queuePrefix ?? queuePrefixFromEnv(env);
  const journal = callJournalFromEnv(env, options.principal, {
    tableName,
    queuePrefix,
    provisionedQueues: options.createWakeQueue ? [wakeQueueName(queuePrefix)] : [],
  });
  clients = createAwsClients(env, counter, clock, options, journal);
  const store = createDynamoCoordinationStore({
    documents: clients.documents,
    tableName,
    clock,
    logger: options.logger,
  });
  const bus = new SqsCommandBus({
    sqs: clients.sqs,
    queuePrefix,
    maxReceiveCount: options.maxReceiveCount,
    visibilityTimeoutSeconds: options.visibilityTimeoutSeconds,
    managedSse: options.managedSse,
    logger: options.logger,
  });
  const wake = new SqsWakeQueue({
    sqs: clients.sqs,
    queuePrefix,
    create: options.createWakeQueue,
    logger: options.logger,
  });
  const built = clients;
  return { store, bus, wake, clock, counter, clients: built, destroy: () => built.destroy() };
}

/** The journal `SHARDGUARD_AWS_CALL_LOG` asks for, when the caller says which principal it runs as. */
export function callJournalFromEnv(
  env: NodeJS.ProcessEnv,
  principal: AwsPrincipal | undefined,
  names: {
    readonly tableName?: string;
    readonly queuePrefix?: string;
    readonly provisionedQueues?: readonly string[];
  } = {},
): AwsCallJournal | undefined {
  const directory = env[ENV.awsCallLog];
  if (!directory || !principal) return undefined;
  return new AwsCallJournal({ directory, principal, ...names });
}
