import { describe, expect, it } from "vitest";
import { commandSendersSchema } from "../../src/adapters/queue-names.ts";
import { commandQueuePolicy } from "../../src/adapters/sqs-command-bus.ts";
import { resolveAgentOptions } from "../../src/agent/options.ts";
import { ConfigurationError } from "../../src/core/errors.ts";

const QUEUE = "arn:aws:sqs:eu-west-1:123456789012:shardguard_orders_n1";
const CONTROLLER = "arn:aws:iam::123456789012:role/shardguard-controller";
const OPERATORS = "arn:aws:iam::123456789012:role/ops-*";

const TLS_ONLY = {
  Sid: "ShardguardDenyInsecureTransport",
  Effect: "Deny",
  Principal: { AWS: "*" },
  Action: "sqs:*",
  Resource: QUEUE,
  Condition: { Bool: { "aws:SecureTransport": "false" } },
};

describe("the command queue's policy", () => {
  it("denies every request without TLS when no sender is named", () => {
    expect(commandQueuePolicy(QUEUE)).toEqual({ Version: "2012-10-17", Statement: [TLS_ONLY] });
  });

  it("denies sqs:SendMessage to every principal but the named senders", () => {
    // Act
    const policy = commandQueuePolicy(QUEUE, { senders: [CONTROLLER, OPERATORS] });

    // Assess
    expect(policy.Statement).toEqual([
      TLS_ONLY,
      {
        Sid: "ShardguardOnlyCommandSenders",
        Effect: "Deny",
        Principal: { AWS: "*" },
        Action: "sqs:SendMessage",
        Resource: QUEUE,
        Condition: { ArnNotLike: { "aws:PrincipalArn": [CONTROLLER, OPERATORS] } },
      },
    ]);
  });

  it("keeps an operator's own statements and replaces its own", () => {
    // Prepare: a policy an earlier agent wrote (one sender), plus an operator's statement.
    const operators = {
      Sid: "AuditorsMayRead",
      Effect: "Allow",
      Principal: { AWS: "arn:aws:iam::123456789012:role/auditor" },
      Action: "sqs:GetQueueAttributes",
      Resource: QUEUE,
    };
    const stored = JSON.stringify({
      Version: "2012-10-17",
      Statement: [operators, ...(commandQueuePolicy(QUEUE, { senders: [OPERATORS] }).Statement as unknown[])],
    });

    // Act
    const policy = commandQueuePolicy(QUEUE, { senders: [CONTROLLER] }, stored);

    // Assess
    expect(policy.Statement).toEqual([
      operators,
      TLS_ONLY,
      expect.objectContaining({ Condition: { ArnNotLike: { "aws:PrincipalArn": [CONTROLLER] } } }),
    ]);
  });

  it.each([
    ["an account id where a role ARN belongs", ["123456789012"]],
    ["a role name without its ARN", ["shardguard-controller"]],
    ["an SQS ARN", [QUEUE]],
    ["a wildcard for everyone", ["*"]],
    ["more than 50 ARNs", Array.from({ length: 51 }, (_, index) => `${CONTROLLER}-${index}`)],
  ])("refuses %s as senders", (_name, senders) => {
    expect(() => commandQueuePolicy(QUEUE, { senders })).toThrow(ConfigurationError);
    expect(commandSendersSchema.safeParse(senders).success).toBe(false);
  });
});

describe("the command senders setting", () => {
  const base = { SHARDGUARD_SHARD: "orders", SHARDGUARD_REDIS: "10.0.0.1:6379" };

  it("reads a comma-separated list from --command-senders or SHARDGUARD_COMMAND_SENDERS", () => {
    // Act
    const fromFlag = resolveAgentOptions({
      flags: { commandSenders: `${CONTROLLER}, ${OPERATORS}` },
      env: base,
    });
    const fromEnv = resolveAgentOptions({
      flags: {},
      env: { ...base, SHARDGUARD_COMMAND_SENDERS: CONTROLLER },
    });
    const unset = resolveAgentOptions({ flags: {}, env: base });

    // Assess
    expect(fromFlag.agent.commandSenders).toEqual([CONTROLLER, OPERATORS]);
    expect(fromEnv.agent.commandSenders).toEqual([CONTROLLER]);
    expect(unset.agent.commandSenders).toEqual([]);
  });

  it("names the setting and the ARN it cannot use", () => {
    expect(() =>
      resolveAgentOptions({
        flags: {},
        env: { ...base, SHARDGUARD_COMMAND_SENDERS: "shardguard-controller" },
      }),
    ).toThrow(/SHARDGUARD_COMMAND_SENDERS.*"shardguard-controller": not an IAM role or user ARN/);
  });
});
