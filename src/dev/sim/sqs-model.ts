import { type AwsTransport, callAws } from "./dynamo-model.ts";
import type { Scheduler } from "./scheduler.ts";

/**
 * A model of SQS standard queues at the level the SDK speaks, for the REAL command bus and wake
 * queue adapters (src/adapters/sqs-command-bus.ts, sqs-wake-queue.ts): long polls that answer as
 * soon as a message is visible, visibility timeouts and redelivery, ApproximateReceiveCount, a
 * redrive policy to the dead-letter queue, ChangeMessageVisibility, deletes by receipt handle.
 * Standard-queue liberties, drawn from the seed: a message delivered twice (`duplicate`), later
 * than sent (`delayMs`), and receives in shuffled order.
 */

interface Message {
  readonly id: string;
  readonly body: string;
  visibleAt: number;
  receiveCount: number;
  handle: string;
}

interface Queue {
  readonly name: string;
  readonly url: string;
  attributes: Record<string, string>;
  messages: Message[];
  waiters: Set<() => void>;
}

export interface SqsFaults {
  /** Probability that a received message stays visible to a second receive (at-least-once). */
  duplicate?: number;
  /** Extra ms before a sent message becomes visible, drawn up to this. */
  delayMs?: number;
  /**
   * Probability that a sent message is delivered once more much later (at-least-once: a copy
   * stored on a server that was down, a redelivery after a lost delete), `lateMs` after it was
   * sent: after newer messages, after the epoch that sent it has passed.
   */
  late?: number;
  /** [min, max] ms after sending that the late copy becomes visible. */
  lateMs?: readonly [number, number];
}

export class SqsService {
  readonly queues = new Map<string, Queue>();
  readonly #sched: Scheduler;
  faults: SqsFaults = {};
  #ids = 0;

  constructor(sched: Scheduler) {
    this.#sched = sched;
  }

