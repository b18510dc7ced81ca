import { readFileSync } from "node:fs";
import { join } from "node:path";
import { GetQueueAttributesCommand, SendMessageCommand } from "@aws-sdk/client-sqs";
import { afterEach, describe, expect, it } from "vitest";
import { RedisDatabase } from "../../src/agent/database.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, RecordingLogger, redisRole } from "../support/agent-harness.ts";
import { sqsClient } from "../support/aws.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

let fixture: AgentFixture;

/** A real database connection whose promotion waits for the test's go: a command still running when the agent stops. */
class GatedPromotion extends RedisDatabase {
  private readonly onPromote: () => void;
  private readonly gate: Promise<void>;
  constructor(address: string, onPromote: () => void, gate: Promise<void>) {
    super({ address, commandTimeoutMs: 1000, logger: new RecordingLogger() });
    this.onPromote = onPromote;
    this.gate = gate;
  }
  override async promote() {
    this.onPromote();
    await this.gate;
    await super.promote();
  }
}

afterEach(async () => {
  await fixture.close();
});

const planChange: AgentFixture["planChange"] = (...args) => fixture.planChange(...args);

const failoverAt1 = (from: RedisNode, to: RedisNode) =>
  planChange("failover", 1, { id: "n1", address: from.address }, { id: "n2", address: to.address });

describe("agent heartbeats", () => {
  it("reports the primary's and the replica's replication state, offsets moving with writes", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [primaryNode, replicaNode] = await fixture.startRedis(2);
    if (!primaryNode || !replicaNode) throw new Error("redis nodes missing");
    const primary = await fixture.startAgent(primaryNode, { nodeId: "p1", priority: 0 });
    const replica = await fixture.startAgent(replicaNode, { nodeId: "r1", priority: 10 });
    const linked = await fixture.waitForHeartbeat("r1", (hb) => hb.primary_link === "up", "replica link up");
    const before = await fixture.heartbeatOf("p1");

    // Act
    const client = primaryNode.client();
    // On a loaded machine the primary's agent may fence for a moment (a heartbeat write slower than
    // the 600 ms fence timeout, with no member in its set yet): a refused write is tried again.
    const deadline = Date.now() + 15_000;
    for (let index = 0; index < 50; index++) {
      for (;;) {
        try {
          await client.set(`key-${index}`, "x".repeat(100));
          break;
        } catch (error) {
          if (!/NOREPLICAS/.test(String(error)) || Date.now() > deadline) throw error;
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      }
    }
    client.disconnect();
    const movedPrimary = await fixture.waitForHeartbeat(
      "p1",
      (hb) => hb.last_txn_id > (before?.last_txn_id ?? 0) + 5000,
      "primary offset moved",
    );
    const movedReplica = await fixture.waitForHeartbeat(
      "r1",
      (hb) => hb.last_txn_id >= movedPrimary.last_txn_id,
      "replica offset caught up",
    );

    // Assess
    expect(before).toMatchObject({
      role: "primary",
      node_address: primaryNode.address,
      db_status: "up",
      epoch: 0,
      priority: 0,
    });
    expect(before?.primary_node_id).toBeUndefined();
    expect(linked).toMatchObject({
      role: "replica",
      node_address: replicaNode.address,
      primary_node_id: "p1",
      primary_link: "up",
      priority: 10,
      repl_id: before?.repl_id,
    });
    expect(linked.lag_s).toBeGreaterThanOrEqual(0);
    expect(linked.repl_id).toMatch(/^[0-9a-f]{40}$/);
    expect(movedReplica.repl_id).toBe(movedPrimary.repl_id);
    expect(movedReplica.last_updated).toBeGreaterThan(linked.last_updated);
    expect(primary.handle.status()).toMatchObject({
      role: "primary",
      dbUp: true,
      storeUp: true,
      fenced: false,
    });
    expect(replica.handle.nodeId).toBe("r1");
    const { shards } = await fixture.aws.store.shards.list();
    expect(shards).toContain(fixture.shard);
  });

  it("admits a replica to the replica set only after its full sync and drops it when it disappears", async () => {
    // Prepare: the primary holds a new replica in wait_bgsave for 5 s before it sends the data (2 s
    // was not enough on a loaded host: the wait for r1's heartbeat below ate the rest of it, and the
    // sync legitimately finished inside the negative check).
    fixture = new AgentFixture();
    const [primaryNode, lateNode] = await fixture.startRedis(2);
    if (!primaryNode || !lateNode) throw new Error("redis nodes missing");
    const admin = primaryNode.client();
    await admin.config("SET", "repl-diskless-sync-delay", "5");
    const lateClient = lateNode.client();
    await lateClient.replicaof("NO", "ONE");
    await fixture.startAgent(primaryNode, { nodeId: "p1" });
    await fixture.startAgent(lateNode, { nodeId: "r1" });

    // Act
    await lateClient.replicaof("127.0.0.1", primaryNode.port);
    await fixture.waitForHeartbeat(
      "r1",
      (hb) => hb.role === "replica" && hb.primary_node_id === "p1",
      "r1 replica",
    );
    // Negative check: r1 must stay out while the primary holds it in wait_bgsave (5 s); 800 ms of
    // that is several heartbeats (200 ms) in which the agents could wrongly admit it.
    await holdsFor(
      async () => !((await fixture.snapshot()).replicaSets.p1 ?? []).includes("r1"),
      "r1 out of the replica set during its full sync",
      800,
    );
    const syncState = await admin.info("replication");
    const afterSync = await waitFor(
      async () => ((await fixture.snapshot()).replicaSets.p1 ?? []).includes("r1") && true,
      "r1 in the replica set",
    );
    lateClient.disconnect();
    lateNode.signal("SIGKILL");
    const gone = await waitFor(
      async () => !((await fixture.snapshot()).replicaSets.p1 ?? []).includes("r1") && true,
      "r1 out of the replica set",
    );
    admin.disconnect();

    // Assess
    expect(syncState).toMatch(/^slave0:.*state=(wait_bgsave|send_bulk)/m);
    expect(afterSync).toBe(true);
    expect(gone).toBe(true);
  });
});

