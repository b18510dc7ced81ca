import { describe, expect, it } from "vitest";
import type { Command } from "../../src/core/model.ts";
import { CommandTap, commandOf, extractBodies } from "../../src/dev/nemesis/command-tap.ts";

const PROMOTE: Command = {
  type: "PROMOTE",
  shard: "s1",
  epoch: 4,
  command_id: "c-4-promote",
  issued_at: 1_800_000_000_000,
};
const REPLICAOF: Command = {
  type: "REPLICAOF",
  shard: "s1",
  epoch: 4,
  command_id: "c-4-replicaof",
  issued_at: 1_800_000_000_001,
  primary: { node_id: "node-2", address: "127.0.0.1:6380" },
};

/** An AWS JSON ReceiveMessage answer as an HTTP response, the way the agent's connection carries it. */
function receiveAnswer(commands: readonly Command[]): string {
  const body = JSON.stringify({
    Messages: commands.map((command, index) => ({
      MessageId: `m-${index}`,
      ReceiptHandle: `r-${index}`,
      MD5OfBody: "x",
      Body: JSON.stringify(command),
    })),
  });
  return `HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
}

describe("nemesis command tap: the commands an agent receives, read off its SQS connection", () => {
  it("reads every message body of a ReceiveMessage answer", () => {
    const { bodies, rest } = extractBodies(receiveAnswer([PROMOTE, REPLICAOF]));
    expect(bodies.map(commandOf)).toEqual([PROMOTE, REPLICAOF]);
    expect(rest).toBe("}]}");
  });

  it("reads a body split across chunks once its end has arrived, and each command once", () => {
    // Prepare
    const tap = new CommandTap();
    const answer = Buffer.from(receiveAnswer([REPLICAOF]));
    const cut = answer.indexOf("node-2");

    // Act
    tap.push(answer.subarray(0, cut), 1);
    const before = [...tap.commands];
    tap.push(answer.subarray(cut), 1);
    tap.push(Buffer.from(receiveAnswer([REPLICAOF])), 2);

    // Assess
    expect(before).toEqual([]);
    expect(tap.commands).toEqual([REPLICAOF]);
  });

  it("keeps the chunks of two connections apart", () => {
    const tap = new CommandTap();
    const first = Buffer.from(receiveAnswer([PROMOTE]));
    const second = Buffer.from(receiveAnswer([REPLICAOF]));
    tap.push(first.subarray(0, first.length - 40), 1);
    tap.push(second.subarray(0, second.length - 40), 2);
    tap.push(first.subarray(first.length - 40), 1);
    tap.push(second.subarray(second.length - 40), 2);
    expect(tap.commands).toEqual([PROMOTE, REPLICAOF]);
  });

  it("skips bodies that are not commands and keeps only the latest ones", () => {
    const tap = new CommandTap(2);
    tap.push(Buffer.from('{"Messages":[{"Body":"not json"},{"Body":"{\\"type\\":\\"REBOOT\\"}"}]}'), 1);
    for (let epoch = 1; epoch <= 3; epoch++) {
      tap.push(Buffer.from(receiveAnswer([{ ...PROMOTE, epoch, command_id: `c-${epoch}` }])), 1);
    }
    expect(tap.commands.map((command) => command.epoch)).toEqual([2, 3]);
  });
});
