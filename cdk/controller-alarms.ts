import { Duration } from "aws-cdk-lib";
import * as cloudwatch from "aws-cdk-lib/aws-cloudwatch";
import type * as dynamodb from "aws-cdk-lib/aws-dynamodb";
import type * as lambda from "aws-cdk-lib/aws-lambda";
import type * as sqs from "aws-cdk-lib/aws-sqs";
import type { Construct } from "constructs";
import { METRICS_NAMESPACE, type MetricName } from "../src/core/observability.ts";
import { tableThrottles } from "./table-capacity.ts";

/**
 * One of the controller's metrics summed over every dimension set it is published with (Metrics
 * Insights), so an alarm does not depend on which dimensions the handler adds.
 */
export function controllerMetric(metric: MetricName, period = Duration.minutes(1)): cloudwatch.IMetric {
  return new cloudwatch.MathExpression({
    expression: `SELECT SUM(${metric}) FROM ${METRICS_NAMESPACE}`,
    label: metric,
    period,
    usingMetrics: {},
  });
}

export interface ControllerAlarmsProps {
  readonly controllerFunction: lambda.IFunction;
  readonly controllerFailureQueue: sqs.IQueue;
  readonly table: dynamodb.Table;
  /** The installation's shared dead-letter queue of the node queues (`<prefix>_dlq`). */
  readonly deadLetterQueueName: string;
  readonly alarmActions: readonly cloudwatch.IAlarmAction[];
}

/**
 * The control plane's alarms: failovers, offline shards, a primary stale without a failover, the
 * controller's errors, throttles, silence and dead letters, table throttles, and the node queues'
 * shared dead-letter queue.
 *
 * The alarms are created in `scope` (the `ShardguardController`), not in a child construct: their
 * logical IDs are those of the stacks deployed before they moved here, so an upgrade updates them
 * in place instead of replacing them.
 */
export class ControllerAlarms {
  readonly failover: cloudwatch.Alarm;
  readonly shardOffline: cloudwatch.Alarm;
  /** A primary stays stale without a failover for 3 minutes (quorum not met, no agent heard, paused). */
  readonly primaryStale: cloudwatch.Alarm;
  readonly controllerErrors: cloudwatch.Alarm;
  readonly controllerThrottles: cloudwatch.Alarm;
  readonly controllerNotRunning: cloudwatch.Alarm;
  readonly controllerFailureQueue: cloudwatch.Alarm;
  /** Read or write throttle events on the table (either billing mode). */
  readonly tableThrottle: cloudwatch.Alarm;
  /** The node queues' shared dead-letter queue holds a command an agent could not parse. */
  readonly deadLetters: cloudwatch.Alarm;
  /** Every alarm above, in creation order (the dashboard's alarm status widget). */
  readonly all: readonly cloudwatch.Alarm[];

  constructor(scope: Construct, props: ControllerAlarmsProps) {
    const all: cloudwatch.Alarm[] = [];
    const alarm = (
      id: string,
      metric: cloudwatch.IMetric,
      options: {
        readonly description: string;
        readonly comparisonOperator?: cloudwatch.ComparisonOperator;
        readonly treatMissingData?: cloudwatch.TreatMissingData;
        /** @default 1 */
        readonly evaluationPeriods?: number;
      },
    ): cloudwatch.Alarm => {
      const created = new cloudwatch.Alarm(scope, id, {
        metric,
        alarmDescription: options.description,
        threshold: 1,
        evaluationPeriods: options.evaluationPeriods ?? 1,
        comparisonOperator:
          options.comparisonOperator ?? cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        treatMissingData: options.treatMissingData ?? cloudwatch.TreatMissingData.NOT_BREACHING,
      });
      for (const action of props.alarmActions) created.addAlarmAction(action);
      all.push(created);
      return created;
    };
    const fn = props.controllerFunction;

    this.failover = alarm("FailoverAlarm", controllerMetric("failoverStarted"), {
      description: "Shardguard started a failover of a shard (see the FailoverStarted event for which).",
    });
    this.shardOffline = alarm("ShardOfflineAlarm", controllerMetric("shardOffline"), {
      description: "Shardguard marked a shard offline: its primary is stale and no replica is eligible.",
    });
    this.primaryStale = alarm("PrimaryStaleAlarm", controllerMetric("staleHeartbeatDetected"), {
      description:
        "A shard's primary heartbeat has been stale for 3 minutes without a failover completing: the quorum " +
        "holds it back, no agent of the shard is heard, or the shard is paused. See the controller's log reason.",
      evaluationPeriods: 3,
    });
    this.controllerErrors = alarm(
      "ControllerErrorsAlarm",
      fn.metricErrors({ period: Duration.minutes(5), statistic: "Sum" }),
      { description: "A Shardguard controller invocation failed." },
    );
    this.controllerThrottles = alarm(
      "ControllerThrottlesAlarm",
      fn.metricThrottles({ period: Duration.minutes(5), statistic: "Sum" }),
      {
        description:
          "A Shardguard controller invocation was throttled: more than the reserved concurrency overlap.",
      },
    );
    this.controllerNotRunning = alarm(
      "ControllerNotRunningAlarm",
      fn.metricInvocations({ period: Duration.minutes(5), statistic: "Sum" }),
      {
        description: "The Shardguard controller has not run for 5 minutes: no failover can happen.",
        comparisonOperator: cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
        treatMissingData: cloudwatch.TreatMissingData.BREACHING,
      },
    );
    this.controllerFailureQueue = alarm(
      "ControllerFailureQueueAlarm",
      props.controllerFailureQueue.metricApproximateNumberOfMessagesVisible({
        period: Duration.minutes(5),
        statistic: "Maximum",
      }),
      { description: "The controller's dead-letter queue holds failed or undelivered invocations." },
    );
    this.tableThrottle = alarm("TableThrottleAlarm", tableThrottles(props.table), {
      description:
        "DynamoDB throttled Shardguard's table: heartbeats or snapshot reads are refused (provisioned capacity too small for the fleet, or a hot partition). Stale heartbeats follow.",
    });
    this.deadLetters = alarm(
      "DeadLetterQueueAlarm",
      new cloudwatch.Metric({
        namespace: "AWS/SQS",
        metricName: "ApproximateNumberOfMessagesVisible",
        dimensionsMap: { QueueName: props.deadLetterQueueName },
        statistic: "Maximum",
        period: Duration.minutes(5),
      }),
      {
        // The queue exists once the first agent started; until then there is nothing to report.
        description: `The node queues' dead-letter queue ${props.deadLetterQueueName} holds a command an agent could not parse (its DeadLetterQueueSourceArn attribute names the node queue).`,
      },
    );
    this.all = all;
  }
}
