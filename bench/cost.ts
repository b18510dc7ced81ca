/**
 * `npm run bench:cost`: what a shard costs per month, measured. Runs N real shards (redis-server
 * nodes, one `shardguard agent` process each) on the local stack and the real controller, counts
 * every AWS request through counting proxies in front of DynamoDB Local and the SQS emulator
 * (agents and controller through separate proxies), with the capacity units DynamoDB Local reports
 * for each, over a short steady-state window, scales the rates to a 30-day month and prices them
 * from bench/prices.json. Per-shard and fixed parts are separate.
 *
 * The controller, `--controller lambda` (the default): the Lambda handler itself
 * (functions/controller/handler.ts), invoked in this process with the schedule's event
 * `--invocations` times in the window; each invocation's requests, wall and CPU time and log bytes
 * are measured and priced at 43,200 invocations a month (one a minute). `--controller loop`: a
 * `shardguard controller` process looping at the tick all the window, as the local controller and
 * every failover benchmark run it (what the Lambda did before its quiet runs).
 *
 *   npm run bench:cost -- [--shards 2] [--nodes 3] [--seconds 90] [--heartbeat-interval 1000]
 *                         [--failure-timeout 3000] [--primary-keepalive <ms>] [--replica-keepalive <ms>]
 *                         [--controller lambda|loop] [--invocations 3] [--lambda-memory 512]
 *                         [--lambda-seconds 72 (loop only)] [--partitions 1] [--json]
 *                         [--out bench/results/cost-<label>.json]
 */
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Metrics, MetricUnit } from "@aws-lambda-powertools/metrics";
import { ENV } from "../src/adapters/env.ts";
import { keepalives, parseFailoverConfig } from "../src/core/config.ts";
import { LocalCluster } from "../src/dev/local-cluster.ts";
import { startProcess } from "../src/dev/local-stack/processes.ts";
import { type LocalStack, startLocalStack } from "../src/dev/local-stack/stack.ts";
import { CountingProxy, type OperationCount } from "./lib/counting-proxy.ts";
import { ONE_VCPU_MB } from "./lib/lambda-sizing.ts";
import {
  dynamoMonthly,
  lambdaMonthly,
  loadPrices,
  logsMonthly,
  round,
  SECONDS_PER_MONTH,
  sqsMonthly,
} from "./lib/pricing.ts";
import { median } from "./lib/stats.ts";

const { values } = parseArgs({
  options: {
    shards: { type: "string", default: "2" },
    nodes: { type: "string", default: "3" },
    seconds: { type: "string", default: "90" },
    "heartbeat-interval": { type: "string", default: "1000" },
    "failure-timeout": { type: "string", default: "3000" },
    "lambda-memory": { type: "string", default: "512" },
    "lambda-seconds": { type: "string", default: "72" },
    "primary-keepalive": { type: "string" },
    "replica-keepalive": { type: "string" },
    controller: { type: "string", default: "lambda" },
    invocations: { type: "string", default: "3" },
    partitions: { type: "string", default: "1" },
    json: { type: "boolean", default: false },
    out: { type: "string" },
  },
});
const shardCount = Number(values.shards);
const nodeCount = Number(values.nodes);
const windowSeconds = Number(values.seconds);
const heartbeatIntervalMs = positive("heartbeat-interval");
const failureTimeoutMs = positive("failure-timeout");
// The shipped defaults: fence half a heartbeat before the failure timeout (2.5 s at 1 s and 3 s).
const config = parseFailoverConfig({
  heartbeatIntervalMs,
  failureTimeoutMs,
  fenceTimeoutMs: Math.round(failureTimeoutMs - heartbeatIntervalMs / 2),
});
const keepaliveOptions = {
  primaryKeepaliveMs: values["primary-keepalive"] ? positive("primary-keepalive") : undefined,
  replicaKeepaliveMs: values["replica-keepalive"] ? positive("replica-keepalive") : undefined,
};
const agentKeepalives = keepalives({ ...config, ...keepaliveOptions });
const controllerMode = values.controller;
if (controllerMode !== "lambda" && controllerMode !== "loop") {
  throw new Error(`--controller: "${controllerMode}" is neither lambda nor loop`);
}
const invocationCount = positive("invocations");
const lambdaMemoryMb = Number(values["lambda-memory"]);
const lambdaSeconds = Number(values["lambda-seconds"]);
const partitions = Number(values.partitions);
const prices = loadPrices();

