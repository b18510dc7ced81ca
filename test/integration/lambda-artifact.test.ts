import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { App } from "aws-cdk-lib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ShardguardStack } from "../../cdk/shardguard-stack.ts";
import { ENV } from "../../src/adapters/env.ts";
import { LocalCluster } from "../../src/dev/local-cluster.ts";
import { cdkContext } from "../fixtures/cdk-app.ts";
import { waitForFollowers } from "../support/chaos-cluster.ts";

/**
 * Issue 34, item 1: the artifact under test. The CDK app is synthesized with its real bundling
 * (esbuild, as `cdk deploy` runs it), and the controller and operator functions are loaded from
 * their assets in cdk.out exactly as Lambda does: the template's `Handler` (`index.handler`)
 * resolved in the asset directory, in a fresh Node process whose environment is the template's
 * `Environment.Variables` (intrinsics resolved to the local stack) plus the local endpoints. They
 * serve a scheduled event, an SQS wake batch (the event source mapping's shape), an operator
 * switchover and a malformed request, and a failover completes through the bundled controller.
 * A bundling difference (a dynamic import, a missing file, ESM/CJS) fails here, not in an account.
 */

const run = promisify(execFile);
const STACK = "ShardguardArtifact";
const ACCOUNT = "111111111111";
const REGION = "us-east-1";

interface FunctionArtifact {
  readonly logicalId: string;
  readonly assetDir: string;
  readonly handler: string;
  readonly environment: Record<string, unknown>;
}

/** A stand-in EventBridge endpoint (DynamoDB Local and fauxqs have none): records PutEvents entries. */
class EventBusStub {
  readonly detailTypes: string[] = [];
  #server: Server | undefined;

  async start(): Promise<string> {
    const server = createServer((request, response) => {
      let body = "";
      request.on("data", (chunk) => {
        body += chunk;
      });
      request.on("end", () => {
        const entries = (JSON.parse(body || "{}").Entries ?? []) as { DetailType?: string }[];
        for (const entry of entries) this.detailTypes.push(String(entry.DetailType));
        response.setHeader("content-type", "application/x-amz-json-1.1");
        response.end(
          JSON.stringify({
            FailedEntryCount: 0,
            Entries: entries.map((_, index) => ({ EventId: `e${index}` })),
          }),
        );
      });
    });
    this.#server = server;
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => (this.#server ? this.#server.close(() => resolve()) : resolve()));
  }
}

/** Synthesizes the stack with bundling into `outdir`; the two functions as their assets and environment. */
function synthesize(outdir: string, tableName: string, queuePrefix: string): FunctionArtifact[] {
  // As the CDK CLI synthesizes: each function's asset directory recorded in its metadata.
  const app = new App({ outdir, context: { ...cdkContext(), "aws:cdk:enable-asset-metadata": true } });
  new ShardguardStack(app, STACK, {
    env: { account: ACCOUNT, region: REGION },
    controller: { tableName, queuePrefix, deletionProtection: false },
  });
  app.synth();
  const template = JSON.parse(readFileSync(path.join(outdir, `${STACK}.template.json`), "utf8")) as {
    Resources: Record<
      string,
      { Type: string; Metadata?: Record<string, string>; Properties: Record<string, unknown> }
    >;
  };
  return Object.entries(template.Resources)
    .filter(([, resource]) => resource.Type === "AWS::Lambda::Function")
    .map(([logicalId, resource]) => ({
      logicalId,
      assetDir: path.join(outdir, String(resource.Metadata?.["aws:asset:path"])),
      handler: String(resource.Properties.Handler),
      environment:
        (resource.Properties.Environment as { Variables?: Record<string, unknown> } | undefined)?.Variables ??
        {},
    }));
}

/**
 * Lambda's own resolution of `Handler` ("file.export"): the first of file.mjs, file.js, file.cjs
 * in the asset directory, and the export by that name.
 */
function handlerModule(artifact: FunctionArtifact): { file: string; exportName: string } {
  const dot = artifact.handler.lastIndexOf(".");
  const base = artifact.handler.slice(0, dot);
  const exportName = artifact.handler.slice(dot + 1);
  const file = [".mjs", ".js", ".cjs"]
    .map((extension) => path.join(artifact.assetDir, `${base}${extension}`))
    .find((candidate) => existsSync(candidate));
  if (file === undefined)
    throw new Error(`${artifact.logicalId}: no ${base}.mjs/.js/.cjs in ${artifact.assetDir}`);
  return { file, exportName };
}

/**
 * The template's environment for the local stack: literals as they are; an intrinsic (a `Ref` or
 * `Fn::GetAtt` that CloudFormation resolves at deploy time) replaced by `resolved[name]`, and one
 * that has no replacement fails the test (a variable the stack adds must be understood here).
 */
function environmentOf(artifact: FunctionArtifact, resolved: Record<string, string>): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(artifact.environment)) {
    if (typeof value === "string") env[name] = value;
    else if (resolved[name] !== undefined) env[name] = resolved[name];
    else
      throw new Error(
        `${artifact.logicalId}: ${name} is ${JSON.stringify(value)}, not resolved for the local stack`,
      );
  }
  return env;
}

