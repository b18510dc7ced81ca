import {
  CreateQueueCommand,
  GetQueueAttributesCommand,
  GetQueueUrlCommand,
  ReceiveMessageCommand,
  SendMessageCommand,
  type SQSClient,
} from "@aws-sdk/client-sqs";
import { afterAll, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { queueNames } from "../../src/adapters/queue-names.ts";
import { ConfigurationError, CoordinationUnavailable } from "../../src/core/errors.ts";
import type { Command } from "../../src/core/model.ts";
import type { Logger } from "../../src/core/observability.ts";
import type { ReceivedCommand } from "../../src/core/ports.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { awsEnv, uniqueName } from "../support/aws.ts";
import { holdsFor } from "../support/wait.ts";

const opened: AwsAdapters[] = [];

function adapters(options: Parameters<typeof createAwsAdapters>[0] = {}): AwsAdapters {
  const built = createAwsAdapters({ env: { ...awsEnv() }, ...options });
  opened.push(built);
  return built;
}

afterAll(() => {
  for (const built of opened) built.destroy();
});

/** A fresh prefix per test: queues of different tests never meet. */
function prefix(): string {
  return `t${Math.random().toString(36).slice(2, 10)}`;
}

function aCommand(epoch: number, overrides: Partial<Command> = {}): Command {
  return {
    type: "REPLICAOF",
    shard: "s1",
    epoch,
    command_id: uniqueName("cmd"),
    issued_at: Date.now(),
    primary: { node_id: "n1", address: "10.0.0.1:6379" },
    ...overrides,
  };
}

const silent: Logger = silentLogger;

describe("queues", () => {
  it("creates a node's queue once, with the installation's shared dead-letter queue, and returns the same URL after", async () => {
    // Prepare
    const queuePrefix = prefix();
    const { bus, clients, counter } = adapters({
      queuePrefix,
      maxReceiveCount: 4,
      visibilityTimeoutSeconds: 45,
    });
    const other = adapters({ queuePrefix }).bus;

    // Act
    const first = await bus.ensureQueue("s1", "n1");
    const again = await bus.ensureQueue("s1", "n1");
    const fromAnotherProcess = await other.ensureQueue("s1", "n1");
    const neighbour = await other.ensureQueue("s2", "n2");
    const attributes = await clients.sqs.send(
      new GetQueueAttributesCommand({ QueueUrl: first, AttributeNames: ["All"] }),
    );
    const neighbourAttributes = await clients.sqs.send(
      new GetQueueAttributesCommand({ QueueUrl: neighbour, AttributeNames: ["RedrivePolicy"] }),
    );

    // Assess
    expect(again).toBe(first);
    expect(fromAnotherProcess).toBe(first);
    expect(first).toMatch(new RegExp(`/${queuePrefix}_s1_n1$`));
    expect(counter.snapshot()["SQS.CreateQueue"]?.calls).toBe(2);
    const redrive = JSON.parse(attributes.Attributes?.RedrivePolicy ?? "{}");
    expect(redrive).toMatchObject({ maxReceiveCount: 4 });
    // One dead-letter queue for the installation (one alarm, not one a node: docs/cost.md).
    expect(redrive.deadLetterTargetArn).toMatch(new RegExp(`:${queuePrefix}_dlq$`));
    expect(JSON.parse(neighbourAttributes.Attributes?.RedrivePolicy ?? "{}").deadLetterTargetArn).toBe(
      redrive.deadLetterTargetArn,
    );
    expect(attributes.Attributes).toMatchObject({ VisibilityTimeout: "45", SqsManagedSseEnabled: "true" });
  });

  it("rejects an id that cannot make a queue name, naming it", async () => {
    const { bus } = adapters({ queuePrefix: prefix() });
    await expect(bus.ensureQueue("s1", "node.1")).rejects.toThrow(ConfigurationError);
    await expect(bus.ensureQueue("s1", "node.1")).rejects.toThrow(/node id "node.1"/);
  });
});

/** The queue's policy as SQS stores it. */
async function policyOf(sqs: SQSClient, queueUrl: string | undefined): Promise<{ Statement: unknown[] }> {
  const { Attributes } = await sqs.send(
    new GetQueueAttributesCommand({ QueueUrl: queueUrl, AttributeNames: ["Policy", "QueueArn"] }),
  );
  return JSON.parse(Attributes?.Policy ?? '{"Statement":[]}');
}

const CONTROLLER = "arn:aws:iam::123456789012:role/shardguard-controller";
const OPERATOR = "arn:aws:iam::123456789012:role/shardguard-operator";

describe("queue policies", () => {
  it("creates a node's queue with TLS required and only the named senders allowed to send, and the dead-letter queue with TLS required", async () => {
    // Prepare
    const queuePrefix = prefix();
    const { bus, clients } = adapters({ queuePrefix });

    // Act
    const url = await bus.ensureQueue("s1", "n1", { senders: [CONTROLLER, OPERATOR] });
    const queue = await policyOf(clients.sqs, url);
    const dlqUrl = (
      await clients.sqs.send(
        new GetQueueUrlCommand({ QueueName: queueNames(queuePrefix, "s1", "n1").deadLetterQueue }),
      )
    ).QueueUrl;
    const deadLetters = await policyOf(clients.sqs, dlqUrl);

    // Assess
    const tlsOnly = (queueName: string) => ({
      Sid: "ShardguardDenyInsecureTransport",
      Effect: "Deny",
      Principal: { AWS: "*" },
      Action: "sqs:*",
      Resource: expect.stringMatching(new RegExp(`^arn:aws:sqs:[^:]+:\\d+:${queueName}$`)),
      Condition: { Bool: { "aws:SecureTransport": "false" } },
    });
    expect(queue.Statement).toEqual([
      tlsOnly(`${queuePrefix}_s1_n1`),
      {
        Sid: "ShardguardOnlyCommandSenders",
        Effect: "Deny",
        Principal: { AWS: "*" },
        Action: "sqs:SendMessage",
        Resource: expect.stringMatching(new RegExp(`:${queuePrefix}_s1_n1$`)),
        Condition: { ArnNotLike: { "aws:PrincipalArn": [CONTROLLER, OPERATOR] } },
      },
    ]);
    expect(deadLetters.Statement).toEqual([tlsOnly(`${queuePrefix}_dlq`)]);
  });

  it("gives the queues of an earlier release their policy when the agent starts, once, keeping an operator's own statements", async () => {
    // Prepare: a queue and dead-letter queue as a release before issue 38 left them (no policy),
    // and an operator's statement on the queue.
    const queuePrefix = prefix();
    const { bus, clients, counter } = adapters({ queuePrefix });
    const names = queueNames(queuePrefix, "s1", "n2");
    const operators = {
      Sid: "AuditorsMayRead",
      Effect: "Allow",
      Principal: { AWS: "arn:aws:iam::123456789012:role/auditor" },
      Action: "sqs:GetQueueAttributes",
      Resource: "*",
    };
    await clients.sqs.send(new CreateQueueCommand({ QueueName: names.deadLetterQueue }));
    const url = (
      await clients.sqs.send(
        new CreateQueueCommand({
          QueueName: names.queue,
          Attributes: { Policy: JSON.stringify({ Version: "2012-10-17", Statement: [operators] }) },
        }),
      )
    ).QueueUrl;
    const before = counter.snapshot()["SQS.SetQueueAttributes"]?.calls ?? 0;

    // Act
    await bus.ensureQueue("s1", "n2", { senders: [CONTROLLER] });
    const written = (counter.snapshot()["SQS.SetQueueAttributes"]?.calls ?? 0) - before;
    await adapters({ queuePrefix }).bus.ensureQueue("s1", "n2", { senders: [CONTROLLER] });
    const writtenOnRestart = (counter.snapshot()["SQS.SetQueueAttributes"]?.calls ?? 0) - before - written;
    const queue = await policyOf(clients.sqs, url);

    // Assess
    expect(written).toBe(2);
    expect(writtenOnRestart).toBe(0);
    expect(queue.Statement.map((statement) => (statement as { Sid: string }).Sid)).toEqual([
      "AuditorsMayRead",
      "ShardguardDenyInsecureTransport",
      "ShardguardOnlyCommandSenders",
    ]);
  });
});

describe("commands", () => {
  it("delivers a sent command, parsed, and deletes it after success", async () => {
    // Prepare
    const { bus } = adapters({ queuePrefix: prefix() });
    const command = aCommand(7);
    await bus.ensureQueue("s1", "n2");
    await bus.send("s1", "n2", command);

    // Act
    const [received] = await bus.receive("s1", "n2", { waitSeconds: 2 });
    if (received) await bus.delete("s1", "n2", received);
    const afterDelete = await bus.receive("s1", "n2", { waitSeconds: 0 });

    // Assess
    expect(received?.command).toEqual(command);
    expect(received?.error).toBeUndefined();
    expect(received?.receiveCount).toBe(1);
    expect(afterDelete).toEqual([]);
  });

  it("refuses to send a command that fails its schema", async () => {
    const { bus } = adapters({ queuePrefix: prefix() });
    const bad = { ...aCommand(1), primary: undefined };
    await expect(bus.send("s1", "n1", bad)).rejects.toThrow(/primary: REPLICAOF needs the new primary/);
  });

  it("does not create a missing queue on send, and says which agent creates it", async () => {
    // Prepare: the controller's bus, for a node whose agent never started.
    const { bus, counter } = adapters({ queuePrefix: prefix() });

    // Act
    const sending = bus.send("s1", "ghost", aCommand(1));

    // Assess
    await expect(sending).rejects.toBeInstanceOf(CoordinationUnavailable);
    await expect(sending).rejects.toThrow(/agent of node ghost \(shard s1\) creates it/);
    expect(counter.snapshot()["SQS.CreateQueue"]).toBeUndefined();
  });

  it("moves a malformed command to the dead-letter queue while the consumer keeps receiving good ones", async () => {
    // Prepare
    const queuePrefix = prefix();
    const warnings: Array<Record<string, unknown>> = [];
    const { bus, clients } = adapters({
      queuePrefix,
      maxReceiveCount: 2,
      logger: { ...silentLogger, warn: (message, attributes) => warnings.push({ message, ...attributes }) },
    });
    const url = await bus.ensureQueue("s1", "n3");
    await bus.send("s1", "n3", aCommand(1));
    await clients.sqs.send(
      new SendMessageCommand({ QueueUrl: url, MessageBody: '{"type":"PROMOTE","epoch":-1}' }),
    );
    await clients.sqs.send(new SendMessageCommand({ QueueUrl: url, MessageBody: "not json" }));
    await bus.send("s1", "n3", aCommand(2));

    // Act: a consumer loop as the agent runs it, bounded in rounds.
    const applied: number[] = [];
    const errors: ReceivedCommand[] = [];
    for (let round = 0; round < 12 && applied.length < 3; round += 1) {
      for (const message of await bus.receive("s1", "n3", { waitSeconds: 1 })) {
        if (message.command) {
          applied.push(message.command.epoch);
          await bus.delete("s1", "n3", message);
        } else errors.push(message);
      }
      if (round === 1) await bus.send("s1", "n3", aCommand(3));
    }
    const dlqUrl = (
      await clients.sqs.send(
        new GetQueueUrlCommand({ QueueName: queueNames(queuePrefix, "s1", "n3").deadLetterQueue }),
      )
    ).QueueUrl;
    const deadLettered = await clients.sqs.send(
      new ReceiveMessageCommand({ QueueUrl: dlqUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1 }),
    );

    // Assess
    expect(applied.sort()).toEqual([1, 2, 3]);
    expect((deadLettered.Messages ?? []).map((message) => message.Body).sort()).toEqual(
      ['{"type":"PROMOTE","epoch":-1}', "not json"].sort(),
    );
    expect(errors.map((message) => message.error)).toContainEqual(expect.stringMatching(/^body: not JSON/));
    expect(errors.map((message) => message.error)).toContainEqual(expect.stringMatching(/epoch: .*>=0/));
    expect(warnings[0]).toMatchObject({ shard: "s1", node: "n3", maxReceiveCount: 2 });
  });

  it("redelivers a command no sooner than redeliverAfter says, and at once after redeliverAfter 0", async () => {
    // Prepare
    const { bus } = adapters({ queuePrefix: prefix(), visibilityTimeoutSeconds: 1, logger: silent });
    await bus.ensureQueue("s1", "n4");
    await bus.send("s1", "n4", aCommand(1));
    const [first] = await bus.receive("s1", "n4", { waitSeconds: 2 });
    if (!first) throw new Error("the command was not received");

    // Act
    await bus.redeliverAfter("s1", "n4", first, 5);
    const duringExtension = await bus.receive("s1", "n4", { waitSeconds: 2 });
    await bus.redeliverAfter("s1", "n4", first, 0);
    const afterRelease = await bus.receive("s1", "n4", { waitSeconds: 2 });

    // Assess
    expect(duringExtension).toEqual([]);
    expect(afterRelease.map((message) => message.command?.command_id)).toEqual([first.command?.command_id]);
    expect(afterRelease[0]?.receiveCount).toBe(2);
  });
});

describe("long polling", () => {
  it("returns a command sent while a 20 s receive waits within 200 ms of the send", async () => {
    // Prepare
    const { bus } = adapters({ queuePrefix: prefix() });
    await bus.ensureQueue("s1", "n5");
    let resolvedAt = 0;
    const receiving = bus.receive("s1", "n5", { waitSeconds: 20 }).then((messages) => {
      resolvedAt = performance.now();
      return messages;
    });
    // Negative check: on the empty queue the receive must not return; the client cannot see when
    // its request reached the emulator, so 500 ms of it still pending is also the time to get there.
    await holdsFor(() => resolvedAt === 0, "the receive pending on an empty queue", 500);

    // Act
    const sentAt = performance.now();
    await bus.send("s1", "n5", aCommand(1));
    const messages = await receiving;

    // Assess
    expect(messages).toHaveLength(1);
    expect(resolvedAt - sentAt).toBeLessThan(200);
  });

  it("returns no command promptly when a pending receive is aborted, and loses none", async () => {
    // Prepare: SQS may hand a message to a long poll whose client has gone; it returns after the
    // visibility timeout, which is short here.
    const { bus } = adapters({ queuePrefix: prefix(), visibilityTimeoutSeconds: 1 });
    await bus.ensureQueue("s1", "n6");
    const controller = new AbortController();
    let settled = false;
    const receiving = bus.receive("s1", "n6", { waitSeconds: 20, signal: controller.signal }).finally(() => {
      settled = true;
    });
    // Negative check, as above: 300 ms of the receive still pending, so the abort lands on a long poll.
    await holdsFor(() => !settled, "the receive pending on an empty queue", 300);

    // Act
    const abortedAt = performance.now();
    controller.abort();
    const messages = await receiving;
    const elapsedMs = performance.now() - abortedAt;
    await bus.send("s1", "n6", aCommand(1));
    const next = await bus.receive("s1", "n6", { waitSeconds: 3 });

    // Assess
    expect(messages).toEqual([]);
    expect(elapsedMs).toBeLessThan(100);
    expect(next).toHaveLength(1);
  });

  it("returns at once when the signal is already aborted", async () => {
    const { bus, counter } = adapters({ queuePrefix: prefix() });
    const messages = await bus.receive("s1", "n7", { signal: AbortSignal.abort() });
    expect(messages).toEqual([]);
    expect(counter.totalRequests()).toBe(0);
  });
});

describe("when SQS cannot be reached", () => {
  it("throws CoordinationUnavailable for send and receive", async () => {
    // Prepare
    const port = await freePort();
    const { bus } = adapters({
      env: { ...awsEnv(), AWS_ENDPOINT_URL_SQS: `http://127.0.0.1:${port}` },
      queuePrefix: prefix(),
      maxAttempts: 2,
    });

    // Act
    const outcomes = await Promise.allSettled([
      bus.send("s1", "n1", aCommand(1)),
      bus.receive("s1", "n1", { waitSeconds: 1 }),
      bus.ensureQueue("s1", "n2"),
    ]);

    // Assess
    for (const outcome of outcomes) {
      expect(outcome.status === "rejected" && outcome.reason).toBeInstanceOf(CoordinationUnavailable);
    }
  });
});
