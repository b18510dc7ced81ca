import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { SendMessageBatchCommand, SQSClient } from "@aws-sdk/client-sqs";
import { DynamoDBDocumentClient, QueryCommand, TransactWriteCommand } from "@aws-sdk/lib-dynamodb";
import { afterAll, describe, expect, it } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import {
  AwsCallJournal,
  type AwsCallRecord,
  type AwsPrincipal,
} from "../../src/adapters/aws-call-journal.ts";
import { ENV } from "../../src/adapters/env.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { SHARD_INDEX } from "../../src/core/table.ts";
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
  it("allows an agent its own shard partition, its shard's registration and its own queue", async () => {
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
      call(AGENT, "dynamodb:PutItem", { items: [{ action: "dynamodb:PutItem", pk: "SHARD#orders" }] }),
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

  it("lets an agent register its own shard in the shard index and no other; the controller and operators list it", async () => {
    // Prepare: the store's own operations, journaled as each principal (the requests go nowhere:
    // the journal records them before they are sent).
    const journalOf = (principal: AwsPrincipal) => {
      const dir = mkdtempSync(join(directory, "index-"));
      const aws = createAwsAdapters({
        env: {
          AWS_REGION: "eu-west-1",
          AWS_ACCESS_KEY_ID: "a",
          AWS_SECRET_ACCESS_KEY: "b",
          AWS_ENDPOINT_URL: "http://127.0.0.1:9",
          [ENV.awsCallLog]: dir,
        },
        tableName: "t",
        queuePrefix: "p",
        logger: silentLogger,
        principal,
        maxAttempts: 1,
      });
      return { aws, dir };
    };
    const agent = journalOf(AGENT);
    const controller = journalOf({ component: "controller" });
    const operator = journalOf({ component: "operator" });

    // Act: the real registration, a forged one for another shard, the listing.
    await Promise.allSettled([
      agent.aws.store.shards.register("orders"),
      agent.aws.store.shards.register("payments"),
      controller.aws.store.shards.list(),
      operator.aws.store.shards.list(),
    ]);
    for (const { aws } of [agent, controller, operator]) aws.destroy();
    const recorded = [agent, controller, operator].flatMap(({ dir }) => readJournal(dir));
    const report = await checkCalls([
      ...recorded,
      // The index partition of the release before, which any agent could write.
      call(AGENT, "dynamodb:PutItem", { items: [{ action: "dynamodb:PutItem", pk: "SHARDS" }] }),
    ]);

    // Assess: four calls recorded (two registrations, two listings through the index), and only the
    // two forgeries denied.
    expect(
      recorded
        .map(
          (record) =>
            `${record.principal.component} ${record.action} ${record.index ?? "table"} ${record.items[0]?.pk}`,
        )
        .sort(),
    ).toEqual([
      "agent dynamodb:PutItem table SHARD#orders",
      "agent dynamodb:PutItem table SHARD#payments",
      `controller dynamodb:Query ${SHARD_INDEX.indexName} ${SHARD_INDEX.value}`,
      `operator dynamodb:Query ${SHARD_INDEX.indexName} ${SHARD_INDEX.value}`,
    ]);
    expect(report.denials.map((denial) => `${denial.action} ${denial.leadingKey}: ${denial.result}`)).toEqual(
      ["dynamodb:PutItem SHARD#payments: ImplicitlyDenied", "dynamodb:PutItem SHARDS: ImplicitlyDenied"],
    );
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
