import { execFile } from "node:child_process";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { awsEnv, uniqueName } from "../support/aws.ts";

/**
 * `shardguard pause/switchover` with SHARDGUARD_CONTROLLER_FUNCTION: the real CLI and the real
 * Lambda client against a stand-in Lambda endpoint on 127.0.0.1 that answers with throttles first.
 * The throttles are the one thing here that is not real: no local Lambda enforces reserved
 * concurrency. That the scheduled loop never takes the operator function's concurrency is shown by
 * the synthesized template (test/unit/cdk-installations.test.ts, "operator requests").
 */

const run = promisify(execFile);
const CLI = "src/cli/main.ts";
const FUNCTION = "Shardguard-Operator";

interface Invocation {
  readonly path: string;
  readonly body: unknown;
}

/** Answers the first `throttles` invokes with 429 TooManyRequestsException, later ones with `reply`. */
function fakeLambda(throttles: number, reply: (request: { shard: string }) => unknown) {
  const invocations: Invocation[] = [];
  const server: Server = createServer((req, res) => {
    let text = "";
    req.on("data", (chunk) => {
      text += chunk;
    });
    req.on("end", () => {
      const body = JSON.parse(text || "{}") as { shard: string };
      invocations.push({ path: req.url ?? "", body });
      if (invocations.length <= throttles) {
        res.writeHead(429, {
          "content-type": "application/json",
          "x-amzn-errortype": "TooManyRequestsException",
        });
        res.end(
          JSON.stringify({
            Reason: "ReservedFunctionConcurrentInvocationLimitExceeded",
            Type: "User",
            message: "Rate Exceeded.",
          }),
        );
        return;
      }
      res.writeHead(200, { "content-type": "application/json", "x-amz-executed-version": "$LATEST" });
      res.end(JSON.stringify(reply(body)));
    });
  });
  return { server, invocations };
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function shardguard(env: NodeJS.ProcessEnv, ...args: string[]) {
  try {
    const { stdout, stderr } = await run(process.execPath, [CLI, ...args], { env, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const failed = error as { code?: number; stdout?: string; stderr?: string };
    return { code: failed.code ?? 1, stdout: failed.stdout ?? "", stderr: failed.stderr ?? "" };
  }
}

const shard = uniqueName("op").slice(0, 24);
const servers: Server[] = [];

beforeAll(async () => {
  // The CLI checks the shard exists before it invokes anything.
  const aws = createAwsAdapters({ env: awsEnv() });
  await aws.store.topology.compareAndSet(shard, undefined, {
    shard,
    epoch: 1,
    primary_node_id: "p1",
    primary_address: "127.0.0.1:6379",
    status: "online",
    updated_at: aws.clock.now(),
  });
  await aws.store.shards.register(shard);
  aws.destroy();
});

afterAll(async () => {
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
});

describe("operator requests through the operator function", () => {
  it("retry a throttled invoke and report the controller's answer", async () => {
    // Prepare
    const lambda = fakeLambda(2, (request) => ({
      ok: true,
      action: "pause",
      shard: request.shard,
      outcome: "paused",
      epoch: 1,
      reason: "paused: kernel upgrade",
    }));
    servers.push(lambda.server);
    const endpoint = await listen(lambda.server);

    // Act
    const result = await shardguard(
      {
        ...process.env,
        ...awsEnv(),
        AWS_ENDPOINT_URL_LAMBDA: endpoint,
        SHARDGUARD_CONTROLLER_FUNCTION: FUNCTION,
      },
      "pause",
      "--shard",
      shard,
      "--reason",
      "kernel upgrade",
    );

    // Assess
    expect(result.stderr).toBe("");
    expect(result).toMatchObject({
      code: 0,
      stdout: `pause of shard ${shard}: paused: kernel upgrade (epoch 1)\n`,
    });
    expect(lambda.invocations).toHaveLength(3);
    for (const invocation of lambda.invocations) {
      expect(invocation.path).toBe(`/2015-03-31/functions/${FUNCTION}/invocations`);
      expect(invocation.body).toEqual({ action: "pause", shard, reason: "kernel upgrade" });
    }
  }, 60_000);

  it("give up after five throttles with what to check, having changed nothing", async () => {
    // Prepare
    const lambda = fakeLambda(Number.POSITIVE_INFINITY, () => ({}));
    servers.push(lambda.server);
    const endpoint = await listen(lambda.server);

    // Act
    const result = await shardguard(
      {
        ...process.env,
        ...awsEnv(),
        AWS_ENDPOINT_URL_LAMBDA: endpoint,
        SHARDGUARD_CONTROLLER_FUNCTION: FUNCTION,
      },
      "switchover",
      "--shard",
      shard,
      "--wait",
    );

    // Assess
    expect(result.code).toBe(1);
    expect(lambda.invocations).toHaveLength(5);
    expect(result.stderr).toMatch(
      new RegExp(`controller ${FUNCTION} throttled the switchover 5 times .* OperatorFunctionName output`),
    );
  }, 60_000);
});