  #queue(url: unknown): Queue {
    const queue = [...this.queues.values()].find((q) => q.url === url);
    if (!queue)
      throw Object.assign(new Error("The specified queue does not exist."), {
        name: "QueueDoesNotExist",
        $metadata: { httpStatusCode: 400 },
      });
    return queue;
  }

  #wake(queue: Queue): void {
    for (const waiter of [...queue.waiters]) waiter();
  }

  #visible(queue: Queue): Message[] {
    const now = this.#sched.now;
    return queue.messages.filter((message) => message.visibleAt <= now);
  }

  #send(queue: Queue, body: string): string {
    const delay = this.faults.delayMs ? this.#sched.random.next() * this.faults.delayMs : 0;
    const id = `m-${++this.#ids}`;
    queue.messages.push({ id, body, visibleAt: this.#sched.now + delay, receiveCount: 0, handle: "" });
    if (delay > 0) this.#sched.schedule(delay, () => this.#wake(queue), "aws/service");
    else this.#wake(queue);
    if (this.faults.late !== undefined && this.#sched.random.chance(this.faults.late)) {
      const [min, max] = this.faults.lateMs ?? [5000, 60_000];
      const lateMs = this.#sched.random.int(min, max);
      const copy = {
        id: `${id}-late`,
        body,
        visibleAt: this.#sched.now + lateMs,
        receiveCount: 0,
        handle: "",
      };
      queue.messages.push(copy);
      this.#sched.schedule(lateMs, () => this.#wake(queue), "aws/service");
    }
    return id;
  }

  /** Serves one request; `reply` may come later (a long poll). */
  serve(
    name: string,
    input: Record<string, unknown>,
    reply: (result: { value?: unknown; error?: unknown }) => void,
  ): void {
    try {
      switch (name) {
        case "CreateQueueCommand": {
          const queueName = String(input.QueueName);
          let queue = this.queues.get(queueName);
          if (!queue) {
            queue = {
              name: queueName,
              url: `https://sqs.sim/000000000000/${queueName}`,
              attributes: {
                ...((input.Attributes ?? {}) as Record<string, string>),
                QueueArn: `arn:aws:sqs:sim:000000000000:${queueName}`,
              },
              messages: [],
              waiters: new Set(),
            };
            this.queues.set(queueName, queue);
          }
          reply({ value: { QueueUrl: queue.url } });
          return;
        }
        case "GetQueueUrlCommand": {
          const queue = this.queues.get(String(input.QueueName));
          if (!queue) {
            reply({ error: this.#missing() });
            return;
          }
          reply({ value: { QueueUrl: queue.url } });
          return;
        }
        case "GetQueueAttributesCommand":
          reply({ value: { Attributes: { ...this.#queue(input.QueueUrl).attributes } } });
          return;
        case "SetQueueAttributesCommand": {
          const queue = this.#queue(input.QueueUrl);
          queue.attributes = { ...queue.attributes, ...((input.Attributes ?? {}) as Record<string, string>) };
          reply({ value: {} });
          return;
        }
        case "SendMessageCommand":
          reply({ value: { MessageId: this.#send(this.#queue(input.QueueUrl), String(input.MessageBody)) } });
          return;
        case "DeleteMessageCommand": {
          const queue = this.#queue(input.QueueUrl);
          queue.messages = queue.messages.filter((message) => message.handle !== input.ReceiptHandle);
          reply({ value: {} });
          return;
        }
        case "DeleteMessageBatchCommand": {
          const queue = this.#queue(input.QueueUrl);
          const entries = (input.Entries ?? []) as Array<{ Id: string; ReceiptHandle: string }>;
          const handles = new Set(entries.map((entry) => entry.ReceiptHandle));
          queue.messages = queue.messages.filter((message) => !handles.has(message.handle));
          reply({ value: { Successful: entries.map((entry) => ({ Id: entry.Id })), Failed: [] } });
          return;
        }
        case "ChangeMessageVisibilityCommand": {
          const queue = this.#queue(input.QueueUrl);
          const message = queue.messages.find((m) => m.handle === input.ReceiptHandle);
          if (message) {
            const seconds = Number(input.VisibilityTimeout);
            message.visibleAt = this.#sched.now + seconds * 1000;
            this.#sched.schedule(seconds * 1000, () => this.#wake(queue), "aws/service");
          }
          reply({ value: {} });
          return;
        }
        case "ReceiveMessageCommand":
          this.#receive(input, reply);
          return;
        default:
          reply({
            error: Object.assign(new Error(`the model does not serve ${name}`), { name: "InvalidAction" }),
          });
          return;
      }
    } catch (error) {
      reply({ error });
    }
  }

  #missing(): Error {
    return Object.assign(new Error("The specified queue does not exist."), {
      name: "QueueDoesNotExist",
      $metadata: { httpStatusCode: 400 },
    });
  }

  #receive(
    input: Record<string, unknown>,
    reply: (result: { value?: unknown; error?: unknown }) => void,
  ): void {
    const queue = this.#queue(input.QueueUrl);
    const max = Number(input.MaxNumberOfMessages ?? 1);
    const waitMs = Number(input.WaitTimeSeconds ?? 0) * 1000;
    let timer: ReturnType<Scheduler["schedule"]> | undefined;
    const attempt = (final: boolean): boolean => {
      const visible = this.#visible(queue);
      if (visible.length === 0 && !final) return false;
      queue.waiters.delete(onWake);
      this.#sched.cancel(timer);
      reply({ value: { Messages: this.#take(queue, visible, max) } });
      return true;
    };
    const onWake = () => attempt(false);
    if (attempt(waitMs === 0)) return;
    queue.waiters.add(onWake);
    timer = this.#sched.schedule(waitMs, () => attempt(true), "aws/service");
  }

  #take(queue: Queue, visible: Message[], max: number): unknown[] {
    const random = this.#sched.random;
    const chosen = [...visible].sort(() => random.next() - 0.5).slice(0, max);
    const visibilityMs = Number(queue.attributes.VisibilityTimeout ?? 30) * 1000;
    const redrive = queue.attributes.RedrivePolicy
      ? (JSON.parse(queue.attributes.RedrivePolicy) as {
          maxReceiveCount?: number;
          deadLetterTargetArn?: string;
        })
      : undefined;
    const out: unknown[] = [];
    for (const message of chosen) {
      if (redrive?.maxReceiveCount !== undefined && message.receiveCount >= redrive.maxReceiveCount) {
        queue.messages = queue.messages.filter((m) => m !== message);
        const dlq = [...this.queues.values()].find(
          (q) => q.attributes.QueueArn === redrive.deadLetterTargetArn,
        );
        if (dlq) this.#send(dlq, message.body);
        continue;
      }
      message.receiveCount++;
      message.handle = `rh-${message.id}-${message.receiveCount}`;
      const duplicate = this.faults.duplicate !== undefined && random.chance(this.faults.duplicate);
      message.visibleAt = this.#sched.now + (duplicate ? 0 : visibilityMs);
      if (!duplicate) this.#sched.schedule(visibilityMs, () => this.#wake(queue), "aws/service");
      out.push({
        MessageId: message.id,
        ReceiptHandle: message.handle,
        Body: message.body,
        Attributes: { ApproximateReceiveCount: String(message.receiveCount) },
      });
    }
    return out;
  }
}

/** The SQSClient of one calling process. */
export class SimSqsClient {
  readonly #service: SqsService;
  readonly #transport: AwsTransport;

  constructor(transport: AwsTransport, service: SqsService) {
    this.#transport = transport;
    this.#service = service;
  }

  send(
    command: { constructor: { name: string }; input: unknown },
    options?: { abortSignal?: AbortSignal; requestTimeout?: number },
  ): Promise<never> {
    const name = command.constructor.name;
    const input = command.input as Record<string, unknown>;
    const timeout =
      options?.requestTimeout ??
      (name === "ReceiveMessageCommand" ? Number(input.WaitTimeSeconds ?? 0) * 1000 + 5000 : undefined);
    return callAws(
      this.#transport,
      options?.abortSignal,
      (reply) => this.#service.serve(name, input, reply),
      undefined,
      undefined,
      timeout,
    ) as Promise<never>;
  }

  destroy(): void {}
}
