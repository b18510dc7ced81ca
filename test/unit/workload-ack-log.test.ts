import { describe, expect, it } from "vitest";
import { AckLog } from "../../src/dev/workload/ack-log.ts";
import { parseReplicationState } from "../../src/dev/workload/replication.ts";
import { classifyWriteError } from "../../src/dev/workload/writer.ts";

function aLogOf(...acks: [seq: number, at: number, address: string][]): AckLog {
  const log = new AckLog();
  for (const [seq, at, address] of acks) log.add({ seq, at, address });
  return log;
}

describe("the acknowledged-write log", () => {
  it("finds the first ack after an instant from a server other than the old primary", () => {
    // Prepare
    const log = aLogOf([1, 10, "a:1"], [2, 20, "a:1"], [5, 30, "a:1"], [9, 40, "b:2"], [10, 50, "b:2"]);

    // Act
    const first = log.firstAfter(20, "a:1");

    // Assess
    expect(first).toEqual({ seq: 9, at: 40, address: "b:2" });
  });

  it("excludes an ack exactly at the instant, since it cannot have followed it", () => {
    // Prepare
    const log = aLogOf([1, 10, "a:1"], [2, 20, "b:2"], [3, 30, "b:2"]);

    // Act
    const first = log.firstAfter(20);

    // Assess
    expect(first?.seq).toBe(3);
  });

  it("answers undefined when no other server acknowledged anything after the instant", () => {
    // Prepare
    const log = aLogOf([1, 10, "a:1"], [2, 20, "a:1"]);

    // Act
    const first = log.firstAfter(5, "a:1");

    // Assess
    expect(first).toBeUndefined();
  });

  it("returns the last ack at or before an instant", () => {
    // Prepare
    const log = aLogOf([1, 10, "a:1"], [2, 20, "a:1"], [3, 30, "b:2"]);

    // Act
    const last = log.lastAtOrBefore(25);

    // Assess
    expect(last?.seq).toBe(2);
    expect(log.lastAtOrBefore(5)).toBeUndefined();
  });

  it("selects acks by half-open sequence range even when sequence numbers have gaps", () => {
    // Prepare
    const log = aLogOf([1, 10, "a:1"], [4, 20, "a:1"], [7, 30, "b:2"], [8, 40, "b:2"]);

    // Act
    const seqs = log.bySeqRange(2, 8).map((ack) => ack.seq);

    // Assess
    expect(seqs).toEqual([4, 7]);
  });

  it("rejects an ack that arrives out of order, which would break the binary searches", () => {
    // Prepare
    const log = aLogOf([5, 10, "a:1"]);

    // Act
    const addEarlier = () => log.add({ seq: 4, at: 11, address: "a:1" });

    // Assess
    expect(addEarlier).toThrow(RangeError);
  });
});

describe("write error classification", () => {
  it("tells a replica's READONLY answer from a timeout and a closed connection", () => {
    // Act
    const kinds = [
      new Error("READONLY You can't write against a read only replica."),
      new Error("Command timed out"),
      new Error("Connection is closed."),
      new Error("ERR something else"),
    ].map(classifyWriteError);

    // Assess
    expect(kinds).toEqual(["readonly", "timeout", "connection", "error"]);
  });
});

describe("INFO replication parsing", () => {
  it("reads a replica's primary, link and processed offset", () => {
    // Prepare
    const text = [
      "# Replication",
      "role:slave",
      "master_host:127.0.0.1",
      "master_port:7001",
      "master_link_status:up",
      "master_repl_offset:4242",
    ].join("\r\n");

    // Act
    const state = parseReplicationState(text);

    // Assess
    expect(state).toEqual({ role: "slave", offset: 4242, primaryAddress: "127.0.0.1:7001", linkUp: true });
  });
});
