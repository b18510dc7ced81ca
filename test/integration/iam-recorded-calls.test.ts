import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  startChaosCluster,
  waitForFollowers,
  waitForNewPrimary,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { checkCalls, describeDenials, readJournal } from "../support/iam-check.ts";

/**
 * The permissions the code needs, read from what it did: real agent and controller processes and
 * the operator CLI record every AWS request (SHARDGUARD_AWS_CALL_LOG) through a failover, a
 * returning old primary, a switchover and a pause/resume; each request (each transaction item on its
 * own) must be allowed by the IAM policy `cdk synth` gives the role it runs as. DynamoDB Local and
 * the SQS emulator do not evaluate IAM, so without this a missing grant shows first in a real account.
 * The whole integration suite is checked the same way at its end (test/support/global-setup.ts).
 */

const CLI = "src/cli/main.ts";

let cluster: LocalCluster | undefined;
let journal: string | undefined;

afterEach(async () => {
  await cluster?.stop();
  cluster = undefined;
  if (journal) rmSync(journal, { recursive: true, force: true });
  journal = undefined;
});

function shardguard(env: NodeJS.ProcessEnv, ...args: string[]): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [CLI, ...args], { env, timeout: 60_000 }, (error, stdout, stderr) => {
      const code = error ? (typeof error.code === "number" ? error.code : 1) : 0;
      resolve({ code, output: `${stdout}${stderr}` });
    });
  });
}

describe("IAM: the synthesized policies allow every call the code makes", () => {
  it("allows each agent, controller and operator request of a failover, a rejoin, a switchover and a pause", {
    timeout: 180_000,
  }, async () => {
    // Prepare
    const directory = mkdtempSync(join(tmpdir(), "shardguard-calls-"));
    journal = directory;
    const record = { [ENV.awsCallLog]: directory };
    cluster = await startChaosCluster({ agentEnv: () => record, controllerEnv: () => record });
    const active = cluster;
    const before = await active.topology();
    await writeKeys(active.node("node-1"), "iam", 50, 1);

    // Act: a crash failover, the old primary back as a replica, then an operator's requests.
    active.node("node-1").signal("SIGKILL");
    const failedOver = await waitForNewPrimary(active, before?.epoch ?? 0);
    const winner = String(failedOver.primary_node_id);
    await active.node("node-1").start();
    const others = ["node-1", "node-2", "node-3"].filter((id) => id !== winner);
    await waitForFollowers(active, winner, others);
    const operatorEnv = { ...active.env, ...record };
    const status = await shardguard(operatorEnv, "status", "--shard", active.shard, "--json");
    const switchover = await shardguard(operatorEnv, "switchover", "--shard", active.shard);
    const pause = await shardguard(operatorEnv, "pause", "--shard", active.shard);
    const resume = await shardguard(operatorEnv, "resume", "--shard", active.shard);
    const report = await checkCalls(readJournal(directory));

    // Assess
    expect(
      [status, switchover, pause, resume].map((run) => run.code),
      JSON.stringify([switchover, pause]),
    ).toEqual([0, 0, 0, 0]);
    // What makes the check meaningful: the calls that need each grant were made.
    expect(report.actionsSeen, report.actionsSeen.join(", ")).toEqual(
      expect.arrayContaining([
        "agent dynamodb:GetItem",
        "agent dynamodb:PutItem",
        "agent dynamodb:Query",
        "agent sqs:ReceiveMessage",
        "agent sqs:DeleteMessage",
        "controller dynamodb:ConditionCheckItem",
        "controller dynamodb:PutItem",
        "controller sqs:SendMessage",
        "operator dynamodb:Query",
      ]),
    );
    expect(describeDenials(report.denials), `${report.calls} calls checked`).toBe("");
  });
});
