import { appendFileSync, mkdirSync } from "node:fs";
import path from "node:path";
import type { Pluggable } from "@smithy/types";
import { SHARD_INDEX } from "../core/table.ts";

/**
 * Who makes a call: the IAM principal a component runs as in a deployment. `agent` carries its
 * identity because each node has a policy of its own; `controller` is the Lambda role (the scheduled
 * loop and the operator function share it); `operator` is the role of the CLI's read-only commands.
 */
export type AwsPrincipal =
  | { readonly component: "agent"; readonly shard: string; readonly node: string }
  | { readonly component: "controller" }
  | { readonly component: "operator" };

/** The journal's node id for an agent started without `--node-id` (it generates one; no IAM policy names it). */
export const GENERATED_NODE_ID = "(generated)";

/** One item a DynamoDB call reads or writes: the IAM action that authorizes it and its partition key. */
export interface JournalItem {
  readonly action: string;
  readonly pk?: string;
}

/**
 * One AWS request as IAM sees it: the action, the resource, and what conditions are evaluated on
 * (`dynamodb:LeadingKeys`). Written one JSON line per request by {@link AwsCallJournal}.
 */
export interface AwsCallRecord {
  readonly principal: AwsPrincipal;
  /** `dynamodb:Query`, `sqs:SendMessage`, `dynamodb:TransactWriteItems`, … */
  readonly action: string;
  readonly table?: string;
  /** A Query through a secondary index: IAM checks the index's ARN (`table/<t>/index/<name>`). */
  readonly index?: string;
  readonly queue?: string;
  readonly functionName?: string;
  readonly eventBus?: string;
  /**
   * The items of the request with the action IAM checks for each: one for a single-item call, one per
   * entry of a transaction (`ConditionCheck` → `dynamodb:ConditionCheckItem`).
   */
  readonly items: readonly JournalItem[];
  /** The table name and queue prefix the component was configured with, to map names onto a stack's. */
  readonly tableName?: string;
  readonly queuePrefix?: string;
  /** Set for calls that provision what a deployment's stack creates (the local controller's wake queue). */
  readonly provisioning?: boolean;
}

export interface AwsCallJournalOptions {
  /** Directory the journal is appended to, one file per process. */
  readonly directory: string;
  readonly principal: AwsPrincipal;
  readonly tableName?: string;
  readonly queuePrefix?: string;
  /** Names of queues whose creation is provisioning (see AwsCallRecord.provisioning). */
  readonly provisionedQueues?: readonly string[];
}

type Json = Record<string, unknown>;

const TRANSACT_ACTIONS: Record<string, string> = {
  Put: "dynamodb:PutItem",
  Update: "dynamodb:UpdateItem",
  Delete: "dynamodb:DeleteItem",
  ConditionCheck: "dynamodb:ConditionCheckItem",
  Get: "dynamodb:GetItem",
};

/**
 * Records every AWS request a component makes (`SHARDGUARD_AWS_CALL_LOG`), as the request leaves the
 * SDK, so the permissions the code needs are read from what it did rather than from what someone
 * remembered to list: the integration suite checks the journal against the synthesized IAM policies
 * (test/support/iam-check.ts), and an operator can run a component with it to audit a custom policy.
 */
export class AwsCallJournal {
  readonly #file: string;
  readonly #options: AwsCallJournalOptions;

  constructor(options: AwsCallJournalOptions) {
    this.#options = options;
    mkdirSync(options.directory, { recursive: true });
    this.#file = path.join(options.directory, `calls-${process.pid}.jsonl`);
  }

  /** Middleware for an SDK client; `service` is the IAM service prefix (`dynamodb`, `sqs`, `events`, `lambda`). */
  plugin<Input extends object, Output extends object>(service: string): Pluggable<Input, Output> {
    return {
      applyToStack: (stack) => {
        stack.add(
          (next, context) => async (args) => {
            const request = (
              args as { request?: { body?: unknown; path?: string; headers?: Record<string, string> } }
            ).request;
            // The wire operation (`DynamoDB_20120810.TransactWriteItems`), not the command class: the
            // document client's `TransactWriteCommand` is IAM's TransactWriteItems.
            const target = Object.entries(request?.headers ?? {}).find(
              ([name]) => name.toLowerCase() === "x-amz-target",
            )?.[1];
            const operation =
              target?.split(".").at(-1) ??
              (typeof context.commandName === "string"
                ? context.commandName.replace(/Command$/, "")
                : "Unknown");
            this.#append(describeRequest(service, operation, request?.body, request?.path));
            return next(args);
          },
          { step: "build", priority: "low", name: "shardguardAwsCallJournal", override: true },
        );
      },
    };
  }