function positive(name: keyof typeof values): number {
  const value = Number(values[name]);
  if (!Number.isFinite(value) || value <= 0)
    throw new Error(`--${name}: "${values[name]}" is not a positive number`);
  return value;
}
const progress = (line: string) => {
  if (!values.json) process.stderr.write(`[cost] ${line}\n`);
};

const CLI = fileURLToPath(new URL("../src/cli/main.ts", import.meta.url));
/**
 * Alarms the CDK construct creates: the controller's, table throttles and the node queues' shared
 * dead-letter queue (cdk/controller-alarms.ts); none per node since the shared dead-letter queue.
 */
const FIXED_ALARMS = 9;
/** Scheduled invocations a month, per partition: one a minute. */
const INVOCATIONS_PER_MONTH = 43_200;
/** The Lambda's default timeout (cdk/controller-props.ts), for the handler's remaining time. */
const LAMBDA_TIMEOUT_MS = 75_000;
/** Lambda's own START/END/REPORT lines per invocation, bytes (typical sizes). */
const LAMBDA_PLATFORM_LOG_BYTES = 420;
/**
 * The wake-up queue's event source mapping in Lambda: AWS polls a standard queue with 5
 * concurrent 20 s long polls while it is idle (billed SQS requests). Not measured here: the local
 * controller long-polls the queue itself instead.
 */
const ESM_POLLS_PER_SECOND = 5 / 20;

/**
 * Runs `work` with stdout counted instead of printed: what Powertools writes there (log and EMF
 * lines) is what CloudWatch Logs ingests in Lambda.
 */
async function stdoutBytesOf<T>(work: () => T | Promise<T>): Promise<{ result: T; bytes: number }> {
  let bytes = 0;
  const write = process.stdout.write.bind(process.stdout);
  process.stdout.write = ((chunk: string | Uint8Array) => {
    bytes += Buffer.byteLength(chunk);
    return true;
  }) as typeof process.stdout.write;
  try {
    return { result: await work(), bytes };
  } finally {
    process.stdout.write = write;
  }
}

/** One metrics line as Powertools writes it in Lambda (EMF), in bytes. */
async function emfLineBytes(): Promise<number> {
  const metrics = new Metrics({ namespace: "Shardguard", serviceName: "shardguard-controller" });
  metrics.addMetric("shardOffline", MetricUnit.Count, 0);
  return (await stdoutBytesOf(() => metrics.publishStoredMetrics())).bytes;
}

function perSecond(counts: Record<string, OperationCount>, seconds: number) {
  return Object.fromEntries(
    Object.entries(counts).map(([op, count]) => [
      op,
      {
        requests: round(count.requests / seconds, 4),
        capacityUnits: round(count.capacityUnits / seconds, 4),
        errors: count.errors,
      },
    ]),
  );
}

const WRITE_OPS = new Set(["PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"]);
/** Write and read units per second; a failed conditional write is billed one write unit. */
function units(counts: Record<string, OperationCount>, seconds: number) {
  let writeUnits = 0;
  let readUnits = 0;
  for (const [op, count] of Object.entries(counts)) {
    if (WRITE_OPS.has(op)) writeUnits += count.capacityUnits + count.errors;
    else readUnits += count.capacityUnits;
  }
  return { writeUnits: writeUnits / seconds, readUnits: readUnits / seconds };
}
const total = (counts: Record<string, OperationCount>) =>
  Object.values(counts).reduce((sum, count) => sum + count.requests, 0);

interface Invocation {
  readonly wallMs: number;
  /** This process's CPU during the invocation: the handler's, and the counting proxies' (an upper bound). */
  readonly cpuMs: number;
  /** What the handler wrote to stdout: Powertools log and EMF metric lines, CloudWatch Logs' input. */
  readonly logBytes: number;
  readonly summary: unknown;
}

