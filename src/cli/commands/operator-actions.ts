import { Logger } from "@aws-lambda-powertools/logger";
import { InvokeCommand, LambdaClient } from "@aws-sdk/client-lambda";
import type { Command } from "commander";
import { callJournalFromEnv } from "../../adapters/aws-adapters.ts";
import { ENV } from "../../adapters/env.ts";
import { discardMetrics, powertoolsLogger } from "../../adapters/observability.ts";
import {
  handleOperatorRequest,
  type OperatorRequest,
  type OperatorResponse,
} from "../../controller/requests.ts";
import { createControllerRuntime } from "../../controller/runtime.ts";
import { ShardguardError } from "../../core/errors.ts";
import { requireKnownShard, withOperatorSession } from "../aws-session.ts";

/** The controller refused or could not complete an operator request. */
export class OperatorRequestFailed extends ShardguardError {
  override name = "OperatorRequestFailed";
}

interface ActionOptions {
  readonly shard: string;
  readonly to?: string;
  readonly node?: string;
  readonly reason?: string;
  readonly wait?: boolean;
  readonly function?: string;
  readonly json?: boolean;
}

/**
 * Every change to a shard runs through the controller's orchestrator. Against a deployment the
 * CLI invokes the controller Lambda (the operator needs only lambda:InvokeFunction, see the CDK
 * construct's grantOperatorInvoke); without a function name the same request runs in-process,
 * e.g. against `shardguard local-stack`.
 */
async function submit(
  request: OperatorRequest,
  options: ActionOptions,
): Promise<OperatorResponse | undefined> {
  const functionName = options.function ?? process.env[ENV.controllerFunction];
  await withOperatorSession(({ aws }) => requireKnownShard(aws.store, request.shard));
  if (functionName) return invokeController(functionName, request, options.wait !== false);
  process.stderr.write(
    `shardguard: no ${ENV.controllerFunction}: running the ${request.action} in-process\n`,
  );
  return runInProcess(request);
}

/**
 * Attempts of one invoke. The stack's operator function has a reserved concurrency of its own that
 * the scheduled loop never uses, so a throttle means other operators' requests fill it; the SDK
 * retries a throttle with back-off (about 7 s in all) before the command gives up.
 */
export const OPERATOR_INVOKE_ATTEMPTS = 5;

async function invokeController(
  functionName: string,
  request: OperatorRequest,
  wait: boolean,
): Promise<OperatorResponse | undefined> {
  const lambda = new LambdaClient({ maxAttempts: OPERATOR_INVOKE_ATTEMPTS });
  const journal = callJournalFromEnv(process.env, { component: "operator" });
  if (journal) lambda.middlewareStack.use(journal.plugin("lambda"));
  try {
    const result = await lambda.send(
      new InvokeCommand({
        FunctionName: functionName,
        InvocationType: wait ? "RequestResponse" : "Event",
        Payload: new TextEncoder().encode(JSON.stringify(request)),
      }),
    );
    if (!wait) return undefined;
    const payload = result.Payload ? new TextDecoder().decode(result.Payload) : "";
    if (result.FunctionError) {
      throw new OperatorRequestFailed(
        `controller ${functionName} failed (${result.FunctionError}): ${payload}`,
      );
    }
    return JSON.parse(payload) as OperatorResponse;
  } catch (error) {
    if ((error as { name?: string }).name === "TooManyRequestsException") {
      throw new OperatorRequestFailed(
        `controller ${functionName} throttled the ${request.action} ${OPERATOR_INVOKE_ATTEMPTS} times ` +
          `(TooManyRequestsException); nothing was submitted, try again. ${ENV.controllerFunction} must be the ` +
          "stack's OperatorFunctionName output, whose concurrency the scheduled controller never uses",
      );
    }
    throw error;
  } finally {
    lambda.destroy();
  }
}

async function runInProcess(request: OperatorRequest): Promise<OperatorResponse> {
  const logger = new Logger({
    serviceName: "shardguard-cli",
    logLevel: (process.env.SHARDGUARD_LOG_LEVEL ?? "WARN") as "WARN",
  });
  const runtime = createControllerRuntime(process.env, {
    log: powertoolsLogger(logger),
    metrics: discardMetrics,
  });
  try {
    return await handleOperatorRequest(runtime.deps, request);
  } finally {
    runtime.destroy();
  }
}

function report(
  request: OperatorRequest,
  response: OperatorResponse | undefined,
  json: boolean | undefined,
): void {
  if (!response) {
    process.stdout.write(
      json
        ? `${JSON.stringify({ ok: true, submitted: true, ...request })}\n`
        : `${request.action} of shard ${request.shard} submitted; follow it with: shardguard status --shard ${request.shard} --watch\n`,
    );
    return;
  }
  if (json) process.stdout.write(`${JSON.stringify(response)}\n`);
  if (!response.ok)
    throw new OperatorRequestFailed(`${request.action} of shard ${request.shard}: ${response.reason}`);
  if (!json) {
    const where = response.primary ? `; primary ${response.primary}` : "";
    process.stdout.write(
      `${request.action} of shard ${request.shard}: ${response.reason} (epoch ${response.epoch ?? "-"}${where})\n`,
    );
  }
}

