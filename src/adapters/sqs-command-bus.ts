import {
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  type Message,
  ReceiveMessageCommand,
  SendMessageCommand,
  SetQueueAttributesCommand,
  type SQSClient,
} from "@aws-sdk/client-sqs";
import { describeIssues } from "../core/config.ts";
import { ConfigurationError, CoordinationUnavailable, QueueMissing } from "../core/errors.ts";
import { type Command, commandSchema } from "../core/model.ts";
import type { Logger } from "../core/observability.ts";
import type { CommandBus, QueueAccess, ReceivedCommand } from "../core/ports.ts";
import { classifyAwsError, toCoordinationError } from "./aws-errors.ts";
import { stderrLogger } from "./observability.ts";
import { checkCommandSenders, queueNames, validateQueuePrefix } from "./queue-names.ts";

export interface SqsCommandBusOptions {
  readonly sqs: SQSClient;
  /** Queue names are `<prefix>_<shard>_<node>`; the shared dead-letter queue is `<prefix>_dlq`. */
  readonly queuePrefix: string;
  /** Receives before an unparseable command moves to the dead-letter queue. @default 3 */
  readonly maxReceiveCount?: number;
  /**
   * Seconds a received command stays invisible to other receivers. Short, because a command handed
   * to a long poll whose client went away (an aborted receive, a crashed agent) waits this long.
   * `redeliverAfter` sets it anew for one received command. @default 10
   */
  readonly visibilityTimeoutSeconds?: number;
  /** Seconds a command is kept in the node's queue (stale commands are ignored by epoch anyway). @default 86400 */
  readonly messageRetentionSeconds?: number;
  /** SQS-managed server-side encryption. @default true */
  readonly managedSse?: boolean;
  readonly logger?: Logger;
}

const MAX_WAIT_SECONDS = 20;

/** Statements of a queue policy that this bus writes, and replaces; other statements are kept. */
const SID_PREFIX = "Shardguard";
/**
 * The policy of a command queue (or of the shared dead-letter queue, with no senders): AWS's
 * baseline for SQS (issue 38, docs/security.md#commands).
 * - `ShardguardDenyInsecureTransport`: every request without TLS is denied, as on the stack's own
 *   queues (`enforceSSL`).
 * - `ShardguardOnlyCommandSenders`, when `senders` are known: `sqs:SendMessage` is denied to every
 *   principal whose `aws:PrincipalArn` is not one of them (`ArnNotLike`, so a request without a
 *   principal is denied too). An identity policy's broad `sqs:SendMessage` in the account then no
 *   longer reaches a node's queue.
 * Statements of `existing` whose Sid does not start with "Shardguard" (an operator's own) are kept.
 */
export function commandQueuePolicy(
  queueArn: string,
  access: QueueAccess = {},
  existing?: string,
): Record<string, unknown> {
  const senders = access.senders ?? [];
  const problem = checkCommandSenders(senders);
  if (problem) throw new ConfigurationError(`command senders: ${problem}`);
  const ours: Record<string, unknown>[] = [
    {
      Sid: `${SID_PREFIX}DenyInsecureTransport`,
      Effect: "Deny",
      Principal: { AWS: "*" },
      Action: "sqs:*",
      Resource: queueArn,
      Condition: { Bool: { "aws:SecureTransport": "false" } },
    },
  ];
  if (senders.length > 0) {
    ours.push({
      Sid: `${SID_PREFIX}OnlyCommandSenders`,
      Effect: "Deny",
      Principal: { AWS: "*" },
      Action: "sqs:SendMessage",
      Resource: queueArn,
      Condition: { ArnNotLike: { "aws:PrincipalArn": [...senders] } },
    });
  }
  const kept = foreignStatements(existing);
  return { Version: "2012-10-17", Statement: [...kept, ...ours] };
}

/** The statements of a stored policy that this bus did not write; none when it is absent or unreadable. */
function foreignStatements(policy: string | undefined): Record<string, unknown>[] {
  if (!policy) return [];
  try {
    const statements = (JSON.parse(policy) as { Statement?: unknown }).Statement;
    const list = Array.isArray(statements) ? statements : statements ? [statements] : [];
    return list.filter(
      (statement): statement is Record<string, unknown> =>
        typeof statement === "object" &&
        statement !== null &&
        !String((statement as { Sid?: unknown }).Sid ?? "").startsWith(SID_PREFIX),
    );
  } catch {
    return [];
  }
}