type Handler = (
  event: unknown,
  context: { getRemainingTimeInMillis(): number; awsRequestId?: string },
) => Promise<unknown>;

/** The Lambda's module, loaded as Lambda loads it: configuration from the environment at import. */
async function loadHandler(env: NodeJS.ProcessEnv): Promise<Handler> {
  Object.assign(process.env, env);
  return (await import("../functions/controller/handler.ts")).handler as Handler;
}

/** One scheduled invocation, as EventBridge's one-minute schedule makes it. */
async function invoke(handler: Handler, serial: number): Promise<Invocation> {
  const cpu = process.cpuUsage();
  const started = performance.now();
  const { result: summary, bytes: logBytes } = await stdoutBytesOf(() =>
    handler(
      { source: "aws.events", "detail-type": "Scheduled Event" },
      {
        getRemainingTimeInMillis: () => LAMBDA_TIMEOUT_MS - (performance.now() - started),
        awsRequestId: `bench-cost-${serial}`,
      },
    ),
  );
  const used = process.cpuUsage(cpu);
  return { wallMs: performance.now() - started, cpuMs: (used.user + used.system) / 1000, logBytes, summary };
}

const sleepUntil = (at: number) =>
  new Promise((resolve) => setTimeout(resolve, Math.max(0, at - performance.now())));

