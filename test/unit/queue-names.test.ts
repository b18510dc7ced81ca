import { describe, expect, it } from "vitest";
import {
  deadLetterQueueName,
  legacyDeadLetterQueueName,
  queueNames,
  SQS_QUEUE_NAME_MAX,
} from "../../src/adapters/queue-names.ts";
import { ConfigurationError } from "../../src/core/errors.ts";

describe("queue names", () => {
  it("names a node's queue from prefix, shard and node, and the installation's one dead-letter queue", () => {
    expect(queueNames("shardguard", "orders-1", "node-a")).toEqual({
      queue: "shardguard_orders-1_node-a",
      deadLetterQueue: "shardguard_dlq",
    });
    expect(queueNames("shardguard", "orders-2", "node-b").deadLetterQueue).toBe(
      deadLetterQueueName("shardguard"),
    );
    expect(legacyDeadLetterQueueName("shardguard", "orders-1", "node-a")).toBe(
      "shardguard_orders-1_node-a_dlq",
    );
  });

  it("stays within the SQS limit for the longest prefix and ids allowed", () => {
    // Prepare
    const names = queueNames("p".repeat(20), "s".repeat(24), "n".repeat(24));
    const legacy = legacyDeadLetterQueueName("p".repeat(20), "s".repeat(24), "n".repeat(24));

    // Assess
    for (const name of [names.queue, names.deadLetterQueue, legacy]) {
      expect(name.length).toBeLessThanOrEqual(SQS_QUEUE_NAME_MAX);
      expect(name).toMatch(/^[A-Za-z0-9_-]+$/);
    }
  });

  it.each([
    ["a prefix that is too long", "p".repeat(21), "s1", "n1", /queue prefix/],
    ["a prefix with a dot", "my.prefix", "s1", "n1", /queue prefix "my.prefix"/],
    ["an empty prefix", "", "s1", "n1", /queue prefix/],
    // '_' separates the parts: "a_b" would own "a_b_s1_n1", which "a"'s pattern "a_*" also matches.
    [
      "a prefix with the separator '_'",
      "a_b",
      "s1",
      "n1",
      /queue prefix "a_b": .*'_' separates prefix, shard and node/,
    ],
    ["a shard id with the separator '_'", "sg", "s_1", "n1", /shard id "s_1"/],
    ["a node id with the separator '_'", "sg", "s1", "n_1", /node id "n_1"/],
    ["a shard id with a space", "sg", "s 1", "n1", /shard id "s 1"/],
    ["a node id that is too long", "sg", "s1", "n".repeat(25), /node id/],
    ["a node id starting with '-'", "sg", "s1", "-n1", /node id "-n1"/],
  ])("rejects %s with a ConfigurationError naming it", (_, prefix, shard, node, message) => {
    expect(() => queueNames(prefix, shard, node)).toThrow(ConfigurationError);
    expect(() => queueNames(prefix, shard, node)).toThrow(message);
  });
});
