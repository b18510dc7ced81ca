import path from "node:path";
import { ArnFormat, Duration, Stack, Token, Validations } from "aws-cdk-lib";
import type * as cloudwatch from "aws-cdk-lib/aws-cloudwatch";
import * as dynamodb from "aws-cdk-lib/aws-dynamodb";
import * as events from "aws-cdk-lib/aws-events";
import * as targets from "aws-cdk-lib/aws-events-targets";
import * as iam from "aws-cdk-lib/aws-iam";
import * as lambda from "aws-cdk-lib/aws-lambda";
import { SqsDestination } from "aws-cdk-lib/aws-lambda-destinations";
import { SqsEventSource } from "aws-cdk-lib/aws-lambda-event-sources";
import { NodejsFunction, OutputFormat } from "aws-cdk-lib/aws-lambda-nodejs";
import * as logs from "aws-cdk-lib/aws-logs";
import * as sqs from "aws-cdk-lib/aws-sqs";
import { Construct } from "constructs";
import { ENV } from "../src/adapters/env.ts";
import { deadLetterQueueName, defaultQueuePrefix, queueNamePattern } from "../src/adapters/queue-names.ts";
import { wakeQueueName } from "../src/adapters/sqs-wake-queue.ts";
import type { FailoverConfig } from "../src/core/config.ts";
import { ShardguardError } from "../src/core/errors.ts";
import {
  EVENT_SOURCE,
  EVENT_TYPES,
  type EventType,
  METRICS_NAMESPACE,
  type MetricName,
} from "../src/core/observability.ts";
import { epochRecordName, type PrimaryRecords } from "../src/core/primary-record.ts";
import { SHARD_INDEX, TTL_ATTRIBUTE, tableDefinition } from "../src/core/table.ts";
import { type AgentIdentity, agentPolicyStatements, validateIdentity } from "./agent-policy.ts";
import { ControllerAlarms, controllerMetric } from "./controller-alarms.ts";
import { ControllerDashboard } from "./controller-dashboard.ts";
import { partitionProblems, schedulePartitions } from "./controller-partitions.ts";
import {
  CONTROLLER_BUNDLE_OPTIONS,
  PACKAGE_ROOT,
  type ResolvedControllerProps,
  resolveControllerProps,
  type ShardguardControllerProps,
} from "./controller-props.ts";
import { ShardguardNode, type ShardguardNodeOptions } from "./shardguard-node.ts";
import {
  addTableAutoScaling,
  type ProvisionedCapacity,
  provisionedCapacity,
  shardIndexCapacity,
  tableBillingProps,
} from "./table-capacity.ts";

export type { ShardguardControllerProps } from "./controller-props.ts";

export const CONTROLLER_SERVICE_NAME = "shardguard-controller";

/**
 * What the controller does with the table: Query (shard snapshots, shard index), GetItem (topology),
 * PutItem (lock, topology compare-and-set, history), UpdateItem (lock renewal), DeleteItem (lock
 * release; the old primary's items), ConditionCheckItem (the lock check every fenced
 * TransactWriteItems carries). IAM authorizes a transaction item by item: Put/Update/Delete as
 * PutItem/UpdateItem/DeleteItem, a ConditionCheck as ConditionCheckItem. Proven from recorded calls:
 * test/integration/iam-recorded-calls.test.ts.
 */
export const CONTROLLER_TABLE_ACTIONS = [
  "dynamodb:GetItem",
  "dynamodb:Query",
  "dynamodb:PutItem",
  "dynamodb:UpdateItem",
  "dynamodb:DeleteItem",
  "dynamodb:ConditionCheckItem",
] as const;
/**
 * Sending PROMOTE / REPLICAOF to a node's queue (SqsCommandBus.send: GetQueueUrl, then SendMessage).
 * The controller never creates a queue: each agent creates its own when it starts, before its first
 * heartbeat, so a node the controller can command already has one.
 */
export const CONTROLLER_QUEUE_ACTIONS = ["sqs:GetQueueUrl", "sqs:SendMessage"] as const;
/** What an operator's CLI reads for `status` and `history`. */
export const OPERATOR_TABLE_ACTIONS = ["dynamodb:GetItem", "dynamodb:Query"] as const;
/** The controller's read of a shard's DNS record and its epoch record (primaryRecords only). */
export const CONTROLLER_RECORD_READ_ACTIONS = ["route53:ListResourceRecordSets"] as const;
/** The controller's one change batch per epoch (primaryRecords only). */
export const CONTROLLER_RECORD_CHANGE_ACTIONS = ["route53:ChangeResourceRecordSets"] as const;

