/**
 * Writes the IAM tables of docs/deploy.md and docs/ec2.md from the code that grants the actions
 * (`node cdk/docs-iam.ts`): the agent's rows from the statements `agentPolicyStatements` builds for
 * one node, the controller's and the operator's from the action lists the construct grants.
 * test/unit/docs-iam.test.ts fails when a page drifts from them.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { App, Stack } from "aws-cdk-lib";
import { queueNames } from "../src/adapters/queue-names.ts";
import { wakeQueueName } from "../src/adapters/sqs-wake-queue.ts";
import { SHARD_INDEX } from "../src/core/table.ts";
import { type AgentIdentity, agentPolicyStatements } from "./agent-policy.ts";
import {
  CONTROLLER_QUEUE_ACTIONS,
  CONTROLLER_RECORD_CHANGE_ACTIONS,
  CONTROLLER_RECORD_READ_ACTIONS,
  CONTROLLER_TABLE_ACTIONS,
  OPERATOR_TABLE_ACTIONS,
} from "./shardguard-controller.ts";

/** The node the tables show: the pages' example node and the default stack's queue prefix. */
export const EXAMPLE_NODE: AgentIdentity = { shard: "orders", node: "n1" };
export const EXAMPLE_QUEUE_PREFIX = "Shardguard";
const TABLE_ARN = "arn:aws:dynamodb:eu-west-1:123456789012:table/Shardguard-ShardguardTable";

/** One row: who, which actions, on what. */
export interface IamRow {
  readonly principal: string;
  readonly actions: readonly string[];
  readonly resource: string;
}

/** The agent policy of EXAMPLE_NODE, statement by statement, as the construct builds it. */
export function agentIamRows(): IamRow[] {
  const stack = new Stack(new App(), "Docs", { env: { account: "123456789012", region: "eu-west-1" } });
  const names = queueNames(EXAMPLE_QUEUE_PREFIX, EXAMPLE_NODE.shard, EXAMPLE_NODE.node);
  const queues: Record<string, string> = {
    [names.queue]: `its own queue \`${names.queue}\``,
    [names.deadLetterQueue]: `the installation's dead-letter queue \`${names.deadLetterQueue}\``,
    [wakeQueueName(EXAMPLE_QUEUE_PREFIX)]: `the wake queue \`${wakeQueueName(EXAMPLE_QUEUE_PREFIX)}\``,
  };
  const statements = agentPolicyStatements(stack, {
    ...EXAMPLE_NODE,
    tableArn: TABLE_ARN,
    queuePrefix: EXAMPLE_QUEUE_PREFIX,
  });
  return statements.map((statement) => {
    const resources = statement.resources.map((arn) => {
      if (arn === TABLE_ARN) return "the table";
      const queue = Object.keys(queues).find((name) => arn.endsWith(`:${name}`));
      if (queue === undefined) throw new Error(`docs-iam: no description for resource ${arn}`);
      return queues[queue] as string;
    });
    type LeadingKeys = { "dynamodb:LeadingKeys"?: string[] };
    const conditions = statement.conditions as {
      "ForAllValues:StringEquals"?: LeadingKeys;
      "ForAllValues:StringLike"?: LeadingKeys;
    };
    const exact = conditions["ForAllValues:StringEquals"]?.["dynamodb:LeadingKeys"];
    const like = conditions["ForAllValues:StringLike"]?.["dynamodb:LeadingKeys"];
    const quoted = (keys: readonly string[]) => keys.map((key) => `\`${key}\``).join(", ");
    const where = exact
      ? `, items whose partition key is ${quoted(exact)} (\`dynamodb:LeadingKeys\`)`
      : like
        ? `, items whose partition key matches ${quoted(like)} (\`dynamodb:LeadingKeys\`, \`StringLike\`)`
        : "";
    return {
      principal: `agent (\`${statement.sid}\`)`,
      actions: statement.actions,
      resource: `${resources.join(", ")}${where}`,
    };
  });
}

/** The rows the construct grants from its exported action lists (the L2 grants are listed by hand). */
export function controllerIamRows(): IamRow[] {
  return [
    { principal: "controller", actions: CONTROLLER_TABLE_ACTIONS, resource: "the table" },
    {
      principal: "controller",
      actions: CONTROLLER_QUEUE_ACTIONS,
      resource: "`arn:…:sqs:<region>:<account>:<prefix>_*` (node queues; `_` ends every prefix)",
    },
    { principal: "operator", actions: OPERATOR_TABLE_ACTIONS, resource: "the table" },
    {
      principal: "controller, operator",
      actions: ["dynamodb:Query"],
      resource: `the shard index \`<table>/index/${SHARD_INDEX.indexName}\``,
    },
    {
      principal: "controller (with `primaryRecords`)",
      actions: CONTROLLER_RECORD_READ_ACTIONS,
      resource: "each hosted zone of `primaryRecords`",
    },
    {
      principal: "controller (with `primaryRecords`)",
      actions: CONTROLLER_RECORD_CHANGE_ACTIONS,
      resource:
        "each hosted zone of `primaryRecords`, only its shards' names and their `_shardguard.` epoch records (`route53:ChangeResourceRecordSetsNormalizedRecordNames`), types A, AAAA, CNAME, TXT (`route53:ChangeResourceRecordSetsRecordTypes`)",
    },
  ];
}

export interface IamDocTable {
  /** Relative to the repository root. */
  readonly file: string;
  /** The markers are `<!-- iam:<name> -->` and `<!-- /iam:<name> -->`. */
  readonly name: string;
  readonly rows: () => IamRow[];
}

export const IAM_DOC_TABLES: readonly IamDocTable[] = [
  { file: "docs/deploy.md", name: "constants", rows: () => [...controllerIamRows(), ...agentIamRows()] },
  { file: "docs/ec2.md", name: "agent", rows: agentIamRows },
];

export function iamTable(rows: readonly IamRow[]): string {
  return [
    "| Principal | Actions | Resource |",
    "|---|---|---|",
    ...rows.map(
      (row) =>
        `| ${row.principal} | ${row.actions.map((action) => `\`${action}\``).join(", ")} | ${row.resource} |`,
    ),
  ].join("\n");
}

/** `text` with the table between the markers written afresh; throws when a marker is missing. */
export function withIamTable(text: string, table: IamDocTable): string {
  const open = `<!-- iam:${table.name} -->`;
  const close = `<!-- /iam:${table.name} -->`;
  const start = text.indexOf(open);
  const end = text.indexOf(close);
  if (start < 0 || end < start) throw new Error(`${table.file} lacks the markers ${open} ... ${close}`);
  const generated = `${open}\n<!-- generated from the code by \`node cdk/docs-iam.ts\`; edit the grants, not this table -->\n${iamTable(table.rows())}\n`;
  return text.slice(0, start) + generated + text.slice(end);
}

const ROOT = fileURLToPath(new URL("..", import.meta.url));

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  for (const table of IAM_DOC_TABLES) {
    const path = `${ROOT}${table.file}`;
    const before = readFileSync(path, "utf8");
    const after = withIamTable(before, table);
    if (after !== before) writeFileSync(path, after);
    process.stdout.write(`${table.file}: ${after === before ? "up to date" : "IAM table rewritten"}\n`);
  }
}