/** Whether two policies say the same, whatever the key order or spacing SQS hands back. */
function samePolicy(stored: string | undefined, wanted: Record<string, unknown>): boolean {
  if (!stored) return false;
  try {
    return canonical(JSON.parse(stored)) === canonical(wanted);
  } catch {
    return false;
  }
}

function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : 1));
    return `{${entries.map(([key, item]) => `${JSON.stringify(key)}:${canonical(item)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}
/** Dead-lettered commands are kept for the longest SQS allows, for inspection. */
const DLQ_RETENTION_SECONDS = 14 * 86_400;
/** Slack on top of a long poll before the HTTP request is considered hung. */
const LONG_POLL_SLACK_MS = 5000;

/**
 * A message body as the agent reads it: JSON, then `commandSchema`. Never throws: what fails is
 * returned as `error` ("body: not JSON (…)" or "field: reason; …").
 */
export function parseCommandBody(body: string): { command?: Command; error?: string } {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch (cause) {
    return { error: `body: not JSON (${cause instanceof Error ? cause.message : String(cause)})` };
  }
  const parsed = commandSchema.safeParse(json);
  return parsed.success ? { command: parsed.data } : { error: describeIssues(parsed.error) };
}

/**
 * The command bus on one SQS queue per node, each with its dead-letter queue. Queue URLs are
 * cached; every body is parsed with `commandSchema` on receipt. A body that fails is returned with
 * `error`, made visible again at once and never deleted, so SQS moves it to the dead-letter queue
 * after `maxReceiveCount` receives while the consumer goes on receiving good ones.
 */
export class SqsCommandBus implements CommandBus {
  readonly #sqs: SQSClient;
  readonly #prefix: string;
  readonly #maxReceiveCount: number;
  readonly #visibilityTimeoutSeconds: number;
  readonly #retentionSeconds: number;
  readonly #managedSse: boolean;
  readonly #logger: Logger;
  /** `<shard>/<node>` -> queue URL (a promise, so concurrent first calls create once). */
  readonly #urls = new Map<string, Promise<string>>();
  /** `<shard>/<node>` -> who may send, as the node's agent said: a queue created again gets it too. */
  readonly #access = new Map<string, QueueAccess>();

  constructor(options: SqsCommandBusOptions) {
    validateQueuePrefix(options.queuePrefix);
    const maxReceiveCount = options.maxReceiveCount ?? 3;
    if (!Number.isInteger(maxReceiveCount) || maxReceiveCount < 1 || maxReceiveCount > 1000) {
      throw new ConfigurationError(
        `maxReceiveCount must be an integer from 1 to 1000, got ${maxReceiveCount}`,
      );
    }
    const visibility = options.visibilityTimeoutSeconds ?? 10;
    if (!Number.isInteger(visibility) || visibility < 0 || visibility > 43_200) {
      throw new ConfigurationError(
        `visibility timeout must be an integer from 0 to 43200 s, got ${visibility}`,
      );
    }
    this.#sqs = options.sqs;
    this.#prefix = options.queuePrefix;
    this.#maxReceiveCount = maxReceiveCount;
    this.#visibilityTimeoutSeconds = visibility;
    this.#retentionSeconds = options.messageRetentionSeconds ?? 86_400;
    this.#managedSse = options.managedSse ?? true;
    this.#logger = options.logger ?? stderrLogger;
  }

  /**
   * Idempotent: creates the queue (and the shared dead-letter queue) with its policy
   * (`commandQueuePolicy`), or finds it and brings its policy and the dead-letter queue's up to date
   * (SetQueueAttributes, only when they differ: an upgrade, other senders). A policy that cannot be
   * written is logged as an error and the queue is used all the same: commands keep flowing while
   * an IAM grant is missing. Then the URL is cached.
   */
  async ensureQueue(shard: string, nodeId: string, access?: QueueAccess): Promise<string> {
    if (access !== undefined) {
      const problem = checkCommandSenders(access.senders ?? []);
      if (problem) throw new ConfigurationError(`command senders: ${problem}`);
      this.#access.set(`${shard}/${nodeId}`, access);
    }
    return this.#url(shard, nodeId, true);
  }