describe("agent commands", () => {
  it("applies PROMOTE and REPLICAOF and confirms each in its heartbeat", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [oldNode, newNode] = await fixture.startRedis(2);
    if (!oldNode || !newNode) throw new Error("redis nodes missing");
    const oldPrimary = await fixture.startAgent(oldNode, { nodeId: "n1" });
    const candidate = await fixture.startAgent(newNode, { nodeId: "n2" });
    await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "replica link up");
    await failoverAt1(oldNode, newNode);

    // Act
    await fixture.send("n2", fixture.command("PROMOTE", 1));
    const promoted = await fixture.waitForHeartbeat(
      "n2",
      (hb) => hb.role === "primary" && hb.epoch >= 1,
      "n2 primary",
    );
    await fixture.send(
      "n1",
      fixture.command("REPLICAOF", 1, { primary: { node_id: "n2", address: newNode.address } }),
    );
    const repointed = await fixture.waitForHeartbeat(
      "n1",
      (hb) => hb.role === "replica" && hb.primary_link === "up",
      "n1 replica of n2",
    );

    // Assess
    expect(promoted).toMatchObject({ role: "primary", epoch: 1, db_status: "up" });
    expect(repointed).toMatchObject({ primary_node_id: "n2", epoch: 1 });
    expect(await redisRole(newNode)).toBe("master");
    expect(await redisRole(oldNode)).toBe("slave");
    expect(candidate.logger.find("command applied")?.attributes).toMatchObject({ commandType: "PROMOTE" });
    // The heartbeat that shows the new role may be written before the command's log line (a
    // fresh-clone CI run read the log in between): wait for the line, do not race it.
    const applied = await waitFor(
      () => oldPrimary.logger.find("command applied"),
      "n1's command applied line",
    );
    expect(applied?.attributes).toMatchObject({ commandType: "REPLICAOF" });
  });

  it("ignores a command whose epoch is below the highest applied, with a log line", async () => {
    // Prepare: the replica applies a REPLICAOF at epoch 2 (to the primary it already follows).
    fixture = new AgentFixture();
    const [primaryNode, replicaNode] = await fixture.startRedis(2);
    if (!primaryNode || !replicaNode) throw new Error("redis nodes missing");
    await fixture.setTopology(undefined, {
      epoch: 2,
      primary_node_id: "n1",
      primary_address: primaryNode.address,
      status: "online",
    });
    await fixture.startAgent(primaryNode, { nodeId: "n1" });
    const replica = await fixture.startAgent(replicaNode, { nodeId: "n2" });
    await fixture.send(
      "n2",
      fixture.command("REPLICAOF", 2, { primary: { node_id: "n1", address: primaryNode.address } }),
    );
    await fixture.waitForHeartbeat("n2", (hb) => hb.epoch === 2, "n2 at epoch 2");

    // Act
    const stale = fixture.command("PROMOTE", 1);
    await fixture.send("n2", stale);
    const ignored = await waitFor(() => replica.logger.find("command ignored"), "ignore log line");
    // Negative check: the ignored command must not take effect later either; 500 ms is 2.5 heartbeats.
    await holdsFor(async () => (await redisRole(replicaNode)) === "slave", "n2 still a replica", 500);

    // Assess
    expect(ignored.attributes).toMatchObject({ commandId: stale.command_id, commandEpoch: 1 });
    expect(String(ignored.attributes.reason)).toMatch(/below the highest applied epoch 2/);
    expect(await redisRole(replicaNode)).toBe("slave");
    expect(await fixture.heartbeatOf("n2")).toMatchObject({ role: "replica", epoch: 2 });
  });

  it("ignores a command id it already applied", async () => {
    // Prepare: PROMOTE applied, then an operator turns the node back into a replica by hand.
    fixture = new AgentFixture();
    const [primaryNode, replicaNode] = await fixture.startRedis(2);
    if (!primaryNode || !replicaNode) throw new Error("redis nodes missing");
    await fixture.startAgent(primaryNode, { nodeId: "n1" });
    const replica = await fixture.startAgent(replicaNode, { nodeId: "n2" });
    await failoverAt1(primaryNode, replicaNode);
    const promote = fixture.command("PROMOTE", 1);
    await fixture.send("n2", promote);
    await fixture.waitForHeartbeat("n2", (hb) => hb.role === "primary", "n2 primary");
    const client = replicaNode.client();
    await client.replicaof("127.0.0.1", primaryNode.port);
    client.disconnect();

    // Act: the same message is delivered again (SQS is at-least-once).
    await fixture.send("n2", promote);
    const ignored = await waitFor(() => replica.logger.find("command ignored"), "ignore log line");
    // Negative check: the ignored command must not take effect later either; 500 ms is 2.5 heartbeats.
    await holdsFor(async () => (await redisRole(replicaNode)) === "slave", "n2 still a replica", 500);

    // Assess
    expect(ignored.attributes.reason).toBe(`command ${promote.command_id} was already applied`);
    expect(await redisRole(replicaNode)).toBe("slave");
  });

  it("survives malformed commands and goes on applying good ones", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [primaryNode, replicaNode] = await fixture.startRedis(2);
    if (!primaryNode || !replicaNode) throw new Error("redis nodes missing");
    await fixture.startAgent(primaryNode, { nodeId: "n1" });
    const replica = await fixture.startAgent(replicaNode, { nodeId: "n2" });
    const queueUrl = await fixture.aws.bus.ensureQueue(fixture.shard, "n2");
    const sqs = sqsClient();
    await failoverAt1(primaryNode, replicaNode);

    // Act
    for (const body of [
      "not json at all",
      JSON.stringify({ type: "REBOOT", shard: fixture.shard, epoch: 1 }),
    ]) {
      await sqs.send(new SendMessageCommand({ QueueUrl: queueUrl, MessageBody: body }));
    }
    await fixture.send(
      "n2",
      fixture.command("REPLICAOF", 1, { primary: { node_id: "n2", address: replicaNode.address } }),
    );
    await waitFor(
      () =>
        replica.logger.lines.filter((line) => line.message.startsWith("command rejected")).length >= 3 ||
        undefined,
      "three rejections",
    );
    await fixture.send("n2", fixture.command("PROMOTE", 1));
    const promoted = await fixture.waitForHeartbeat("n2", (hb) => hb.role === "primary", "n2 primary");
    sqs.destroy();

    // Assess
    const reasons = replica.logger.lines
      .filter((line) => line.message.startsWith("command rejected"))
      .map((line) => String(line.attributes.reason));
    expect(reasons.some((reason) => reason.includes("not JSON"))).toBe(true);
    expect(reasons.some((reason) => reason.includes("type"))).toBe(true);
    expect(reasons.some((reason) => reason.includes("replicate from itself"))).toBe(true);
    expect(promoted.epoch).toBe(1);
    expect(replica.handle.status().role).toBe("primary");
  });

  it("retries a command that failed while its database was down soon after the database returns", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [primaryNode, replicaNode] = await fixture.startRedis(2);
    if (!primaryNode || !replicaNode) throw new Error("redis nodes missing");
    await fixture.startAgent(primaryNode, { nodeId: "n1" });
    const replica = await fixture.startAgent(replicaNode, { nodeId: "n2" });
    await fixture.waitForHeartbeat("n2", (hb) => hb.primary_link === "up", "replica link up");
    replicaNode.signal("SIGKILL");
    await fixture.waitForHeartbeat("n2", (hb) => hb.db_status === "down", "reported down");
    await failoverAt1(primaryNode, replicaNode);

    // Act
    await fixture.send("n2", fixture.command("PROMOTE", 1));
    await waitFor(() => replica.logger.find("command failed; left for redelivery"), "failed attempt");
    await replicaNode.start({ replicaOf: primaryNode.address });
    const backAt = Date.now();
    await fixture.waitForHeartbeat("n2", (hb) => hb.role === "primary" && hb.epoch === 1, "promoted", 15_000);
    const retriedWithinMs = Date.now() - backAt;

    // Assess: well within the queue's 30 s visibility timeout.
    expect(retriedWithinMs).toBeLessThan(8000);
    expect(await redisRole(replicaNode)).toBe("master");
  });

  it("finishes a command in flight when stopped, and deletes it only after it took effect", async () => {
    // Prepare: a database whose promotion waits for the test, so that the stop lands mid-command.
    fixture = new AgentFixture();
    const [primaryNode, replicaNode] = await fixture.startRedis(2);
    if (!primaryNode || !replicaNode) throw new Error("redis nodes missing");
    await fixture.startAgent(primaryNode, { nodeId: "n1" });
    const promotionStarted = Promise.withResolvers<void>();
    const go = Promise.withResolvers<void>();
    const gated = new GatedPromotion(replicaNode.address, promotionStarted.resolve, go.promise);
    const replica = await fixture.startAgent(replicaNode, { nodeId: "n2" }, fixture.aws, { database: gated });
    await failoverAt1(primaryNode, replicaNode);
    const promote = fixture.command("PROMOTE", 1);

    // Act: stop while PROMOTE is mid-command, then let the promotion finish.
    await fixture.send("n2", promote);
    await promotionStarted.promise;
    const stopped = replica.handle.stop();
    go.resolve();
    await stopped;

    // Assess
    expect(await redisRole(replicaNode)).toBe("master");
    expect(await fixture.heartbeatOf("n2")).toMatchObject({ role: "primary", epoch: 1 });
    const state = JSON.parse(readFileSync(join(replica.stateDir, "state.json"), "utf8"));
    expect(state.applied_command_ids).toContain(promote.command_id);
    const queueUrl = await fixture.aws.bus.ensureQueue(fixture.shard, "n2");
    const sqs = sqsClient();
    const { Attributes } = await sqs.send(
      new GetQueueAttributesCommand({
        QueueUrl: queueUrl,
        AttributeNames: ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
      }),
    );
    sqs.destroy();
    expect(Attributes).toMatchObject({
      ApproximateNumberOfMessages: "0",
      ApproximateNumberOfMessagesNotVisible: "0",
    });
  });

  it("holds writes on PAUSE_WRITES of a switchover away from the node for the given time", async () => {
    // Prepare
    fixture = new AgentFixture();
    const [primaryNode] = await fixture.startRedis(1);
    if (!primaryNode) throw new Error("redis node missing");
    const primary = await fixture.startAgent(primaryNode, { nodeId: "n1" });
    await planChange(
      "switchover",
      1,
      { id: "n1", address: primaryNode.address },
      { id: "n2", address: "127.0.0.1:1" },
    );

    // Act
    await fixture.send("n1", fixture.command("PAUSE_WRITES", 1, { timeout_ms: 1500 }));
    await waitFor(() => primary.logger.find("command applied"), "PAUSE_WRITES applied");
    const client = primaryNode.client();
    const started = Date.now();
    // PUBLISH: held by a write pause like every command that may replicate, but not refused by the
    // write fence (NOREPLICAS) that the agent puts on a primary with a failover away from it.
    await client.publish("paused", "1");
    const heldMs = Date.now() - started;
    client.disconnect();

    // Assess
    expect(heldMs).toBeGreaterThan(500);
  });
});
