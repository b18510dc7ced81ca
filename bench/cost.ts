/**
 * `npm run bench:cost`: what a shard costs per month, measured. Runs N real shards (redis-server
 * nodes, one `shardguard agent` process each) and one real `shardguard controller` process on the
 * local stack, counts every AWS request they send through counting proxies in front of DynamoDB
 * Local and the SQS emulator (agents and controller through separate proxies), with the capacity
 * units DynamoDB Local reports for each, over a short steady-state window, scales the rates to a
 * 30-day month and prices them from bench/prices.json. Per-shard and fixed parts are separate.
 *
 *   npm run bench:cost -- [--shards 2] [--nodes 3] [--seconds 90] [--heartbeat-interval 1000]
 *                         [--failure-timeout 3000] [--lambda-memory 512] [--lambda-seconds 72]
 *                         [--partitions 1] [--json] [--out bench/results/cost-<label>.json]
 */
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Metrics, MetricUnit } from "@aws-lambda-powertools/metrics";
import { ENV } from "../src/adapters/env.ts";
import { parseFailoverConfig } from "../src/core/config.ts";
import { LocalCluster } from "../src/dev/local-cluster.ts";
import { startProcess } from "../src/dev/local-stack/processes.ts";
import { type LocalStack, startLocalStack } from "../src/dev/local-stack/stack.ts";
import { CountingProxy, type OperationCount } from "./lib/counting-proxy.ts";
import {
  dynamoMonthly,
  lambdaMonthly,
  loadPrices,
  logsMonthly,
  round,
  SECONDS_PER_MONTH,
  sqsMonthly,
} from "./lib/pricing.ts";

const { values } = parseArgs({
  options: {
    shards: { type: "string", default: "2" },
    nodes: { type: "string", default: "3" },
    seconds: { type: "string", default: "90" },
    "heartbeat-interval": { type: "string", default: "1000" },
    "failure-timeout": { type: "string", default: "3000" },
    "lambda-memory": { type: "string", default: "512" },
    "lambda-seconds": { type: "string", default: "72" },
    partitions: { type: "string", default: "1" },
    json: { type: "boolean", default: false },
    out: { type: "string" },
  },
});
const shardCount = Number(values.shards);
const nodeCount = Number(values.nodes);
const windowSeconds = Number(values.seconds);
const config = parseFailoverConfig({
  heartbeatIntervalMs: Number(values["heartbeat-interval"]),
  failureTimeoutMs: Number(values["failure-timeout"]),
  fenceTimeoutMs: Math.min(2000, Number(values["failure-timeout"]) - 500),
});
const lambdaMemoryMb = Number(values["lambda-memory"]);
const lambdaSeconds = Number(values["lambda-seconds"]);
const partitions = Number(values.partitions);
const prices = loadPrices();
const progress = (line: string) => {
  if (!values.json) process.stderr.write(`[cost] ${line}\n`);
};

const CLI = fileURLToPath(new URL("../src/cli/main.ts", import.meta.url));
/** Alarms the CDK construct creates once (controller, table throttles) and per node (dead-letter queue). */
const FIXED_ALARMS = 8;
const ALARMS_PER_NODE = 1;
/** Lambda's own START/END/REPORT lines per invocation, bytes (typical sizes). */
const LAMBDA_PLATFORM_LOG_BYTES = 420;
/**
 * The wake-up queue's event source mapping in Lambda: AWS polls a standard queue with 5
 * concurrent 20 s long polls while it is idle (billed SQS requests). Not measured here: the local
 * controller long-polls the queue itself instead.
 */
const ESM_POLLS_PER_SECOND = 5 / 20;

