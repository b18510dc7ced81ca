import { execFile } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PutCommand, QueryCommand } from "@aws-sdk/lib-dynamodb";
import { afterAll, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { ENV } from "../../src/adapters/env.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { decide } from "../../src/core/decide.ts";
import type { HeartbeatInput, Topology } from "../../src/core/model.ts";
import { keys } from "../../src/core/table.ts";
import { awsEnv, tableName, uniqueName } from "../support/aws.ts";
import { aConfig } from "../support/builders.ts";
import { checkCalls, describeDenials, readJournal } from "../support/iam-check.ts";

/**
 * Guarantee 6, "only the controller's role changes a shard's topology, lock or history, and a node's
 * credentials write only its own report": a node's credentials (its agent's IAM policy, as `cdk synth`
 * writes it) used through the store's own operations to forge what the security review forged: a
 * topology naming an attacker's address (the real primary steps down and replicates from it, clients
 * follow its `sentinel_address`), a lock with a far-future expiry (no failover for its lifetime), a
 * history record, a peer's heartbeat and replica set (a failover from a healthy primary). Each request
 * is journaled as the agent's and evaluated against the synthesized policy: every one must be denied.
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

function aHeartbeat(shard: string, node: string, overrides: Partial<HeartbeatInput> = {}): HeartbeatInput {
  return {
    shard,
    node_id: node,
    node_address: "10.0.0.1:6379",
    role: "primary",
    last_updated: Date.now() * 1000,
    last_txn_id: 1,
    primary_node_id: "n1",
    primary_link: "up",
    epoch: 0,
    priority: 100,
    ...overrides,
  } as HeartbeatInput;
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
    // The topology put, the layout marker a first topology carries, the lock, the history record.
    expect(report.calls).toBe(4);
    expect(denied, describeDenials(report.denials)).toEqual(
      [
        `dynamodb:PutItem ${keys.controlPk(shard)}`,
        `dynamodb:PutItem ${keys.controlPk(shard)}`,
        `dynamodb:UpdateItem ${keys.controlPk(shard)}`,
        `dynamodb:PutItem ${keys.historyPk(shard)}`,
      ].sort(),
    );
  });

  it("cannot write a peer's heartbeat or replica set: the synthesized agent policy denies each forgery", async () => {
    // Prepare: the attacker holds node n3's credentials and forges what n1, the primary, reports.
    const shard = uniqueName("s").slice(0, 24);
    const { aws, journal } = agentAdapters(shard, "n3");
    const stale = Date.now() * 1000 - 3_600_000_000;

    // Act: a stale heartbeat of the primary (a failover from a healthy primary), then its replica set.
    await aws.store.heartbeats.put(
      aHeartbeat(shard, "n1", { last_updated: stale, sentinel_address: "203.0.113.9:26379" }),
    );
    await aws.store.replicaSets.add(shard, "n1", ["n3"]);
    await aws.store.replicaSets.removeWhilePrimary(shard, "n1", ["n2"], undefined);
    const report = await checkCalls(readJournal(journal));

    // Assess: every write into n1's partition denied; n3's own member items are all it could write.
    const denied = report.denials.map((denial) => `${denial.action} ${denial.leadingKey}`).sort();
    expect(denied, describeDenials(report.denials)).toEqual(
      [
        `dynamodb:PutItem ${keys.nodePk(shard, "n1")}`,
        `dynamodb:UpdateItem ${keys.nodePk(shard, "n1")}`,
        `dynamodb:UpdateItem ${keys.nodePk(shard, "n1")}`,
      ].sort(),
    );
  });

  it("cannot register another shard in the shard index, only its own: the synthesized agent policy denies the forgery", async () => {
    // Prepare: a flood of made-up shard ids once cost every controller pass a read each.
    const shard = uniqueName("s").slice(0, 24);
    const { aws, journal } = agentAdapters(shard, "n3");

    // Act: the store's own registration, for the agent's shard and for made-up ones.
    await aws.store.shards.register(shard);
    for (let index = 0; index < 3; index++) await aws.store.shards.register(`fake-${index}`);
    const report = await checkCalls(readJournal(journal));

    // Assess: the three forged registrations denied, the real one allowed.
    expect(report.calls).toBe(4);
    expect(report.denials.map((denial) => `${denial.action} ${denial.leadingKey}`).sort()).toEqual([
      `dynamodb:PutItem ${keys.shardPk("fake-0")}`,
      `dynamodb:PutItem ${keys.shardPk("fake-1")}`,
      `dynamodb:PutItem ${keys.shardPk("fake-2")}`,
    ]);
  });

  it("can still do its own work: heartbeat, snapshot, the topology read a command is checked against", async () => {
    // Prepare
    const shard = uniqueName("s").slice(0, 24);
    const { aws, journal } = agentAdapters(shard, "n1");

    // Act
    await aws.store.heartbeats.put(aHeartbeat(shard, "n1"));
    await aws.store.replicaSets.add(shard, "n1", ["n2"]);
    await aws.store.replicaSets.removeWhilePrimary(shard, "n1", ["n2"], undefined);
    await aws.store.heartbeats.snapshot(shard);
    await aws.store.topology.read(shard);
    const report = await checkCalls(readJournal(journal));

    // Assess
    expect(report.calls).toBeGreaterThanOrEqual(8);
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

describe("a table written by the release before node partitions", () => {
  it("is read the older way, with no automatic action, until `shardguard migrate-layout` moves every heartbeat and replica set into its node's partition", {
    timeout: 120_000,
  }, async () => {
    // Prepare: the previous layout: topology in the controller's partition (no layout marker),
    // heartbeats and n1's replica set in the shard partition; n2 already upgraded (a newer heartbeat
    // in its own partition, its old one left behind).
    const shard = uniqueName("s").slice(0, 24);
    const aws = createAwsAdapters({ env: { ...awsEnv() }, tableName: tableName(), logger: silentLogger });
    opened.push(aws);
    const now = Date.now() * 1000;
    const put = (item: Record<string, unknown>) =>
      aws.clients.documents.send(new PutCommand({ TableName: tableName(), Item: item }));
    await put({
      ...aTopology(shard, 4, "n1", "10.0.0.1:6379"),
      pk: keys.controlPk(shard),
      sk: keys.topology,
    });
    await put({
      ...aHeartbeat(shard, "n1", { last_txn_id: 70 }),
      pk: keys.shardPk(shard),
      sk: keys.node("n1"),
    });
    await put({
      ...aHeartbeat(shard, "n2", { role: "replica", last_txn_id: 60, last_updated: now - 5_000_000 }),
      pk: keys.shardPk(shard),
      sk: keys.node("n2"),
    });
    await put({ pk: keys.shardPk(shard), sk: keys.replicas("n1"), replicas: new Set(["n2"]), version: 7 });
    await aws.store.heartbeats.put(aHeartbeat(shard, "n2", { role: "replica", last_txn_id: 65 }));

    // Act
    const before = await aws.store.heartbeats.snapshot(shard);
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
    const { Items: left } = await aws.clients.documents.send(
      new QueryCommand({
        TableName: tableName(),
        KeyConditionExpression: "pk = :pk",
        ExpressionAttributeValues: { ":pk": keys.shardPk(shard) },
        ConsistentRead: true,
      }),
    );

    // Assess
    expect(before.legacyTopology).toBe(true);
    expect(before.nodes.map((node) => [node.node_id, node.last_txn_id])).toEqual([
      ["n1", 70],
      ["n2", 65],
    ]);
    expect(decision).toMatchObject({ kind: "none", code: "legacy_layout" });
    expect(cli).toEqual({ code: 0, stdout: `${JSON.stringify({ shards: { [shard]: "moved" } })}\n` });
    expect(second).toBe("current");
    expect(after.legacyTopology).toBeUndefined();
    expect(after.nodes.map((node) => [node.node_id, node.last_txn_id])).toEqual([
      ["n1", 70],
      ["n2", 65],
    ]);
    expect(after.replicaSets).toEqual({ n1: ["n2"] });
    expect(after.replicaSetVersions).toEqual({ n1: 7 });
    expect(after.topology).toMatchObject({ epoch: 4, primary_node_id: "n1" });
    expect(after.malformed).toEqual([]);
    expect(left?.map((item) => item.sk).sort()).toEqual([keys.member("n1"), keys.member("n2")]);
  });
});
