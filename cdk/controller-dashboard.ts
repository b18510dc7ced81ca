import { Duration } from "aws-cdk-lib";
import * as cloudwatch from "aws-cdk-lib/aws-cloudwatch";
import * as dynamodb from "aws-cdk-lib/aws-dynamodb";
import type * as lambda from "aws-cdk-lib/aws-lambda";
import type * as sqs from "aws-cdk-lib/aws-sqs";
import type { Construct } from "constructs";
import { METRIC_NAMES } from "../src/core/observability.ts";
import { controllerMetric } from "./controller-alarms.ts";

const TABLE_OPERATIONS = [
  dynamodb.Operation.GET_ITEM,
  dynamodb.Operation.QUERY,
  dynamodb.Operation.PUT_ITEM,
  dynamodb.Operation.UPDATE_ITEM,
  dynamodb.Operation.DELETE_ITEM,
];

export interface ControllerDashboardProps {
  readonly dashboardName?: string;
  readonly alarms: readonly cloudwatch.IAlarm[];
  readonly controllerFunction: lambda.IFunction;
  readonly controllerFailureQueue: sqs.IQueue;
  readonly table: dynamodb.ITable;
}

/**
 * The control plane's dashboard: alarm status, failovers, controller invocations, the table's
 * throttles and errors, dead letters (the node queues' shared dead-letter queue has an alarm in the
 * alarm widget).
 * Created in `scope` (the `ShardguardController`), keeping the logical ID of earlier releases.
 */
export class ControllerDashboard {
  readonly dashboard: cloudwatch.Dashboard;

  constructor(scope: Construct, props: ControllerDashboardProps) {
    const fn = props.controllerFunction;
    const fiveMinutes = { period: Duration.minutes(5) };
    const dashboard = new cloudwatch.Dashboard(scope, "Dashboard", { dashboardName: props.dashboardName });
    dashboard.addWidgets(
      new cloudwatch.AlarmStatusWidget({ title: "Controller alarms", alarms: [...props.alarms], width: 24 }),
    );
    dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: "Failovers (all shards)",
        left: METRIC_NAMES.map((metric) => controllerMetric(metric, Duration.minutes(5))),
        width: 12,
      }),
      new cloudwatch.GraphWidget({
        title: "Controller invocations",
        left: [
          fn.metricInvocations({ ...fiveMinutes, statistic: "Sum" }),
          fn.metricErrors({ ...fiveMinutes, statistic: "Sum" }),
          fn.metricThrottles({ ...fiveMinutes, statistic: "Sum" }),
        ],
        right: [fn.metricDuration({ ...fiveMinutes, statistic: "Maximum" })],
        width: 12,
      }),
    );
    dashboard.addWidgets(
      new cloudwatch.GraphWidget({
        title: "Coordination table: throttled requests",
        left: [
          props.table.metricThrottledRequestsForOperations({ ...fiveMinutes, operations: TABLE_OPERATIONS }),
        ],
        width: 8,
      }),
      new cloudwatch.GraphWidget({
        title: "Coordination table: system errors",
        left: [props.table.metricSystemErrorsForOperations({ ...fiveMinutes, operations: TABLE_OPERATIONS })],
        width: 8,
      }),
      new cloudwatch.GraphWidget({
        title: "Controller dead-letter queue (messages)",
        left: [props.controllerFailureQueue.metricApproximateNumberOfMessagesVisible(fiveMinutes)],
        width: 8,
      }),
    );
    this.dashboard = dashboard;
  }
}