  /**
   * Sends to the node's queue. It does not create a missing queue: the node's agent creates it
   * when it starts, before its first heartbeat, so the controller needs only GetQueueUrl and
   * SendMessage. A missing queue throws QueueMissing (a CoordinationUnavailable).
   */
  async send(shard: string, nodeId: string, command: Command): Promise<void> {
    const parsed = commandSchema.safeParse(command);
    if (!parsed.success) {
      throw new ConfigurationError(`refusing to send an invalid command: ${describeIssues(parsed.error)}`);
    }
    const url = await this.#url(shard, nodeId, false);
    await this.#call(`SendMessage (${command.type} to ${shard}/${nodeId})`, shard, nodeId, () =>
      this.#sqs.send(new SendMessageCommand({ QueueUrl: url, MessageBody: JSON.stringify(parsed.data) })),
    );
  }

  async receive(
    shard: string,
    nodeId: string,
    options: { signal?: AbortSignal; waitSeconds?: number; maxMessages?: number } = {},
  ): Promise<ReceivedCommand[]> {
    const { signal } = options;
    const requested = options.waitSeconds ?? MAX_WAIT_SECONDS;
    const waitSeconds = Number.isFinite(requested)
      ? Math.min(Math.max(Math.floor(requested), 0), MAX_WAIT_SECONDS)
      : MAX_WAIT_SECONDS;
    if (signal?.aborted) return [];
    const url = await this.ensureQueue(shard, nodeId);
    if (signal?.aborted) return [];
    let messages: Message[];
    try {
      const out = await this.#call(`ReceiveMessage (${shard}/${nodeId})`, shard, nodeId, () =>
        this.#sqs.send(
          new ReceiveMessageCommand({
            QueueUrl: url,
            WaitTimeSeconds: waitSeconds,
            MaxNumberOfMessages: Math.min(Math.max(options.maxMessages ?? 10, 1), 10),
            MessageSystemAttributeNames: ["ApproximateReceiveCount"],
          }),
          { abortSignal: signal, requestTimeout: waitSeconds * 1000 + LONG_POLL_SLACK_MS },
        ),
      );
      messages = out.Messages ?? [];
    } catch (error) {
      // An abort is the caller stopping, not the bus failing.
      if (signal?.aborted) return [];
      throw error;
    }
    const received: ReceivedCommand[] = [];
    for (const message of messages) {
      if (!message.ReceiptHandle) continue;
      received.push(await this.#parse(shard, nodeId, url, message, message.ReceiptHandle));
    }
    return received;
  }

  /** Deletes a command after it took effect. */
  async delete(shard: string, nodeId: string, message: ReceivedCommand): Promise<void> {
    const url = await this.#url(shard, nodeId, false);
    await this.#call(`DeleteMessage (${shard}/${nodeId})`, shard, nodeId, () =>
      this.#sqs.send(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: message.receiptHandle })),
    );
  }

  /** When `message` becomes visible again: `seconds` from now (ChangeMessageVisibility); 0 = now. */
  async redeliverAfter(
    shard: string,
    nodeId: string,
    message: ReceivedCommand,
    seconds: number,
  ): Promise<void> {
    if (!Number.isInteger(seconds) || seconds < 0 || seconds > 43_200) {
      throw new ConfigurationError(`visibility timeout must be 0-43200 s, got ${seconds}`);
    }
    const url = await this.#url(shard, nodeId, false);
    await this.#call(`ChangeMessageVisibility (${shard}/${nodeId})`, shard, nodeId, () =>
      this.#sqs.send(
        new ChangeMessageVisibilityCommand({
          QueueUrl: url,
          ReceiptHandle: message.receiptHandle,
          VisibilityTimeout: seconds,
        }),
      ),
    );
  }

  async #parse(
    shard: string,
    nodeId: string,
    url: string,
    message: Message,
    receiptHandle: string,
  ): Promise<ReceivedCommand> {
    const body = message.Body ?? "";
    const receiveCount = Number(message.Attributes?.ApproximateReceiveCount ?? "1") || 1;
    const { command, error } = parseCommandBody(body);
    if (error !== undefined) {
      this.#logger.warn("malformed command left for the dead-letter queue", {
        shard,
        node: nodeId,
        messageId: message.MessageId,
        receiveCount,
        maxReceiveCount: this.#maxReceiveCount,
        error,
      });
      // Visible again at once: it is received again until SQS moves it to the dead-letter queue.
      await this.#sqs
        .send(
          new ChangeMessageVisibilityCommand({
            QueueUrl: url,
            ReceiptHandle: receiptHandle,
            VisibilityTimeout: 0,
          }),
        )
        .catch((cause: unknown) =>
          this.#logger.warn(
            "could not make a malformed command visible again; it returns after its visibility timeout",
            {
              shard,
              node: nodeId,
              messageId: message.MessageId,
              error: cause instanceof Error ? cause.message : String(cause),
            },
          ),
        );
    }
    return { command, error, receiptHandle, receiveCount, body };
  }

  /** The queue URL from the cache, else looked up (and created when `create`); failures are not cached. */
  async #url(shard: string, nodeId: string, create: boolean): Promise<string> {
    const names = queueNames(this.#prefix, shard, nodeId);
    const key = `${shard}/${nodeId}`;
    let url = this.#urls.get(key);
    if (!url) {
      const access = this.#access.get(key) ?? {};
      url = this.#lookUp(names.queue).then(async (found) => {
        if (found) {
          if (create) await this.#updatePolicies(found, names.deadLetterQueue, access);
          return found;
        }
        if (create) return this.#create(names.queue, names.deadLetterQueue, access);
        throw new QueueMissing(
          `SQS queue ${names.queue} does not exist: the agent of node ${nodeId} (shard ${shard}) creates it when it starts`,
        );
      });
      this.#urls.set(key, url);
      url.catch(() => this.#urls.delete(key));
    }
    return url;
  }

  async #lookUp(queueName: string): Promise<string | undefined> {
    try {
      return (await this.#sqs.send(new GetQueueUrlCommand({ QueueName: queueName }))).QueueUrl;
    } catch (error) {
      if (classifyAwsError(error) === "missing_resource") return undefined;
      throw this.#mapError(error, `GetQueueUrl (${queueName})`);
    }
  }

  /**
   * The installation's dead-letter queue, created by whichever agent comes first. Agents of one
   * installation may differ in attributes (an older release, SSE off for an emulator): SQS then
   * refuses the CreateQueue (QueueAlreadyExists), and the queue that exists is the one to use.
   */
  async #sharedDeadLetterQueue(
    name: string,
    attributes: Record<string, string>,
  ): Promise<string | undefined> {
    try {
      return (await this.#sqs.send(new CreateQueueCommand({ QueueName: name, Attributes: attributes })))
        .QueueUrl;
    } catch (error) {
      const code = (error as { name?: string }).name ?? "";
      if (!/QueueAlreadyExists|QueueNameExists/.test(code)) throw error;
      return this.#lookUp(name);
    }
  }

  async #create(queueName: string, deadLetterQueueName: string, access: QueueAccess): Promise<string> {
    const sse: Record<string, string> = this.#managedSse ? { SqsManagedSseEnabled: "true" } : {};
    try {
      const dlqUrl = await this.#sharedDeadLetterQueue(deadLetterQueueName, {
        MessageRetentionPeriod: String(DLQ_RETENTION_SECONDS),
        ...sse,
      });
      if (!dlqUrl) throw new CoordinationUnavailable(`SQS returned no URL for ${deadLetterQueueName}`);
      const deadLetterTargetArn = await this.#updatePolicy(dlqUrl, deadLetterQueueName, {});
      // Same account and region as the dead-letter queue: the queue's policy is set as it is created.
      const queueArn = deadLetterTargetArn.replace(/[^:]+$/, queueName);
      const queue = await this.#sqs.send(
        new CreateQueueCommand({
          QueueName: queueName,
          Attributes: {
            VisibilityTimeout: String(this.#visibilityTimeoutSeconds),
            MessageRetentionPeriod: String(this.#retentionSeconds),
            RedrivePolicy: JSON.stringify({ deadLetterTargetArn, maxReceiveCount: this.#maxReceiveCount }),
            Policy: JSON.stringify(commandQueuePolicy(queueArn, access)),
            ...sse,
          },
        }),
      );
      if (!queue.QueueUrl) throw new CoordinationUnavailable(`SQS returned no URL for ${queueName}`);
      return queue.QueueUrl;
    } catch (error) {
      throw this.#mapError(error, `CreateQueue (${queueName})`);
    }
  }

  /** An existing queue: its policy and the shared dead-letter queue's brought up to date. */
  async #updatePolicies(queueUrl: string, deadLetterQueueName: string, access: QueueAccess): Promise<void> {
    const queueName = queueUrl.slice(queueUrl.lastIndexOf("/") + 1);
    try {
      await this.#updatePolicy(queueUrl, queueName, access);
      const dlqUrl = await this.#lookUp(deadLetterQueueName);
      if (dlqUrl) await this.#updatePolicy(dlqUrl, deadLetterQueueName, {});
    } catch (error) {
      // A refused write is logged in #updatePolicy; this is a failed read. The queue is used all the
      // same, and the next start checks again.
      this.#logger.error("could not read the command queues' policies; the queue is used as it is", {
        queue: queueName,
        error: error instanceof Error ? error.message : String(error),
      });
    }
  }

  /**
   * Reads the queue's ARN and policy, writes the policy when it differs from the one it should
   * have (SetQueueAttributes), and returns the ARN. A write SQS refuses (most likely the agent's
   * role lacks sqs:SetQueueAttributes: an upgrade whose IAM is not deployed yet) is logged as an
   * error, not thrown: the queue carries commands without its policy, as before the upgrade.
   */
  async #updatePolicy(queueUrl: string, queueName: string, access: QueueAccess): Promise<string> {
    const attributes = await this.#sqs.send(
      new GetQueueAttributesCommand({ QueueUrl: queueUrl, AttributeNames: ["QueueArn", "Policy"] }),
    );
    const arn = attributes.Attributes?.QueueArn;
    if (!arn) throw new CoordinationUnavailable(`SQS returned no ARN for ${queueName}`);
    const stored = attributes.Attributes?.Policy;
    const wanted = commandQueuePolicy(arn, access, stored);
    if (samePolicy(stored, wanted)) return arn;
    try {
      await this.#sqs.send(
        new SetQueueAttributesCommand({ QueueUrl: queueUrl, Attributes: { Policy: JSON.stringify(wanted) } }),
      );
      this.#logger.info("queue policy written", {
        queue: queueName,
        statements: (wanted.Statement as unknown[]).length,
      });
    } catch (error) {
      this.#logger.error(
        "could not write the queue's policy (TLS only, command senders); the queue works without it: grant the agent sqs:SetQueueAttributes on it",
        { queue: queueName, error: error instanceof Error ? error.message : String(error) },
      );
    }
    return arn;
  }

  async #call<T>(operation: string, shard: string, nodeId: string, send: () => Promise<T>): Promise<T> {
    try {
      return await send();
    } catch (error) {
      // The queue was deleted under us: forget its URL so the next call looks it up (or creates it) again.
      if (classifyAwsError(error) === "missing_resource") {
        this.#urls.delete(`${shard}/${nodeId}`);
        throw new QueueMissing(
          `SQS ${operation}: the queue of node ${nodeId} (shard ${shard}) no longer exists (its agent re-creates it when it runs; a decommissioned node has none)`,
          { cause: error },
        );
      }
      throw this.#mapError(error, operation);
    }
  }

  #mapError(error: unknown, operation: string): unknown {
    if (error instanceof CoordinationUnavailable) return error;
    return toCoordinationError(error, {
      operation: `SQS ${operation}`,
      missingHint: "the queue is re-created on the next call",
    });
  }
}