/**
 * Shardguard's control plane in one construct: the coordination table, the controller Lambda and
 * its one-minute schedule, the IAM grants for agents and operators, alarms and a dashboard.
 *
 * Queues: every agent creates its own queue under `queuePrefix`, with the installation's shared
 * dead-letter queue `<prefix>_dlq` (see agent-policy.ts); the construct grants the controller send
 * rights on that prefix, one alarm on the shared dead-letter queue, and per node registered with
 * `addNode` an agent policy.
 */
export class ShardguardController extends Construct {
  public readonly table: dynamodb.Table;
  /** The scheduled controller: the loop, and the wake queue's event source. */
  public readonly controllerFunction: lambda.Function;
  /**
   * Operator requests (`shardguard switchover/pause/resume/recover` with
   * `SHARDGUARD_CONTROLLER_FUNCTION` set to its name): the same code as `controllerFunction` with a
   * reserved concurrency of its own, which neither the schedule nor the wake queue invokes, so the
   * scheduled loop's long invocations can never throttle an operator.
   */
  public readonly operatorFunction: lambda.Function;
  public readonly controllerRole: iam.Role;
  public readonly controllerLogGroup: logs.LogGroup;
  public readonly schedule: events.Rule;
  /** Receives scheduled invocations EventBridge could not deliver and invocations that failed. */
  public readonly controllerFailureQueue: sqs.Queue;
  /**
   * `<prefix>_wake`: agents send a wake-up after writing a crash report; its event source mapping
   * runs a controller cycle for that shard at once (docs/controller.md#controller-wake-ups).
   */
  public readonly wakeQueue: sqs.Queue;
  public readonly eventBus: events.IEventBus;
  public readonly queuePrefix: string;
  /** The validated failover configuration the controller runs with. */
  public readonly config: FailoverConfig;
  public readonly failoverAlarm: cloudwatch.Alarm;
  public readonly shardOfflineAlarm: cloudwatch.Alarm;
  /** A primary stays stale without a failover for 3 minutes (quorum not met, no agent heard, paused). */
  public readonly primaryStaleAlarm: cloudwatch.Alarm;
  public readonly controllerErrorsAlarm: cloudwatch.Alarm;
  public readonly controllerThrottlesAlarm: cloudwatch.Alarm;
  public readonly controllerNotRunningAlarm: cloudwatch.Alarm;
  public readonly controllerFailureQueueAlarm: cloudwatch.Alarm;
  /** Read or write throttle events on the table (either billing mode). */
  public readonly tableThrottleAlarm: cloudwatch.Alarm;
  /** The control plane's dashboard; undefined with `dashboard: false`. */
  public readonly dashboard: cloudwatch.Dashboard | undefined;

  /** Every alarm of the control plane, the node queues' shared dead-letter queue's among them. */
  public readonly alarms: ControllerAlarms;

