import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PutCommand } from "@aws-sdk/lib-dynamodb";
import { afterAll, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { ENV } from "../../src/adapters/env.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { decide } from "../../src/core/decide.ts";
import type { Topology } from "../../src/core/model.ts";
import { keys } from "../../src/core/table.ts";
import { awsEnv, tableName, uniqueName } from "../support/aws.ts";
import { aConfig } from "../support/builders.ts";
import { checkCalls, describeDenials, readJournal } from "../support/iam-check.ts";

/**
 * Guarantee 6, "only the controller's role changes a shard's topology, lock or history": a node's
 * credentials (its agent's IAM policy, as `cdk synth` writes it) used through the store's own
 * operations to forge what the security review forged: a topology naming an attacker's address
 * (the real primary steps down and replicates from it, clients follow its `sentinel_address`), a
 * lock with a far-future expiry (no failover for its lifetime), a history record. Each request is
 * journaled as the agent's and evaluated against the synthesized policy: every one must be denied.
 * DynamoDB Local does not evaluate IAM, so the writes themselves land here; the policy is the check.
 */

const directories: string[] = [];
const opened: AwsAdapters[] = [];

afterAll(() => {
  for (const built of opened) built.destroy();
  for (const directory of directories) rmSync(directory, { recursive: true, force: true });
});

/** The `shardguard` CLI as an administrator runs it; never throws on a non-zero exit. */
function shardguard(env: NodeJS.ProcessEnv, ...args: string[]): Promise<{ code: number; stdout: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, ["src/cli/main.ts", ...args], { env, timeout: 60_000 }, (error, stdout) => {
      resolve({
        code: error ? (typeof error.code === "number" ? error.code : 1) : 0,
        stdout: String(stdout),
      });
    });
  });
}

function agentAdapters(shard: string, node: string): { aws: AwsAdapters; journal: string } {
  const journal = mkdtempSync(join(tmpdir(), "shardguard-forgery-"));
  directories.push(journal);
  const aws = createAwsAdapters({
    env: { ...awsEnv(), [ENV.awsCallLog]: journal },
    tableName: tableName(),
    logger: silentLogger,
    principal: { component: "agent", shard, node },
  });
  opened.push(aws);
  return { aws, journal };
}

function aTopology(shard: string, epoch: number, primary: string, address: string): Topology {
  return {
    shard,
    epoch,
    primary_node_id: primary,
    primary_address: address,
    status: "online",
    updated_at: Date.now(),
  };
}

// The first check synthesizes the stack's policies: tens of seconds on a loaded machine.
describe("one node's credentials against its own shard", { timeout: 180_000 }, () => {
  it("cannot write the topology, the lock or the history: the synthesized agent policy denies each forgery", async () => {
    // Prepare: the attacker holds node n3's credentials in shard `shard`.
    const shard = uniqueName("s").slice(0, 24);
    const { aws, journal } = agentAdapters(shard, "n3");
    const forged = aTopology(shard, 9, "n3", "203.0.113.9:6379");

    // Act: the store's own operations, as a compromised agent would call them.
    await aws.store.topology.compareAndSet(shard, undefined, forged);
    await aws.store.locks.acquire(shard, "attacker", 10 * 365 * 24 * 3600 * 1000);
    await aws.store.history.append({
      shard,
      epoch: 9,
      kind: "failover",
      at: Date.now(),
      old_primary_node_id: "n1",
      new_primary_node_id: "n3",
      reason: "forged",
      candidates: [],
      phase_timings: {},
    });
    const report = await checkCalls(readJournal(journal));

    // Assess
    const denied = report.denials.map((denial) => `${denial.action} ${denial.leadingKey}`).sort();
    expect(report.calls).toBe(3);
    expect(denied, describeDenials(report.denials)).toEqual(
      [
        `dynamodb:PutItem ${keys.controlPk(shard)}`,
        `dynamodb:UpdateItem ${keys.controlPk(shard)}`,
        `dynamodb:PutItem ${keys.historyPk(shard)}`,
      ].sort(),
    );
  });

  it("can still do its own work: heartbeat, snapshot, the topology read a command is checked against", async () => {
    // Prepare
    const shard = uniqueName("s").slice(0, 24);
    const { aws, journal } = agentAdapters(shard, "n1");

    // Act
    await aws.store.heartbeats.put({
      shard,
      node_id: "n1",
      node_address: "10.0.0.1:6379",
      role: "primary",
      last_updated: Date.now() * 1000,
      last_txn_id: 1,
      primary_node_id: "n1",
      primary_link: "up",
      epoch: 0,
      priority: 100,
    } as never);
    await aws.store.heartbeats.snapshot(shard);
    await aws.store.topology.read(shard);
    const report = await checkCalls(readJournal(journal));

    // Assess
    expect(report.calls).toBeGreaterThanOrEqual(4);
    expect(describeDenials(report.denials)).toBe("");
  });
});

describe("a table written by an installation before the controller's partition", () => {
  it("is read as a legacy topology the controller does not act on, until `shardguard migrate-layout` moves it", {
    timeout: 120_000,
  }, async () => {
    // Prepare: the old layout's topology and lock in the agents' partition.
    const shard = uniqueName("s").slice(0, 24);
    const aws = createAwsAdapters({ env: { ...awsEnv() }, tableName: tableName(), logger: silentLogger });
    opened.push(aws);
    const legacy = aTopology(shard, 4, "n1", "10.0.0.1:6379");
    for (const item of [
      { ...legacy, pk: keys.shardPk(shard), sk: keys.topology },
      { pk: keys.shardPk(shard), sk: keys.lock, owner: "old-controller", expires_at: 0, fence: 3 },
    ]) {
      await aws.clients.documents.send(new PutCommand({ TableName: tableName(), Item: item }));
    }

    // Act
    const before = await aws.store.heartbeats.snapshot(shard);
    const readBefore = await aws.store.topology.read(shard);
    const decision = decide(before, aConfig(), Date.now());
    const cli = await shardguard(
      { ...awsEnv(), [ENV.table]: tableName() },
      "migrate-layout",
      "--shard",
      shard,
      "--json",
    );
    const second = await aws.store.topology.migrateLegacy(shard);
    const after = await aws.store.heartbeats.snapshot(shard);

    // Assess
    expect(before).toMatchObject({
      legacyTopology: true,
      topology: { epoch: 4, primary_node_id: "n1" },
      lock: undefined,
    });
    expect(readBefore?.epoch).toBe(4);
    expect(decision).toMatchObject({ kind: "none", code: "legacy_layout" });
    expect(cli).toEqual({ code: 0, stdout: `${JSON.stringify({ shards: { [shard]: "moved" } })}\n` });
    expect(second).toBe("current");
    expect(after.legacyTopology).toBeUndefined();
    expect(after.topology).toMatchObject({ epoch: 4, primary_node_id: "n1" });
    expect(after.malformed).toEqual([]);
  });
});
