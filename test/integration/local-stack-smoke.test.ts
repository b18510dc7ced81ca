import { ConditionalCheckFailedException, PutItemCommand } from "@aws-sdk/client-dynamodb";
import { CreateQueueCommand, ReceiveMessageCommand, SendMessageCommand } from "@aws-sdk/client-sqs";
import { afterAll, describe, expect, it } from "vitest";
import { dynamoClient, sqsClient, tableName, uniqueName } from "../support/aws.ts";
import { holdsFor } from "../support/wait.ts";

const dynamo = dynamoClient();
const sqs = sqsClient();

afterAll(() => {
  dynamo.destroy();
  sqs.destroy();
});

describe("the local AWS stand-ins behave like the real services", () => {
  it("rejects a second conditional put on the same key with ConditionalCheckFailedException", async () => {
    // Prepare
    const put = () =>
      dynamo.send(
        new PutItemCommand({
          TableName: tableName(),
          Item: { pk: { S: `SHARD#${uniqueName("smoke")}` }, sk: { S: "LOCK" }, owner: { S: "a" } },
          ConditionExpression: "attribute_not_exists(pk)",
        }),
      );
    const item = {
      TableName: tableName(),
      Item: { pk: { S: `SHARD#${uniqueName("smoke")}` }, sk: { S: "LOCK" }, owner: { S: "a" } },
      ConditionExpression: "attribute_not_exists(pk)",
    };

    // Act
    await dynamo.send(new PutItemCommand(item));
    const second = dynamo.send(new PutItemCommand(item));

    // Assess
    await expect(second).rejects.toBeInstanceOf(ConditionalCheckFailedException);
    await expect(put()).resolves.toBeDefined();
  });

  it("delivers a message sent during a 20 s long poll in well under a second", async () => {
    // Prepare
    const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: uniqueName("smoke") }));
    let returned = false;
    const receiving = sqs
      .send(new ReceiveMessageCommand({ QueueUrl, WaitTimeSeconds: 20, MaxNumberOfMessages: 1 }))
      .finally(() => {
        returned = true;
      });
    // Negative check: the long poll must not return on an empty queue; 500 ms of it pending also
    // lets the request reach the emulator (the client cannot see when it did).
    await holdsFor(() => !returned, "the long poll pending on an empty queue", 500);

    // Act
    const sentAt = performance.now();
    await sqs.send(new SendMessageCommand({ QueueUrl, MessageBody: "ping" }));
    const received = await receiving;
    const latencyMs = performance.now() - sentAt;

    // Assess
    expect(received.Messages?.[0]?.Body).toBe("ping");
    expect(latencyMs).toBeLessThan(1000);
  });
});