  constructor(scope: Construct, id: string, props: ShardguardControllerProps = {}) {
    super(scope, id);
    const resolved = resolveControllerProps(props);
    this.config = resolved.config;
    // Derived from the stack's name unless given, so two stacks in one account never share queues.
    this.queuePrefix = resolved.queuePrefix ?? defaultQueuePrefix(Stack.of(this).stackName);

    const partitionIssues = partitionProblems(props.partitions ?? 1, resolved.controllerReservedConcurrency);
    if (partitionIssues.length > 0) throw new ShardguardError(partitionIssues.join("; "));
    this.table = this.createTable(
      props.tableName,
      resolved,
      provisionedCapacity(props, resolved.config),
      props.shards,
    );
    this.eventBus = props.eventBus ?? events.EventBus.fromEventBusName(this, "DefaultEventBus", "default");
    this.controllerFailureQueue = new sqs.Queue(this, "ControllerFailures", {
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      retentionPeriod: Duration.days(14),
    });
    Validations.of(this.controllerFailureQueue).acknowledge({
      id: "AwsSolutions-SQS3",
      reason:
        "This queue is itself the dead-letter destination of the controller's schedule and async invocations; nothing consumes it, an alarm watches its depth.",
    });

    this.controllerLogGroup = new logs.LogGroup(this, "ControllerLogs", {
      retention: resolved.logRetention,
    });
    this.controllerRole = this.createControllerRole();
    this.controllerFunction = this.createControllerFunction("Controller", resolved, {
      description: "Shardguard controller: detects stale primaries and orchestrates failovers.",
      reservedConcurrentExecutions: resolved.controllerReservedConcurrency,
    });
    this.operatorFunction = this.createControllerFunction("Operator", resolved, {
      description:
        "Shardguard operator requests (switchover, pause, resume, recover): the controller's code on a concurrency of its own.",
      reservedConcurrentExecutions: resolved.operatorReservedConcurrency,
    });
    this.wakeQueue = new sqs.Queue(this, "WakeQueue", {
      queueName: wakeQueueName(this.queuePrefix),
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      // A wake-up older than a minute is worthless: the periodic scan has run since.
      retentionPeriod: Duration.minutes(1),
      // Lambda requires at least the function's timeout on a queue it consumes.
      visibilityTimeout: resolved.controllerTimeout,
    });
    Validations.of(this.wakeQueue).acknowledge({
      id: "AwsSolutions-SQS3",
      reason:
        "Wake-ups are hints that expire after a minute; one that fails is dropped on purpose, the controller's periodic scan covers it.",
    });
    this.controllerFunction.addEventSource(
      new SqsEventSource(this.wakeQueue, {
        batchSize: 10,
        maxBatchingWindow: Duration.seconds(0),
        maxConcurrency: 2,
      }),
    );
    this.schedule = new events.Rule(this, "Schedule", {
      description:
        "Starts the Shardguard controller; each invocation loops at tickInterval until its timeout.",
      schedule: events.Schedule.rate(Duration.minutes(1)),
    });
    // One target per controller partition (one without partitions), docs/cost.md#partitions.
    schedulePartitions(
      this,
      this.schedule,
      events.Schedule.rate(Duration.minutes(1)),
      props.partitions ?? 1,
      (input) =>
        new targets.LambdaFunction(this.controllerFunction, {
          deadLetterQueue: this.controllerFailureQueue,
          retryAttempts: 2,
          maxEventAge: Duration.minutes(1),
          event: input,
        }),
    );
    this.grantControllerPermissions();
    this.grantPrimaryRecords(resolved.primaryRecords);

    const alarms = new ControllerAlarms(this, {
      controllerFunction: this.controllerFunction,
      controllerFailureQueue: this.controllerFailureQueue,
      table: this.table,
      deadLetterQueueName: deadLetterQueueName(this.queuePrefix),
      alarmActions: resolved.alarmActions,
    });
    this.alarms = alarms;
    this.failoverAlarm = alarms.failover;
    this.shardOfflineAlarm = alarms.shardOffline;
    this.primaryStaleAlarm = alarms.primaryStale;
    this.controllerErrorsAlarm = alarms.controllerErrors;
    this.controllerThrottlesAlarm = alarms.controllerThrottles;
    this.controllerNotRunningAlarm = alarms.controllerNotRunning;
    this.controllerFailureQueueAlarm = alarms.controllerFailureQueue;
    this.tableThrottleAlarm = alarms.tableThrottle;
    this.dashboard =
      props.dashboard === false
        ? undefined
        : new ControllerDashboard(this, {
            dashboardName: props.dashboardName,
            alarms: alarms.all,
            controllerFunction: this.controllerFunction,
            controllerFailureQueue: this.controllerFailureQueue,
            table: this.table,
          }).dashboard;
  }

  /**
   * A node the stack knows about: a managed policy for its agent (attached to `role` when given).
   * The agent creates its queue itself; its dead letters go to the installation's shared queue,
   * watched by one alarm (`alarms.deadLetters`).
   */
  public addNode(options: ShardguardNodeOptions): ShardguardNode {
    validateIdentity(options);
    return new ShardguardNode(this, `Node-${options.shard}-${options.node}`, {
      ...options,
      controller: this,
    });
  }