/** Invokes `artifact` with `event` in a fresh Node process (a cold start), `ms` of invocation time. */
async function invoke(
  artifact: FunctionArtifact,
  env: Record<string, string>,
  event: unknown,
  ms: number,
): Promise<unknown> {
  const { file, exportName } = handlerModule(artifact);
  const script = [
    'import { pathToFileURL } from "node:url";',
    `const module = await import(pathToFileURL(${JSON.stringify(file)}).href);`,
    `const handler = module[${JSON.stringify(exportName)}];`,
    `const end = Date.now() + ${ms};`,
    `const result = await handler(${JSON.stringify(event)}, { getRemainingTimeInMillis: () => end - Date.now(), awsRequestId: "artifact-test" });`,
    'process.stdout.write("\\nRESULT " + JSON.stringify(result) + "\\n");',
  ].join("\n");
  const { stdout } = await run(process.execPath, ["--input-type=module", "-e", script], {
    env,
    timeout: ms + 30_000,
    maxBuffer: 64 * 1024 * 1024,
  });
  const line = stdout.split("\n").find((candidate) => candidate.startsWith("RESULT "));
  if (line === undefined) throw new Error(`no result from ${artifact.logicalId}: ${stdout.slice(-2000)}`);
  return JSON.parse(line.slice("RESULT ".length));
}

let outdir: string | undefined;
let cluster: LocalCluster | undefined;
const bus = new EventBusStub();

beforeAll(async () => {
  outdir = mkdtempSync(path.join(tmpdir(), "shardguard-cdk-out-"));
}, 10_000);

afterAll(async () => {
  await cluster?.stop();
  await bus.stop();
  if (outdir) rmSync(outdir, { recursive: true, force: true });
});

