import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { CreateQueueCommand, ListQueuesCommand } from "@aws-sdk/client-sqs";
import { afterAll, describe, expect, it } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { legacyDeadLetterQueueName } from "../../src/adapters/queue-names.ts";
import { SqsCommandBus } from "../../src/adapters/sqs-command-bus.ts";
import { awsEnv } from "../support/aws.ts";

/**
 * Agents create their queues; `shardguard decommission` is how they go away (issue 17, item 6):
 * one retired node's, or every node queue of an installation after `cdk destroy`, never another
 * installation's, even one whose prefix starts with this one's.
 */

const run = promisify(execFile);
const tag = Math.random().toString(36).slice(2, 8);
const PREFIX = `d${tag}`;
/** Starts with PREFIX: a `PREFIX*` pattern would match its queues, `PREFIX_*` must not. */
const NEIGHBOUR = `d${tag}-b`;
const aws = createAwsAdapters({ env: awsEnv() });
afterAll(() => aws.destroy());

async function createQueues(prefix: string, nodes: [string, string][]) {
  const bus = new SqsCommandBus({ sqs: aws.clients.sqs, queuePrefix: prefix, logger: silentLogger });
  for (const [shard, node] of nodes) await bus.ensureQueue(shard, node);
}

async function queuesStartingWith(start: string): Promise<string[]> {
  const { QueueUrls = [] } = await aws.clients.sqs.send(
    new ListQueuesCommand({ QueueNamePrefix: start, MaxResults: 1000 }),
  );
  return QueueUrls.map((url) => url.split("/").pop() ?? "").sort();
}

function decommission(prefix: string, ...args: string[]) {
  return run(process.execPath, ["src/cli/main.ts", "decommission", ...args], {
    env: { ...process.env, ...awsEnv(), SHARDGUARD_QUEUE_PREFIX: prefix },
  });
}

describe("shardguard decommission", () => {
  it("deletes one retired node's queue (and its own dead-letter queue from an older release, never the shared one), then every queue of the installation only", async () => {
    // Prepare
    await createQueues(PREFIX, [
      ["orders", "n1"],
      ["orders", "n2"],
    ]);
    await createQueues(NEIGHBOUR, [["orders", "n1"]]);
    // n1 as an installation before the shared dead-letter queue left it: with its own.
    await aws.clients.sqs.send(
      new CreateQueueCommand({ QueueName: legacyDeadLetterQueueName(PREFIX, "orders", "n1") }),
    );

    // Act
    const one = await decommission(PREFIX, "--shard", "orders", "--node", "n1");

    // Assess
    expect(one.stdout).toBe(`deleted ${PREFIX}_orders_n1\ndeleted ${PREFIX}_orders_n1_dlq\n`);
    // The shared dead-letter queue stays: other nodes' queues send to it.
    expect(await queuesStartingWith(`${PREFIX}_`)).toEqual([`${PREFIX}_dlq`, `${PREFIX}_orders_n2`]);

    // Act
    const all = await decommission(PREFIX, "--all-queues", "--json");

    // Assess
    expect(JSON.parse(all.stdout)).toEqual({ deleted: [`${PREFIX}_dlq`, `${PREFIX}_orders_n2`] });
    expect(await queuesStartingWith(`${PREFIX}_`)).toEqual([]);
    expect(await queuesStartingWith(NEIGHBOUR)).toEqual([`${NEIGHBOUR}_dlq`, `${NEIGHBOUR}_orders_n1`]);
  }, 60_000);
});