  /** The agent statements (see agent-policy.ts) for one node, added to `grantee`'s policy. */
  public grantAgent(grantee: iam.IGrantable, identity: AgentIdentity): iam.Grant {
    const statements = this.agentPolicyStatements(identity);
    return statements
      .map((statement) =>
        iam.Grant.addToPrincipal({
          grantee,
          actions: statement.actions,
          resourceArns: statement.resources,
          conditions: statement.conditions,
        }),
      )
      .reduce((all, grant) => all.combine(grant));
  }

  /**
   * What agents need besides their policy: the table and queue prefix of this installation, and the
   * one role that sends commands (both controller functions run as it), which the agent's queue
   * policy then lets send and no other principal (SHARDGUARD_COMMAND_SENDERS, docs/security.md#commands).
   */
  public agentEnvironment(): Record<string, string> {
    return {
      [ENV.table]: this.table.tableName,
      [ENV.queuePrefix]: this.queuePrefix,
      [ENV.commandSenders]: this.controllerRole.roleArn,
    };
  }

  public agentPolicyStatements(identity: AgentIdentity): iam.PolicyStatement[] {
    return agentPolicyStatements(this, {
      ...identity,
      tableArn: this.table.tableArn,
      queuePrefix: this.queuePrefix,
    });
  }

  /**
   * `actions` on the table, and Query on the shard index by name (not `index/*`, which `Table.grant`
   * would add): listing the shards is the one thing read through an index.
   */
  private grantTable(grantee: iam.IGrantable, actions: readonly string[]): iam.Grant {
    return iam.Grant.addToPrincipal({
      grantee,
      actions: [...actions],
      resourceArns: [this.table.tableArn],
    }).combine(
      iam.Grant.addToPrincipal({
        grantee,
        actions: ["dynamodb:Query"],
        resourceArns: [`${this.table.tableArn}/index/${SHARD_INDEX.indexName}`],
      }),
    );
  }

  /**
   * What the `shardguard` CLI needs: invoke the operator function (switchover, pause, resume,
   * recover go through it, so they take the same lock as failovers) and read the table (status,
   * history). Identity policy only, on the unqualified function ARN the CLI calls.
   */
  public grantOperatorInvoke(grantee: iam.IGrantable): iam.Grant {
    return iam.Grant.addToPrincipal({
      grantee,
      actions: ["lambda:InvokeFunction"],
      resourceArns: [this.operatorFunction.functionArn],
    }).combine(this.grantTable(grantee, OPERATOR_TABLE_ACTIONS));
  }

  /** A rule on the event bus for Shardguard's events (all types unless narrowed). */
  public onShardguardEvent(
    id: string,
    options: {
      readonly target?: events.IRuleTarget;
      readonly detailTypes?: readonly EventType[];
    } = {},
  ): events.Rule {
    return new events.Rule(this, id, {
      eventBus: this.eventBus,
      eventPattern: { source: [EVENT_SOURCE], detailType: [...(options.detailTypes ?? EVENT_TYPES)] },
      targets: options.target ? [options.target] : [],
    });
  }

  /**
   * One of the controller's metrics summed over every dimension set it is published with (Metrics
   * Insights), so an alarm on it does not depend on which dimensions the handler adds.
   */
  public metricController(metric: MetricName, period = Duration.minutes(1)): cloudwatch.IMetric {
    return controllerMetric(metric, period);
  }

  private createTable(
    tableName: string | undefined,
    resolved: ResolvedControllerProps,
    capacity: ProvisionedCapacity | undefined,
    shards: number | undefined,
  ): dynamodb.Table {
    // Keys come from the definition the local stack creates, so the two cannot drift apart.
    const definition = tableDefinition(tableName ?? "unused");
    const attribute = (keyType: "HASH" | "RANGE"): dynamodb.Attribute => {
      const name = definition.KeySchema.find((key) => key.KeyType === keyType)?.AttributeName;
      const type = definition.AttributeDefinitions.find((a) => a.AttributeName === name)?.AttributeType;
      if (!name || type !== "S") throw new ShardguardError(`table definition has no string ${keyType} key`);
      return { name, type: dynamodb.AttributeType.STRING };
    };
    const table = new dynamodb.Table(this, "Table", {
      tableName,
      partitionKey: attribute("HASH"),
      sortKey: attribute("RANGE"),
      // On-demand, or provisioned sized from the shard count (cdk/table-capacity.ts).
      ...tableBillingProps(capacity),
      pointInTimeRecoverySpecification: {
        pointInTimeRecoveryEnabled: true,
        recoveryPeriodInDays: resolved.pointInTimeRecoveryPeriod.toDays(),
      },
      timeToLiveAttribute: TTL_ATTRIBUTE,
      deletionProtection: resolved.deletionProtection,
      removalPolicy: resolved.removalPolicy,
    });
    // The shard index (SHARD_INDEX): its sort key is the table's partition key, which IAM confines
    // each agent to, so an agent can register its own shard and no other (docs/security.md).
    const index = definition.GlobalSecondaryIndexes[0];
    if (!index) throw new ShardguardError("table definition has no shard index");
    table.addGlobalSecondaryIndex({
      indexName: index.IndexName,
      partitionKey: { name: SHARD_INDEX.partitionKey, type: dynamodb.AttributeType.STRING },
      sortKey: attribute("HASH"),
      projectionType: dynamodb.ProjectionType.KEYS_ONLY,
      ...shardIndexCapacity(capacity, shards),
    });
    addTableAutoScaling(table, capacity);
    return table;
  }