function withTarget(command: Command): Command {
  return command
    .option(
      "--function <name>",
      `controller Lambda to invoke (default: $${ENV.controllerFunction}; none: in-process)`,
    )
    .option("--json", "machine-readable result");
}

export function registerOperatorActions(program: Command): void {
  withTarget(
    program
      .command("switchover")
      .description(
        "planned switchover with no acknowledged-write loss: hold writes on the primary, wait until the " +
          "target caught up, promote it through the lock/epoch/command path",
      )
      .requiredOption("--shard <id>", "the shard")
      .option("--to <node>", "the replica to promote (default: the best eligible one)")
      .option("--reason <text>", "recorded in the history")
      .option("--wait", "with --function: wait for the result (in-process always waits)"),
  ).action(async (options: ActionOptions) => {
    const request: OperatorRequest = {
      action: "switchover",
      shard: options.shard,
      to: options.to,
      reason: options.reason,
    };
    report(request, await submit(request, { ...options, wait: options.wait === true }), options.json);
  });

  withTarget(
    program
      .command("recover")
      .description(
        "bring an offline shard that no node can take over automatically (no node continues its lineage) " +
          "back on the node whose data to keep; the other nodes resync from it (their data is given up)",
      )
      .requiredOption("--shard <id>", "the shard")
      .requiredOption("--to <node>", "the node whose data to keep")
      .requiredOption("--reason <text>", "why (recorded in the log and the topology change)"),
  ).action(async (options: ActionOptions) => {
    const request: OperatorRequest = {
      action: "recover",
      shard: options.shard,
      to: options.to,
      reason: options.reason,
    };
    report(request, await submit(request, { ...options, wait: true }), options.json);
  });

  for (const action of ["drain", "undrain"] as const) {
    withTarget(
      program
        .command(action)
        .description(
          action === "drain"
            ? "node maintenance: exclude a node from promotion until undrain (it keeps replicating and may be " +
                "restarted); a primary is switched over away from first, with no acknowledged-write loss"
            : "end a node's maintenance: it may be promoted again",
        )
        .requiredOption("--shard <id>", "the shard")
        .requiredOption("--node <id>", "the node")
        .option(
          "--wait",
          action === "drain"
            ? "then wait until the node is a replica in sync with the primary (safe to restart)"
            : "then wait until the node is a replica in sync with the primary",
        ),
    ).action(async (options: ActionOptions) => {
      const request: OperatorRequest = { action, shard: options.shard, node: options.node };
      const response = await submit(request, { ...options, wait: true });
      report(request, response, options.json);
      if (options.wait === true && response?.ok) await waitInSync(options.shard, options.node as string);
    });
  }

  for (const action of ["pause", "resume"] as const) {
    withTarget(
      program
        .command(action)
        .description(
          action === "pause"
            ? "maintenance mode: the controller takes no automatic action on the shard until resume"
            : "end maintenance mode: automatic failover applies again",
        )
        .requiredOption("--shard <id>", "the shard")
        .option("--reason <text>", "why (shown by status and recorded)"),
    ).action(async (options: ActionOptions) => {
      const request: OperatorRequest = { action, shard: options.shard, reason: options.reason };
      report(request, await submit(request, { ...options, wait: true }), options.json);
    });
  }
}

/** How long `drain --wait` waits for the node to follow the primary with its link up. */
export const DRAIN_WAIT_MS = 120_000;

/** Waits until `node` is a replica of the topology's primary with its link up and caught up to its last report. */
async function waitInSync(shard: string, node: string): Promise<void> {
  await withOperatorSession(async ({ aws }) => {
    const deadline = Date.now() + DRAIN_WAIT_MS;
    for (;;) {
      const snapshot = await aws.store.heartbeats.snapshot(shard);
      const primary = snapshot.topology?.primary_node_id;
      const heartbeat = snapshot.nodes.find((candidate) => candidate.node_id === node);
      const primaryBeat = snapshot.nodes.find((candidate) => candidate.node_id === primary);
      if (
        heartbeat?.role === "replica" &&
        heartbeat.primary_node_id === primary &&
        heartbeat.primary_link === "up" &&
        snapshot.topology?.status !== "failing_over" &&
        (primaryBeat === undefined || heartbeat.repl_id === primaryBeat.repl_id)
      ) {
        process.stderr.write(`shardguard: ${node} follows ${primary} with its link up\n`);
        return;
      }
      if (Date.now() > deadline) {
        throw new OperatorRequestFailed(
          `${node} does not follow the primary ${primary ?? "(none)"} with its link up after ${DRAIN_WAIT_MS} ms (role ${heartbeat?.role ?? "unknown"}, link ${heartbeat?.primary_link ?? "unknown"})`,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  });
}
