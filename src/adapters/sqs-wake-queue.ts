import {
  CreateQueueCommand,
  DeleteMessageBatchCommand,
  GetQueueUrlCommand,
  ReceiveMessageCommand,
  SendMessageCommand,
  type SQSClient,
} from "@aws-sdk/client-sqs";
import { errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import { type Wake, type WakeReceiver, type WakeSender, wakeSchema } from "../core/wake.ts";
import { toCoordinationError } from "./aws-errors.ts";
import { QUEUE_NAME_SEPARATOR, validateQueuePrefix } from "./queue-names.ts";

/** `<prefix>_wake`: node queues are `<prefix>_<shard>_<node>`, so the names never collide. */
export function wakeQueueName(prefix: string): string {
  validateQueuePrefix(prefix);
  return `${prefix}${QUEUE_NAME_SEPARATOR}wake`;
}

/** A wake-up older than this is useless: the periodic scan has run since. */
const RETENTION_SECONDS = 60;
/** Slack on top of a long poll before the HTTP request is considered hung. */
const LONG_POLL_SLACK_MS = 5000;
/** How long a sender that found no queue waits before it asks again. */
const MISSING_RETRY_MS = 30_000;

export interface SqsWakeQueueOptions {
  readonly sqs: SQSClient;
  readonly queuePrefix: string;
  /** Create the queue when missing (the local controller); agents and the Lambda only look it up. @default false */
  readonly create?: boolean;
  readonly logger?: Logger;
}

/**
 * The controller's wake-up queue on SQS: agents send, the local controller long-polls it, and in
 * Lambda mode an SQS event source mapping invokes the controller with its messages (CDK). A wake-up
 * is a hint: send never throws, receive deletes what it got at once.
 */
export class SqsWakeQueue implements WakeSender, WakeReceiver {
  readonly #sqs: SQSClient;
  readonly #name: string;
  readonly #create: boolean;
  readonly #logger: Logger | undefined;
  #url: Promise<string> | undefined;
  #missingUntil = 0;

  constructor(options: SqsWakeQueueOptions) {
    this.#sqs = options.sqs;
    this.#name = wakeQueueName(options.queuePrefix);
    this.#create = options.create ?? false;
    this.#logger = options.logger;
  }

  get name(): string {
    return this.#name;
  }

  #queueUrl(): Promise<string> {
    this.#url ??= (async () => {
      if (this.#create) {
        const created = await this.#sqs.send(
          new CreateQueueCommand({
            QueueName: this.#name,
            Attributes: { MessageRetentionPeriod: String(RETENTION_SECONDS), SqsManagedSseEnabled: "true" },
          }),
        );
        if (created.QueueUrl) return created.QueueUrl;
      }
      const found = await this.#sqs.send(new GetQueueUrlCommand({ QueueName: this.#name }));
      if (!found.QueueUrl) throw new Error(`no URL for queue ${this.#name}`);
      return found.QueueUrl;
    })();
    this.#url.catch(() => {
      this.#url = undefined;
    });
    return this.#url;
  }

  async send(wake: Wake): Promise<boolean> {
    if (Date.now() < this.#missingUntil) return false;
    try {
      const url = await this.#queueUrl();
      await this.#sqs.send(new SendMessageCommand({ QueueUrl: url, MessageBody: JSON.stringify(wake) }));
      return true;
    } catch (error) {
      this.#missingUntil = Date.now() + MISSING_RETRY_MS;
      this.#logger?.warn(
        "controller wake-up not sent; the controller's periodic scan will see the heartbeat",
        {
          queue: this.#name,
          error: errorMessage(error),
        },
      );
      return false;
    }
  }

  async receive(waitSeconds: number, signal?: AbortSignal): Promise<Wake[]> {
    try {
      const url = await this.#queueUrl();
      const reply = await this.#sqs.send(
        new ReceiveMessageCommand({ QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: waitSeconds }),
        { abortSignal: signal, requestTimeout: waitSeconds * 1000 + LONG_POLL_SLACK_MS },
      );
      const messages = reply.Messages ?? [];
      if (messages.length > 0) {
        await this.#sqs.send(
          new DeleteMessageBatchCommand({
            QueueUrl: url,
            Entries: messages.map((message, index) => ({
              Id: String(index),
              ReceiptHandle: message.ReceiptHandle,
            })),
          }),
        );
      }
      return parseWakes(
        messages.map((message) => message.Body ?? ""),
        this.#logger,
      );
    } catch (error) {
      if (signal?.aborted) return [];
      throw toCoordinationError(error, { operation: `SQS ReceiveMessage (${this.#name})` });
    }
  }
}

/** Message bodies to wake-ups; a malformed one is reported and dropped (a hint, never retried). */
export function parseWakes(bodies: readonly string[], logger?: Logger): Wake[] {
  const wakes: Wake[] = [];
  for (const body of bodies) {
    try {
      wakes.push(wakeSchema.parse(JSON.parse(body)));
    } catch (error) {
      logger?.warn("malformed controller wake-up dropped", {
        body: body.slice(0, 200),
        error: errorMessage(error),
      });
    }
  }
  return wakes;
}