  private createControllerRole(): iam.Role {
    const role = new iam.Role(this, "ControllerRole", {
      assumedBy: new iam.ServicePrincipal("lambda.amazonaws.com"),
      description: "Shardguard controller: coordination table, command queues, events, its own logs.",
    });
    // Instead of the AWSLambdaBasicExecutionRole managed policy: this log group only.
    role.addToPrincipalPolicy(
      new iam.PolicyStatement({
        actions: ["logs:CreateLogStream", "logs:PutLogEvents"],
        resources: [this.controllerLogGroup.logGroupArn],
      }),
    );
    return role;
  }

  private createControllerFunction(
    id: string,
    resolved: ResolvedControllerProps,
    options: { readonly description: string; readonly reservedConcurrentExecutions: number },
  ): lambda.Function {
    const environment: Record<string, string> = {
      [ENV.table]: this.table.tableName,
      [ENV.queuePrefix]: this.queuePrefix,
      [ENV.eventBusName]: this.eventBus.eventBusName,
      POWERTOOLS_SERVICE_NAME: CONTROLLER_SERVICE_NAME,
      POWERTOOLS_METRICS_NAMESPACE: METRICS_NAMESPACE,
      NODE_OPTIONS: "--enable-source-maps",
    };
    for (const [field, value] of Object.entries(resolved.config)) {
      environment[ENV[field as keyof FailoverConfig]] = String(value);
    }
    if (Object.keys(resolved.primaryRecords).length > 0) {
      environment[ENV.primaryRecords] = JSON.stringify(resolved.primaryRecords);
    }
    const common = {
      description: options.description,
      runtime: lambda.Runtime.NODEJS_24_X,
      architecture: lambda.Architecture.ARM_64,
      // Sizing for the in-invocation loop (see docs/deploy.md):
      // - timeout 75 s: the handler ticks until shortly before it, and the schedule starts the next
      //   invocation every 60 s, so consecutive invocations overlap by several seconds. The overlap
      //   absorbs schedule jitter and the next cold start, so detection never pauses; two controllers
      //   at once are safe because every failover runs under the shard's conditional-write lock.
      // - reserved concurrency 3: that overlap plus one invocation for wake-ups (the wake queue's
      //   event source), and a cap on runaway invocations (a retry storm cannot fan out into many
      //   controllers or eat the account's concurrency). Operator requests have a function of their
      //   own (operatorFunction), so the loop never throttles them.
      // - 512 MB: the loop is I/O-bound, but signing, TLS and parsing every shard's items each tick
      //   are CPU work, and Lambda CPU scales with memory; 512 MB keeps a tick's CPU time well under
      //   tickInterval at tens of shards for about twice the cost of 256 MB.
      timeout: resolved.controllerTimeout,
      reservedConcurrentExecutions: options.reservedConcurrentExecutions,
      memorySize: resolved.controllerMemorySize,
      role: this.controllerRole,
      logGroup: this.controllerLogGroup,
      environment,
      // The next scheduled invocation is the retry: a Lambda retry would overlap it and be throttled.
      retryAttempts: 0,
      maxEventAge: Duration.minutes(1),
      onFailure: new SqsDestination(this.controllerFailureQueue),
    } satisfies Partial<lambda.FunctionProps>;
    const code = resolved.controllerCode;
    if ("prebuiltDir" in code) {
      // The packed package: the bundle `npm run build` made (cdk/bundle-controller.ts).
      return new lambda.Function(this, id, {
        ...common,
        code: lambda.Code.fromAsset(code.prebuiltDir),
        handler: "index.handler",
      });
    }
    return new NodejsFunction(this, id, {
      ...common,
      entry: code.entry,
      handler: "handler",
      projectRoot: PACKAGE_ROOT,
      depsLockFilePath: path.join(PACKAGE_ROOT, "package-lock.json"),
      bundling: {
        // Local esbuild from node_modules, never Docker.
        forceDockerBundling: false,
        format: OutputFormat.ESM,
        target: CONTROLLER_BUNDLE_OPTIONS.target,
        mainFields: [...CONTROLLER_BUNDLE_OPTIONS.mainFields],
        banner: CONTROLLER_BUNDLE_OPTIONS.banner,
        // Bundle the SDK too: the exact versions the tests ran, not whatever the runtime ships.
        externalModules: [],
        minify: true,
        sourceMap: true,
        sourcesContent: false,
      },
    });
  }