/** One metrics line as Powertools writes it in Lambda (EMF), in bytes. */
function emfLineBytes(): number {
  const metrics = new Metrics({ namespace: "Shardguard", serviceName: "shardguard-controller" });
  metrics.addMetric("shardOffline", MetricUnit.Count, 0);
  let bytes = 0;
  const write = process.stdout.write.bind(process.stdout);
  process.stdout.write = ((chunk: string | Uint8Array) => {
    bytes += Buffer.byteLength(chunk);
    return true;
  }) as typeof process.stdout.write;
  try {
    metrics.publishStoredMetrics();
  } finally {
    process.stdout.write = write;
  }
  return bytes;
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
const clusters: LocalCluster[] = [];
let controller: ReturnType<typeof startProcess> | undefined;
let controllerLogBytes = 0;
try {
  controller = startProcess("controller", process.execPath, [CLI, "controller"], {
    env: {
      ...process.env,
      ...stack.env,
      AWS_ENDPOINT_URL_DYNAMODB: proxies.controllerDynamo.url,
      AWS_ENDPOINT_URL_SQS: proxies.controllerSqs.url,
      [ENV.heartbeatIntervalMs]: String(config.heartbeatIntervalMs),
      [ENV.failureTimeoutMs]: String(config.failureTimeoutMs),
      [ENV.fenceTimeoutMs]: String(config.fenceTimeoutMs),
      [ENV.tickIntervalMs]: String(config.tickIntervalMs),
    },
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
      }),
    );
  }
  progress(`every shard online; counting requests for ${windowSeconds} s`);
  for (const proxy of Object.values(proxies)) proxy.reset();
  const logBytesBefore = controllerLogBytes;
  const started = performance.now();
  await new Promise((resolve) => setTimeout(resolve, windowSeconds * 1000));
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

  // Per shard: every agent request, and the controller's snapshot Query of the shard.
  const agentUnits = units(measured.agentDynamo, seconds);
  const snapshotQuery = measured.controllerDynamo["Query (shard)"] ?? {
    requests: 0,
    capacityUnits: 0,
    errors: 0,
  };
  const perShardRates = {
    writeUnits: agentUnits.writeUnits / shardCount,
    readUnits: (agentUnits.readUnits + snapshotQuery.capacityUnits / seconds) / shardCount,
    sqsRequests: total(measured.agentSqs) / seconds / shardCount,
    dynamoRequests: (total(measured.agentDynamo) + snapshotQuery.requests) / seconds / shardCount,
  };
  const perShardDynamo = dynamoMonthly(perShardRates, prices);
  const perShardSqs = sqsMonthly(perShardRates.sqsRequests, prices);
  const perShardAlarms = nodeCount * ALARMS_PER_NODE * prices.cloudwatch.alarmStandardMonth;
  const perShard = {
    dynamodbOnDemand: perShardDynamo.onDemand,
    dynamodbProvisioned: perShardDynamo.provisioned,
    sqs: perShardSqs,
    cloudwatchAlarms: perShardAlarms,
    totalOnDemand: perShardDynamo.onDemand + perShardSqs + perShardAlarms,
    totalProvisioned: perShardDynamo.provisioned + perShardSqs + perShardAlarms,
  };

  // Fixed: the controller's shard-index reads, its wake-up queue, Lambda, CloudWatch.
  const controllerUnits = units(measured.controllerDynamo, seconds);
  const fixedRates = {
    writeUnits: controllerUnits.writeUnits,
    readUnits: controllerUnits.readUnits - snapshotQuery.capacityUnits / seconds,
    sqsRequests: ESM_POLLS_PER_SECOND,
  };
  const fixedDynamo = dynamoMonthly(fixedRates, prices);
  const lambda = lambdaMonthly(
    {
      memoryMb: lambdaMemoryMb,
      secondsPerInvocation: lambdaSeconds,
      invocationsPerMonth: 43_200,
      partitions,
    },
    prices,
  );
  const emfBytes = emfLineBytes();
  const passesPerSecond = 1000 / config.tickIntervalMs;
  const logBytesPerSecond =
    partitions * (emfBytes * passesPerSecond + (LAMBDA_PLATFORM_LOG_BYTES * 43_200) / SECONDS_PER_MONTH) +
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
      lambda: { memoryMb: lambdaMemoryMb, secondsPerInvocation: lambdaSeconds, partitions, arch: "arm64" },
    },
    measuredPerSecond: {
      agentDynamo: perSecond(measured.agentDynamo, seconds),
      agentSqs: perSecond(measured.agentSqs, seconds),
      controllerDynamo: perSecond(measured.controllerDynamo, seconds),
      controllerSqs: perSecond(measured.controllerSqs, seconds),
      controllerLogBytes: round(controllerLogBytesPerSecond, 1),
      emfLineBytes: emfBytes,
    },
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
        `./results/cost-hb${config.heartbeatIntervalMs}-ft${config.failureTimeoutMs}.json`,
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
    console.log("\nper shard-month:");
    console.log(`  DynamoDB on-demand      ${usd(perShard.dynamodbOnDemand)}`);
    console.log(`  DynamoDB provisioned    ${usd(perShard.dynamodbProvisioned)}`);
    console.log(`  SQS                     ${usd(perShard.sqs)}`);
    console.log(
      `  CloudWatch alarms       ${usd(perShard.cloudwatchAlarms)} (${nodeCount} dead-letter alarms)`,
    );
    console.log(`  total, on-demand        ${usd(perShard.totalOnDemand)}`);
    console.log(`  total, provisioned      ${usd(perShard.totalProvisioned)}`);
    console.log(
      `\nfixed per month (${partitions} controller partition(s), ${lambdaMemoryMb} MB arm64, ${lambdaSeconds} s per minute):`,
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
