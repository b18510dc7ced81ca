import {
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  DeleteMessageCommand,
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  type Message,
  ReceiveMessageCommand,
  SendMessageCommand,
  type SQSClient,
} from "@aws-sdk/client-sqs";
import { describeIssues } from "../core/config.ts";
import { ConfigurationError, CoordinationUnavailable } from "../core/errors.ts";
import { type Command, commandSchema } from "../core/model.ts";
import type { Logger } from "../core/observability.ts";
import type { CommandBus, ReceivedCommand } from "../core/ports.ts";
import { classifyAwsError, toCoordinationError } from "./aws-errors.ts";
import { stderrLogger } from "./observability.ts";
import { queueNames, validateQueuePrefix } from "./queue-names.ts";

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
/** Dead-lettered commands are kept for the longest SQS allows, for inspection. */
const DLQ_RETENTION_SECONDS = 14 * 86_400;
/** Slack on top of a long poll before the HTTP request is considered hung. */
const LONG_POLL_SLACK_MS = 5000;

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

  /** Idempotent: an existing queue costs one GetQueueUrl, then the URL is cached. */
  async ensureQueue(shard: string, nodeId: string): Promise<string> {
    return this.#url(shard, nodeId, true);
  }

  /**
   * Sends to the node's queue. It does not create a missing queue: the node's agent creates it
   * when it starts, before its first heartbeat, so the controller needs only GetQueueUrl and
   * SendMessage. A missing queue throws CoordinationUnavailable.
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
    let error: string | undefined;
    let command: Command | undefined;
    let json: unknown;
    try {
      json = JSON.parse(body);
    } catch (cause) {
      error = `body: not JSON (${cause instanceof Error ? cause.message : String(cause)})`;
    }
    if (error === undefined) {
      const parsed = commandSchema.safeParse(json);
      if (parsed.success) command = parsed.data;
      else error = describeIssues(parsed.error);
    }
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
      url = this.#lookUp(names.queue).then((found) => {
        if (found) return found;
        if (create) return this.#create(names.queue, names.deadLetterQueue);
        throw new CoordinationUnavailable(
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

  async #create(queueName: string, deadLetterQueueName: string): Promise<string> {
    const sse: Record<string, string> = this.#managedSse ? { SqsManagedSseEnabled: "true" } : {};
    try {
      const dlqUrl = await this.#sharedDeadLetterQueue(deadLetterQueueName, {
        MessageRetentionPeriod: String(DLQ_RETENTION_SECONDS),
        ...sse,
      });
      const attributes = await this.#sqs.send(
        new GetQueueAttributesCommand({ QueueUrl: dlqUrl, AttributeNames: ["QueueArn"] }),
      );
      const deadLetterTargetArn = attributes.Attributes?.QueueArn;
      if (!deadLetterTargetArn)
        throw new CoordinationUnavailable(`SQS returned no ARN for ${deadLetterQueueName}`);
      const queue = await this.#sqs.send(
        new CreateQueueCommand({
          QueueName: queueName,
          Attributes: {
            VisibilityTimeout: String(this.#visibilityTimeoutSeconds),
            MessageRetentionPeriod: String(this.#retentionSeconds),
            RedrivePolicy: JSON.stringify({ deadLetterTargetArn, maxReceiveCount: this.#maxReceiveCount }),
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

  async #call<T>(operation: string, shard: string, nodeId: string, send: () => Promise<T>): Promise<T> {
    try {
      return await send();
    } catch (error) {
      // The queue was deleted under us: forget its URL so the next call looks it up (or creates it) again.
      if (classifyAwsError(error) === "missing_resource") this.#urls.delete(`${shard}/${nodeId}`);
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
