import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { SendMessageBatchCommand, SQSClient } from "@aws-sdk/client-sqs";
import { DynamoDBDocumentClient, QueryCommand, TransactWriteCommand } from "@aws-sdk/lib-dynamodb";
import { afterAll, describe, expect, it } from "vitest";
import {
  AwsCallJournal,
  type AwsCallRecord,
  type AwsPrincipal,
} from "../../src/adapters/aws-call-journal.ts";
import { checkCalls, readJournal } from "../support/iam-check.ts";

const AGENT: AwsPrincipal = { component: "agent", shard: "orders", node: "n1" };
const directory = mkdtempSync(join(tmpdir(), "shardguard-journal-unit-"));

afterAll(() => rmSync(directory, { recursive: true, force: true }));

/** A record as the journal writes it, for the table `t` and the queue prefix `p`. */
function call(principal: AwsPrincipal, action: string, extra: Partial<AwsCallRecord> = {}): AwsCallRecord {
  return { principal, action, items: [], tableName: "t", queuePrefix: "p", table: "t", ...extra };
}

describe("the AWS call journal", () => {
  it("records each request as IAM sees it: the wire operation, its partition keys, a transaction item by item", async () => {
    // Prepare: a client whose requests go nowhere (the journal writes before the request is sent).
    const journal = new AwsCallJournal({ directory, principal: AGENT, tableName: "t", queuePrefix: "p" });
    const offline = { region: "eu-west-1", endpoint: "http://127.0.0.1:9", maxAttempts: 1 };
    const credentials = { accessKeyId: "a", secretAccessKey: "b" };
    const dynamo = new DynamoDBClient({ ...offline, credentials });
    dynamo.middlewareStack.use(journal.plugin("dynamodb"));
    const sqs = new SQSClient({ ...offline, credentials });
    sqs.middlewareStack.use(journal.plugin("sqs"));
    const documents = DynamoDBDocumentClient.from(dynamo);

    // Act
    const sends = [
      documents.send(
        new QueryCommand({
          TableName: "t",
          KeyConditionExpression: "#pk = :pk",
          ExpressionAttributeNames: { "#pk": "pk" },
          ExpressionAttributeValues: { ":pk": "SHARD#orders" },
        }),
      ),
      documents.send(
        new TransactWriteCommand({
          TransactItems: [
            {
              ConditionCheck: {
                TableName: "t",
                Key: { pk: "SHARD#orders", sk: "LOCK" },
                ConditionExpression: "attribute_exists(pk)",
              },
            },
            { Put: { TableName: "t", Item: { pk: "SHARD#orders", sk: "NODE#n1" } } },
          ],
        }),
      ),
      sqs.send(
        new SendMessageBatchCommand({
          QueueUrl: "http://127.0.0.1:9/000000000000/p_wake",
          Entries: [{ Id: "1", MessageBody: "{}" }],
        }),
      ),
    ];
    await Promise.allSettled(sends);
    dynamo.destroy();
    sqs.destroy();

    // Assess
    const records = readJournal(directory).map(({ action, items, queue }) => ({ action, items, queue }));
    expect(records).toEqual(
      expect.arrayContaining([
        { action: "dynamodb:Query", items: [{ action: "dynamodb:Query", pk: "SHARD#orders" }] },
        {
          action: "dynamodb:TransactWriteItems",
          items: [
            { action: "dynamodb:ConditionCheckItem", pk: "SHARD#orders" },
            { action: "dynamodb:PutItem", pk: "SHARD#orders" },
          ],
        },
        { action: "sqs:SendMessage", items: [], queue: "p_wake" },
      ]),
    );
  });
});

describe("the permissions check against the synthesized policies", { timeout: 180_000 }, () => {
  it("allows an agent its own shard partition, the shard index and its own queue", async () => {
    // Act
    const report = await checkCalls([
      call(AGENT, "dynamodb:GetItem", { items: [{ action: "dynamodb:GetItem", pk: "SHARD#orders" }] }),
      call(AGENT, "dynamodb:TransactWriteItems", {
        items: [
          { action: "dynamodb:ConditionCheckItem", pk: "CONTROL#orders" },
          { action: "dynamodb:UpdateItem", pk: "SHARD#orders" },
        ],
      }),
      call(AGENT, "dynamodb:Query", { items: [{ action: "dynamodb:Query", pk: "CONTROL#orders" }] }),
      call(AGENT, "dynamodb:PutItem", { items: [{ action: "dynamodb:PutItem", pk: "SHARDS" }] }),
      call(AGENT, "sqs:ReceiveMessage", { queue: "p_orders_n1" }),
      call(AGENT, "sqs:SendMessage", { queue: "p_wake" }),
    ]);

    // Assess
    expect(report.denials).toEqual([]);
  });

  it("denies an agent another shard's partition, another node's queue, a write to its shard's controller partition, and a call without a recorded key", async () => {
    // Act
    const report = await checkCalls([
      call(AGENT, "dynamodb:PutItem", { items: [{ action: "dynamodb:PutItem", pk: "SHARD#payments" }] }),
      call(AGENT, "sqs:ReceiveMessage", { queue: "p_orders_n10" }),
      call(AGENT, "dynamodb:Query", { items: [{ action: "dynamodb:Query" }] }),
      call(AGENT, "dynamodb:DeleteItem", { items: [{ action: "dynamodb:DeleteItem", pk: "SHARD#orders" }] }),
      call(AGENT, "dynamodb:PutItem", { items: [{ action: "dynamodb:PutItem", pk: "CONTROL#orders" }] }),
    ]);

    // Assess
    expect(report.denials.map((denial) => [denial.action, denial.result])).toEqual([
      ["dynamodb:PutItem", "ImplicitlyDenied"],
      ["sqs:ReceiveMessage", "ImplicitlyDenied"],
      ["dynamodb:Query", "no partition key recorded"],
      ["dynamodb:DeleteItem", "ImplicitlyDenied"],
      ["dynamodb:PutItem", "ImplicitlyDenied"],
    ]);
  });

  it("allows the controller's fenced transaction and its events, and denies the operator role any write", async () => {
    // Act
    const report = await checkCalls([
      call({ component: "controller" }, "dynamodb:TransactWriteItems", {
        items: [
          { action: "dynamodb:ConditionCheckItem", pk: "SHARD#orders" },
          { action: "dynamodb:PutItem", pk: "SHARD#orders" },
          { action: "dynamodb:DeleteItem", pk: "SHARD#orders" },
        ],
      }),
      call({ component: "operator" }, "dynamodb:PutItem", {
        items: [{ action: "dynamodb:PutItem", pk: "SHARD#orders" }],
      }),
      // The construct's default event bus is the account's default bus, not a resource of the stack.
      call({ component: "controller" }, "events:PutEvents", { eventBus: "default" }),
    ]);

    // Assess
    expect(report.denials.map((denial) => `${denial.call.principal.component} ${denial.action}`)).toEqual([
      "operator dynamodb:PutItem",
    ]);
  });
});