  #append(described: Omit<AwsCallRecord, "principal" | "tableName" | "queuePrefix">): void {
    const { principal, tableName, queuePrefix, provisionedQueues } = this.#options;
    const provisioning =
      described.action === "sqs:CreateQueue" || described.action === "sqs:GetQueueAttributes"
        ? (provisionedQueues ?? []).includes(described.queue ?? "")
        : false;
    const record: AwsCallRecord = {
      principal,
      ...described,
      tableName,
      queuePrefix,
      ...(provisioning ? { provisioning } : {}),
    };
    appendFileSync(this.#file, `${JSON.stringify(record)}\n`);
  }
}

/** What IAM authorizes for one serialized request (JSON protocols; Lambda's REST path). */
export function describeRequest(
  service: string,
  operation: string,
  body: unknown,
  requestPath?: string,
): Omit<AwsCallRecord, "principal" | "tableName" | "queuePrefix"> {
  const action = `${service}:${operation}`;
  const input = parseBody(body);
  if (service === "dynamodb") return { action, ...dynamoResources(operation, input) };
  if (service === "sqs") {
    // SQS authorizes a batch by its single action (there is no sqs:DeleteMessageBatch permission).
    const single = action.replace(/Batch$/, "");
    const queueUrl = typeof input.QueueUrl === "string" ? input.QueueUrl : undefined;
    const queue =
      typeof input.QueueName === "string" ? input.QueueName : queueUrl?.split("/").filter(Boolean).at(-1);
    return { action: single, queue, items: [] };
  }
  if (service === "events") {
    const entries = Array.isArray(input.Entries) ? (input.Entries as Json[]) : [];
    const eventBus = entries.map((entry) => entry.EventBusName).find((name) => typeof name === "string");
    return { action, eventBus: eventBus as string | undefined, items: [] };
  }
  if (service === "lambda") {
    const match = requestPath?.match(/\/functions\/([^/]+)\//);
    return { action: action.replace(/:Invoke$/, ":InvokeFunction"), functionName: match?.[1], items: [] };
  }
  return { action, items: [] };
}

function parseBody(body: unknown): Json {
  // The SDK hands the JSON protocols' body over as a string, bytes, or an adapter object over bytes.
  const text =
    typeof body === "string"
      ? body
      : body instanceof Uint8Array
        ? new TextDecoder().decode(body)
        : body && typeof body === "object"
          ? String(body)
          : "";
  if (text.length === 0) return {};
  try {
    const parsed = JSON.parse(text);
    return parsed && typeof parsed === "object" ? (parsed as Json) : {};
  } catch {
    return {};
  }
}

function dynamoResources(
  operation: string,
  input: Json,
): { table?: string; index?: string; items: JournalItem[] } {
  const table = typeof input.TableName === "string" ? input.TableName : undefined;
  const action = `dynamodb:${operation}`;
  if (operation === "TransactWriteItems" || operation === "TransactGetItems") {
    const entries = Array.isArray(input.TransactItems) ? (input.TransactItems as Json[]) : [];
    let transactTable: string | undefined;
    const items = entries.flatMap((entry) =>
      Object.entries(entry).map(([kind, detail]) => {
        const item = detail as Json;
        transactTable ??= typeof item.TableName === "string" ? item.TableName : undefined;
        return { action: TRANSACT_ACTIONS[kind] ?? `dynamodb:${kind}`, pk: partitionKeyOf(item) };
      }),
    );
    return { table: transactTable, items };
  }
  if (operation === "Query" && typeof input.IndexName === "string") {
    // Through an index, LeadingKeys is the index's partition key: the shard index's `index_pk`.
    const pk = queriedPartition(input, SHARD_INDEX.partitionKey);
    return { table, index: input.IndexName, items: [{ action, pk }] };
  }
  if (operation === "Query") return { table, items: [{ action, pk: queriedPartition(input) }] };
  return { table, items: [{ action, pk: partitionKeyOf(input) }] };
}

function partitionKeyOf(input: Json): string | undefined {
  const key = (input.Key ?? input.Item) as Json | undefined;
  const pk = key?.pk as { S?: unknown } | undefined;
  return typeof pk?.S === "string" ? pk.S : undefined;
}

/** The `pk` value of a Query's key condition (`pk = :v` or `#n = :v` with `#n` → `pk`). */
function queriedPartition(input: Json, partitionKey = "pk"): string | undefined {
  const condition = typeof input.KeyConditionExpression === "string" ? input.KeyConditionExpression : "";
  const names = (input.ExpressionAttributeNames ?? {}) as Record<string, string>;
  const values = (input.ExpressionAttributeValues ?? {}) as Record<string, { S?: unknown }>;
  for (const match of condition.matchAll(/(#?[\w]+)\s*=\s*(:[\w]+)/g)) {
    const [, name = "", value = ""] = match;
    if ((names[name] ?? name) !== partitionKey) continue;
    const literal = values[value]?.S;
    if (typeof literal === "string") return literal;
  }
  return undefined;
}