describe("the controller and operator functions as cdk.out bundles them", () => {
  it("serve a scheduled event, a wake batch, a switchover and a malformed request; a failover completes through the bundle", {
    timeout: 300_000,
  }, async () => {
    // Prepare: the shard, adopted by a local controller that then stops: from here on only the bundle acts.
    cluster = await LocalCluster.start({ readyTimeoutMs: 120_000 });
    const active = cluster;
    await active.controllers[0]?.stop();
    const queuePrefix = active.env[ENV.queuePrefix] || "shardguard";
    const artifacts = synthesize(outdir as string, active.stack.env.SHARDGUARD_TABLE, queuePrefix);
    const controller = artifacts.find((artifact) => artifact.logicalId.startsWith("ShardguardController"));
    const operator = artifacts.find((artifact) => artifact.logicalId.startsWith("ShardguardOperator"));
    expect(artifacts.map((artifact) => artifact.handler)).toEqual(["index.handler", "index.handler"]);
    const busEndpoint = await bus.start();
    const local = {
      ...active.stack.env,
      AWS_ENDPOINT_URL_EVENTBRIDGE: busEndpoint,
      AWS_LAMBDA_FUNCTION_NAME: "artifact-test",
    };
    const resolved = {
      [ENV.table]: active.stack.env.SHARDGUARD_TABLE,
      [ENV.eventBusName]: "shardguard-artifact-bus",
    };
    const envOf = (artifact: FunctionArtifact | undefined) => {
      if (!artifact)
        throw new Error(`functions synthesized: ${artifacts.map((a) => a.logicalId).join(", ")}`);
      return { ...environmentOf(artifact, resolved), ...local };
    };
    const before = await active.topology();

    // Act: a scheduled event (the loop runs until shortly before the invocation's end).
    const scheduled = await invoke(
      controller as FunctionArtifact,
      envOf(controller),
      { source: "aws.events", "detail-type": "Scheduled Event", detail: {} },
      4000,
    );
    // Act: an operator switchover and a malformed request, through the operator function.
    const switched = (await invoke(
      operator as FunctionArtifact,
      envOf(operator),
      { action: "switchover", shard: active.shard, reason: "artifact test" },
      60_000,
    )) as { ok: boolean; primary?: string };
    const malformed = await invoke(
      operator as FunctionArtifact,
      envOf(operator),
      { action: "explode", shard: 7 },
      5000,
    );
    await waitForFollowers(
      active,
      switched.primary as string,
      active.redis.map((node) => node.id).filter((id) => id !== switched.primary),
    );
    // Act: the new primary's redis-server dies; its agent's wake-up, as the wake queue's event
    // source mapping delivers it, starts the bundled controller, which fails the shard over.
    const afterSwitch = await active.topology();
    active.node(switched.primary as string).signal("SIGKILL");
    const wake = {
      shard: active.shard,
      node: switched.primary,
      reason: "crash",
      sent_at: Date.now(),
    };
    const batch = {
      Records: [
        {
          messageId: "00000000-0000-4000-8000-000000000001",
          receiptHandle: "artifact-receipt",
          body: JSON.stringify(wake),
          attributes: {
            ApproximateReceiveCount: "1",
            SentTimestamp: String(Date.now()),
            SenderId: ACCOUNT,
            ApproximateFirstReceiveTimestamp: String(Date.now()),
          },
          messageAttributes: {},
          md5OfBody: "",
          eventSource: "aws:sqs",
          eventSourceARN: `arn:aws:sqs:${REGION}:${ACCOUNT}:${queuePrefix}_wake`,
          awsRegion: REGION,
        },
      ],
    };
    const woken = await invoke(controller as FunctionArtifact, envOf(controller), batch, 25_000);
    const after = await active.topology();
    const history = await active.aws.store.history.list(active.shard, 1);

    // Assess
    expect(scheduled).toMatchObject({ errors: 0 });
    expect((scheduled as { passes: number }).passes).toBeGreaterThan(0);
    expect(switched).toMatchObject({ ok: true, action: "switchover", outcome: "completed" });
    expect(switched.primary).not.toBe(before?.primary_node_id);
    expect(malformed).toMatchObject({ ok: false });
    expect((malformed as { reason: string }).reason).toMatch(/^invalid request: /);
    expect(woken).toMatchObject({ errors: 0 });
    expect(after).toMatchObject({ status: "online", epoch: (afterSwitch?.epoch ?? 0) + 1 });
    expect(after?.primary_node_id).not.toBe(switched.primary);
    expect(history[0]).toMatchObject({ kind: "failover", old_primary_node_id: switched.primary });
    expect(bus.detailTypes).toEqual(expect.arrayContaining(["FailoverStarted", "FailoverCompleted"]));
  });
});
