import { EventBridgeClient } from "@aws-sdk/client-eventbridge";
import { Route53Client } from "@aws-sdk/client-route-53";
import { callJournalFromEnv, createAwsAdapters } from "../adapters/aws-adapters.ts";
import { ENV, failoverConfigFromEnv, primaryRecordsFromEnv } from "../adapters/env.ts";
import { EventBridgePublisher } from "../adapters/eventbridge-publisher.ts";
import { logEventPublisher } from "../adapters/observability.ts";
import { Route53PrimaryRecords } from "../adapters/route53-primary-record.ts";
import { ConfigurationError } from "../core/errors.ts";
import type { EventPublisher, Logger, Metrics } from "../core/observability.ts";
import type { WakeReceiver } from "../core/wake.ts";
import type { ControllerDeps } from "./orchestrator.ts";

export interface ControllerRuntime {
  readonly deps: ControllerDeps;
  /** The wake-up queue (`<prefix>_wake`), for a local loop to long-poll (docs/controller.md). */
  readonly wake: WakeReceiver;
  destroy(): void;
}

/**
 * Wires the controller from the environment, for the Lambda handler and the local process.
 * Configuration is validated here, so a bad variable fails the cold start with its name.
 */
export function createControllerRuntime(
  env: NodeJS.ProcessEnv,
  options: {
    readonly log: Logger;
    readonly metrics: Metrics;
    /** Lambda: the event bus must be configured. Local: events become log lines without one. */
    readonly requireEventBus?: boolean;
    /** Local: create the wake-up queue when missing (CDK creates it for the Lambda). @default false */
    readonly createWakeQueue?: boolean;
  },
): ControllerRuntime {
  const config = failoverConfigFromEnv(env);
  const eventBusName = env[ENV.eventBusName];
  if (options.requireEventBus && !eventBusName) {
    throw new ConfigurationError(`${ENV.eventBusName} must name the EventBridge bus for failover events`);
  }
  const principal = { component: "controller" } as const;
  const aws = createAwsAdapters({
    env,
    logger: options.log,
    createWakeQueue: options.createWakeQueue,
    principal,
  });
  let eventBridge: EventBridgeClient | undefined;
  let events: EventPublisher = logEventPublisher(options.log);
  if (eventBusName) {
    eventBridge = new EventBridgeClient({ region: env.AWS_REGION || env.AWS_DEFAULT_REGION || undefined });
    const journal = callJournalFromEnv(env, principal);
    if (journal) eventBridge.middlewareStack.use(journal.plugin("events"));
    events = new EventBridgePublisher({ client: eventBridge, eventBusName });
  }
  const records = primaryRecordsFromEnv(env);
  // Route 53 is a global service with one endpoint (us-east-1); a failed call is retried next cycle.
  const route53 = records
    ? new Route53Client({ region: "us-east-1", maxAttempts: 2, requestHandler: { requestTimeout: 3000 } })
    : undefined;
  const primaryRecords =
    records && route53
      ? new Route53PrimaryRecords({ client: route53, records, logger: options.log })
      : undefined;
  return {
    wake: aws.wake,
    deps: {
      store: aws.store,
      bus: aws.bus,
      clock: aws.clock,
      events,
      config,
      log: options.log,
      metrics: options.metrics,
      ...(primaryRecords ? { primaryRecords } : {}),
    },
    destroy() {
      aws.destroy();
      eventBridge?.destroy();
      route53?.destroy();
    },
  };
}