  /**
   * Route 53, per hosted zone of `primaryRecords`: read its record sets (the current epoch and
   * address) and change them, only at the shards' names and their `_shardguard.` epoch records, and
   * only records of the types the controller writes (AWS's normalized-name and type condition keys).
   */
  private grantPrimaryRecords(records: PrimaryRecords): void {
    const zones = new Map<string, string[]>();
    for (const record of Object.values(records)) {
      zones.set(record.hostedZoneId, [
        ...(zones.get(record.hostedZoneId) ?? []),
        record.name,
        epochRecordName(record.name),
      ]);
    }
    for (const [zone, names] of zones) {
      const zoneArn = Stack.of(this).formatArn({
        service: "route53",
        region: "",
        account: "",
        resource: "hostedzone",
        resourceName: zone,
      });
      this.controllerRole.addToPrincipalPolicy(
        new iam.PolicyStatement({ actions: [...CONTROLLER_RECORD_READ_ACTIONS], resources: [zoneArn] }),
      );
      this.controllerRole.addToPrincipalPolicy(
        new iam.PolicyStatement({
          actions: [...CONTROLLER_RECORD_CHANGE_ACTIONS],
          resources: [zoneArn],
          conditions: {
            "ForAllValues:StringEquals": {
              "route53:ChangeResourceRecordSetsNormalizedRecordNames": [...new Set(names)].sort(),
              "route53:ChangeResourceRecordSetsRecordTypes": ["A", "AAAA", "CNAME", "TXT"],
            },
          },
        }),
      );
    }
  }

  private grantControllerPermissions(): void {
    this.grantTable(this.controllerRole, CONTROLLER_TABLE_ACTIONS);
    const queuesUnderPrefix = Stack.of(this).formatArn({
      service: "sqs",
      resource: queueNamePattern(this.queuePrefix),
      arnFormat: ArnFormat.NO_RESOURCE_NAME,
    });
    this.controllerRole.addToPrincipalPolicy(
      new iam.PolicyStatement({ actions: [...CONTROLLER_QUEUE_ACTIONS], resources: [queuesUnderPrefix] }),
    );
    this.eventBus.grantPutEventsTo(this.controllerRole);

    // cdk-nag names the finding after the ARN as it appears in the template: pseudo parameters for
    // an environment-agnostic stack, literals where the stack's account or region is known.
    const stack = Stack.of(this);
    const literalOr = (value: string, pseudo: string) =>
      Token.isUnresolved(value) ? `<AWS::${pseudo}>` : value;
    const nagArn = `arn:${literalOr(stack.partition, "Partition")}:sqs:${literalOr(stack.region, "Region")}:${literalOr(stack.account, "AccountId")}:${queueNamePattern(this.queuePrefix)}`;
    Validations.of(this.controllerRole.node.findChild("DefaultPolicy")).acknowledge({
      id: `AwsSolutions-IAM5[Resource::${nagArn}]`,
      reason:
        "Agents create their command queues at run time under this installation's queue prefix (one per node; '_' ends the prefix and no prefix contains it, so the pattern matches no other installation's queues), so the controller's SendMessage is scoped to the prefix rather than to queue ARNs known at deploy time.",
    });
  }
}