const stack = await startLocalStack({ onProgress: progress });
const proxies = {
  agentDynamo: await CountingProxy.start(stack.env.AWS_ENDPOINT_URL_DYNAMODB, { capacity: true }),
  agentSqs: await CountingProxy.start(stack.env.AWS_ENDPOINT_URL_SQS),
  controllerDynamo: await CountingProxy.start(stack.env.AWS_ENDPOINT_URL_DYNAMODB, { capacity: true }),
  controllerSqs: await CountingProxy.start(stack.env.AWS_ENDPOINT_URL_SQS),
};
const agentStack: LocalStack = {
  ...stack,
  env: {
    ...stack.env,
    AWS_ENDPOINT_URL_DYNAMODB: proxies.agentDynamo.url,
    AWS_ENDPOINT_URL_SQS: proxies.agentSqs.url,
  },
  stop: async () => {},
};
const controllerEnv: NodeJS.ProcessEnv = {
  ...stack.env,
  AWS_ENDPOINT_URL_DYNAMODB: proxies.controllerDynamo.url,
  AWS_ENDPOINT_URL_SQS: proxies.controllerSqs.url,
  [ENV.heartbeatIntervalMs]: String(config.heartbeatIntervalMs),
  [ENV.failureTimeoutMs]: String(config.failureTimeoutMs),
  [ENV.fenceTimeoutMs]: String(config.fenceTimeoutMs),
  [ENV.tickIntervalMs]: String(config.tickIntervalMs),
};
const agentEnv: NodeJS.ProcessEnv = {
  ...(keepaliveOptions.primaryKeepaliveMs
    ? { [ENV.primaryKeepaliveMs]: String(agentKeepalives.primaryKeepaliveMs) }
    : {}),
  ...(keepaliveOptions.replicaKeepaliveMs
    ? { [ENV.replicaKeepaliveMs]: String(agentKeepalives.replicaKeepaliveMs) }
    : {}),
};
const clusters: LocalCluster[] = [];
let controller: ReturnType<typeof startProcess> | undefined;
let controllerLogBytes = 0;
try {
  // A looping controller brings every shard online (its first topology); in lambda mode it stops
  // before the window and the handler takes over.
  controller = startProcess("controller", process.execPath, [CLI, "controller"], {
    env: { ...process.env, ...controllerEnv },
  });
  controller.child.stdout?.on("data", (chunk: Buffer) => {
    controllerLogBytes += chunk.length;
  });
  for (let index = 0; index < shardCount; index++) {
    progress(`starting shard ${index + 1} of ${shardCount} (${nodeCount} redis-server nodes and agents)`);
    clusters.push(
      await LocalCluster.start({
        stack: agentStack,
        nodes: nodeCount,
        controllers: 0,
        shard: `cost-${index + 1}-${Date.now().toString(36)}`,
        config,
        readyTimeoutMs: 60_000,
        agentEnv: () => agentEnv,
      }),
    );
  }
  let handler: Handler | undefined;
  if (controllerMode === "lambda") {
    await controller.stop(3000);
    controller = undefined;
    handler = await loadHandler({ ...controllerEnv, SHARDGUARD_EVENT_BUS: "shardguard-bench-cost" });
  }
  progress(
    `every shard online; counting requests for ${windowSeconds} s` +
      (handler ? ` with ${invocationCount} scheduled invocations of the controller Lambda's handler` : ""),
  );
  for (const proxy of Object.values(proxies)) proxy.reset();
  const logBytesBefore = controllerLogBytes;
  const started = performance.now();
  const invocations: Invocation[] = [];
  if (handler) {
    for (let serial = 0; serial < invocationCount; serial++) {
      await sleepUntil(started + (serial * windowSeconds * 1000) / invocationCount);
      const invocation = await invoke(handler, serial + 1);
      invocations.push(invocation);
      progress(
        `invocation ${serial + 1}/${invocationCount}: ${invocation.wallMs.toFixed(0)} ms wall, ` +
          `${invocation.cpuMs.toFixed(0)} ms CPU, ${invocation.logBytes} log bytes, ${JSON.stringify(invocation.summary)}`,
      );
    }
  }
  await sleepUntil(started + windowSeconds * 1000);
  const seconds = (performance.now() - started) / 1000;
  const measured = {
    agentDynamo: proxies.agentDynamo.snapshot(),
    agentSqs: proxies.agentSqs.snapshot(),
    controllerDynamo: proxies.controllerDynamo.snapshot(),
    controllerSqs: proxies.controllerSqs.snapshot(),
  };
  const controllerLogBytesPerSecond = (controllerLogBytes - logBytesBefore) / seconds;
  for (const cluster of clusters) {
    const topology = await cluster.topology();
    if (topology?.status !== "online" || topology.primary_node_id !== cluster.redis[0]?.id) {
      throw new Error(`shard ${cluster.shard} changed during the window: ${JSON.stringify(topology)}`);
    }
  }

  // The controller's rates, averaged over a month. Looping: as measured. Lambda: what one
  // invocation sent, 43,200 times a month (its wake-up queue is polled by the event source
  // mapping, ESM_POLLS_PER_SECOND, not by the handler).
  // A snapshot's Queries: the shard's members, its controller's partition, each member's partition.
  const none = { requests: 0, capacityUnits: 0, errors: 0 };
  const parts = ["Query (shard)", "Query (control)", "Query (node)"].map(
    (operation) => measured.controllerDynamo[operation] ?? none,
  );
  const snapshotQuery = {
    requests: parts.reduce((sum, part) => sum + part.requests, 0),
    capacityUnits: parts.reduce((sum, part) => sum + part.capacityUnits, 0),
    errors: parts.reduce((sum, part) => sum + part.errors, 0),
  };
  const controllerUnits = units(measured.controllerDynamo, seconds);
  const toMonthlyAverage = handler ? seconds / invocationCount / 60 : 1;
  const controllerRates = {
    snapshotReadUnits: (snapshotQuery.capacityUnits / seconds) * toMonthlyAverage,
    snapshotRequests: (snapshotQuery.requests / seconds) * toMonthlyAverage,
    otherReadUnits: (controllerUnits.readUnits - snapshotQuery.capacityUnits / seconds) * toMonthlyAverage,
    writeUnits: controllerUnits.writeUnits * toMonthlyAverage,
  };

  // Per shard: every agent request, and the controller's snapshot Query of the shard.
  const agentUnits = units(measured.agentDynamo, seconds);
  const perShardRates = {
    writeUnits: agentUnits.writeUnits / shardCount,
    readUnits: agentUnits.readUnits / shardCount + controllerRates.snapshotReadUnits / shardCount,
    sqsRequests: total(measured.agentSqs) / seconds / shardCount,
    dynamoRequests: (total(measured.agentDynamo) / seconds + controllerRates.snapshotRequests) / shardCount,
  };
  const perShardDynamo = dynamoMonthly(perShardRates, prices);
  const perShardSqs = sqsMonthly(perShardRates.sqsRequests, prices);
  const perShard = {
    dynamodbOnDemand: perShardDynamo.onDemand,
    dynamodbProvisioned: perShardDynamo.provisioned,
    sqs: perShardSqs,
    totalOnDemand: perShardDynamo.onDemand + perShardSqs,
    totalProvisioned: perShardDynamo.provisioned + perShardSqs,
  };

  // Fixed: the controller's shard-index reads (each partition lists the index), its wake-up queue,
  // Lambda, CloudWatch.
  const fixedRates = {
    writeUnits: controllerRates.writeUnits,
    readUnits: controllerRates.otherReadUnits * partitions,
    sqsRequests: ESM_POLLS_PER_SECOND,
  };
  const fixedDynamo = dynamoMonthly(fixedRates, prices);
  const share = Math.min(1, lambdaMemoryMb / ONE_VCPU_MB);
  // Lambda mode bills what an invocation took here, or its CPU at the function's share of a vCPU
  // if that is longer (bench/lib/lambda-sizing.ts); looping bills --lambda-seconds.
  const billedSeconds = handler
    ? median(invocations.map((invocation) => Math.max(invocation.wallMs, invocation.cpuMs / share))) / 1000
    : lambdaSeconds;
  const lambda = lambdaMonthly(
    {
      memoryMb: lambdaMemoryMb,
      secondsPerInvocation: billedSeconds,
      invocationsPerMonth: INVOCATIONS_PER_MONTH,
      partitions,
    },
    prices,
  );
  const emfBytes = await emfLineBytes();
  const logBytesPerSecond = handler
    ? (partitions *
        (median(invocations.map((invocation) => invocation.logBytes)) + LAMBDA_PLATFORM_LOG_BYTES) *
        INVOCATIONS_PER_MONTH) /
      SECONDS_PER_MONTH
    : partitions *
        (emfBytes * (1000 / config.tickIntervalMs) +
          (LAMBDA_PLATFORM_LOG_BYTES * INVOCATIONS_PER_MONTH) / SECONDS_PER_MONTH) +
      controllerLogBytesPerSecond;
  const fixed = {
    lambdaDuration: lambda.duration,
    lambdaRequests: lambda.requests,
    dynamodbOnDemand: fixedDynamo.onDemand,
    dynamodbProvisioned: fixedDynamo.provisioned,
    sqsWakeQueuePolling: sqsMonthly(ESM_POLLS_PER_SECOND, prices),
    cloudwatchLogs: logsMonthly(logBytesPerSecond, prices),
    cloudwatchMetrics: prices.cloudwatch.customMetricMonth,
    cloudwatchAlarms: FIXED_ALARMS * prices.cloudwatch.alarmStandardMonth,
    dashboard: prices.cloudwatch.dashboardMonth,
  };
  const fixedCompute =
    fixed.lambdaDuration +
    fixed.lambdaRequests +
    fixed.dynamodbOnDemand +
    fixed.sqsWakeQueuePolling +
    fixed.cloudwatchLogs;
  const fixedTotal = fixedCompute + fixed.cloudwatchMetrics + fixed.cloudwatchAlarms + fixed.dashboard;

  const result = {
    bench: "cost",
    at: new Date().toISOString(),
    prices: { region: prices.region, asOf: prices.asOf, checked: prices.checked },
    setup: {
      shards: shardCount,
      nodesPerShard: nodeCount,
      windowSeconds: round(seconds, 1),
      scaledTo: "30-day month (rate x 2,592,000 s)",
      config,
      keepalives: agentKeepalives,
      controller: handler
        ? {
            mode: "lambda",
            invocations: invocationCount,
            scaledTo: `${INVOCATIONS_PER_MONTH} scheduled invocations a month per partition`,
          }
        : { mode: "loop", tickIntervalMs: config.tickIntervalMs },
      lambda: {
        memoryMb: lambdaMemoryMb,
        billedSecondsPerInvocation: round(billedSeconds, 4),
        partitions,
        arch: "arm64",
      },
    },
    measuredPerSecond: {
      agentDynamo: perSecond(measured.agentDynamo, seconds),
      agentSqs: perSecond(measured.agentSqs, seconds),
      controllerDynamo: perSecond(measured.controllerDynamo, seconds),
      controllerSqs: perSecond(measured.controllerSqs, seconds),
      controllerLogBytes: round(controllerLogBytesPerSecond, 1),
      emfLineBytes: emfBytes,
    },
    invocations: invocations.map((invocation) => ({
      wallMs: round(invocation.wallMs, 1),
      cpuMs: round(invocation.cpuMs, 1),
      logBytes: invocation.logBytes,
      summary: invocation.summary,
    })),
    perShardRates: Object.fromEntries(Object.entries(perShardRates).map(([k, v]) => [k, round(v, 4)])),
    perShardMonthly: Object.fromEntries(Object.entries(perShard).map(([k, v]) => [k, round(v, 4)])),
    fixedMonthly: {
      ...Object.fromEntries(Object.entries(fixed).map(([k, v]) => [k, round(v, 4)])),
      computeAndRequests: round(fixedCompute, 4),
      total: round(fixedTotal, 4),
    },
  };
  const out =
    values.out ??
    fileURLToPath(
      new URL(
        `./results/cost-hb${config.heartbeatIntervalMs}-ft${config.failureTimeoutMs}-${controllerMode}.json`,
        import.meta.url,
      ),
    );
  writeFileSync(out, `${JSON.stringify(result, null, 2)}\n`);
  if (values.json) {
    console.log(JSON.stringify(result));
  } else {
    const usd = (value: number) => `$${value.toFixed(value < 1 ? 3 : 2)}`;
    console.log(
      `${shardCount} shards x ${nodeCount} nodes, heartbeat ${config.heartbeatIntervalMs} ms, failure timeout ${config.failureTimeoutMs} ms, ` +
        `fence ${config.fenceTimeoutMs} ms, keepalives primary ${agentKeepalives.primaryKeepaliveMs} ms / replica ${agentKeepalives.replicaKeepaliveMs} ms, ` +
        `measured ${seconds.toFixed(1)} s, scaled to 30 days; prices ${prices.region} as of ${prices.asOf}`,
    );
    console.log("\nrequests per second (measured):");
    for (const [part, counts] of Object.entries(measured)) {
      for (const [op, count] of Object.entries(counts)) {
        console.log(
          `  ${part.padEnd(17)} ${op.padEnd(26)} ${(count.requests / seconds).toFixed(3).padStart(8)} req/s` +
            (count.capacityUnits ? `  ${(count.capacityUnits / seconds).toFixed(3)} units/s` : ""),
        );
      }
    }
    if (handler) {
      console.log(
        `  (the controller's are ${invocationCount} invocations in ${seconds.toFixed(0)} s; priced as one a minute)`,
      );
    }
    console.log("\nper shard-month:");
    console.log(`  DynamoDB on-demand      ${usd(perShard.dynamodbOnDemand)}`);
    console.log(`  DynamoDB provisioned    ${usd(perShard.dynamodbProvisioned)}`);
    console.log(`  SQS                     ${usd(perShard.sqs)}`);
    console.log(`  total, on-demand        ${usd(perShard.totalOnDemand)}`);
    console.log(`  total, provisioned      ${usd(perShard.totalProvisioned)}`);
    console.log(
      `\nfixed per month (${partitions} controller partition(s), ${lambdaMemoryMb} MB arm64, ` +
        (handler
          ? `${(billedSeconds * 1000).toFixed(0)} ms billed per scheduled invocation, median of ${invocationCount}):`
          : `looping ${lambdaSeconds} s of every minute):`),
    );
    for (const [name, value] of Object.entries(fixed)) console.log(`  ${name.padEnd(22)}  ${usd(value)}`);
    console.log(`  compute and requests    ${usd(fixedCompute)}`);
    console.log(`  total                   ${usd(fixedTotal)}`);
    console.log(`\nwritten to ${out}`);
  }
} finally {
  await Promise.all(clusters.map((cluster) => cluster.stop()));
  await controller?.stop(3000);
  for (const proxy of Object.values(proxies)) await proxy.stop();
  await stack.stop();
}
