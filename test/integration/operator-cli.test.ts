import { afterEach, describe, expect, it } from "vitest";
import { LocalCluster } from "../../src/dev/local-cluster.ts";
import { WriteWorkload } from "../../src/dev/workload/writer.ts";
import { shardguard } from "../support/cli.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Fast timings so a switchover takes about a second on this machine; a failure timeout of 2 s, not
 * 1 s: a switchover is refused while the primary's heartbeat is older than it, and on a loaded host
 * (a fresh-clone CI run at load 19) a 250 ms heartbeat ran a second late.
 */
const CONFIG = {
  heartbeatIntervalMs: 250,
  failureTimeoutMs: 2000,
  fenceTimeoutMs: 600,
  tickIntervalMs: 200,
  lockLeaseMs: 5000,
};

let cluster: LocalCluster | undefined;
let writer: WriteWorkload | undefined;

afterEach(async () => {
  await writer?.stop();
  await cluster?.stop();
  writer = undefined;
  cluster = undefined;
});

describe("operator CLI against real agents", () => {
  it("runs 20 switchovers under continuous writes without losing an acknowledged write", {
    timeout: 240_000,
  }, async () => {
    // Prepare
    cluster = await LocalCluster.start({ config: CONFIG });
    const active = cluster;
    writer = new WriteWorkload({ resolvePrimary: () => active.primaryAddress() });
    writer.start();
    await active.waitFor("writes acknowledged", () => (writer?.stats().acked ?? 0) > 50, 10_000);
    const moves: Array<{ from: string | undefined; to: string | undefined }> = [];

    // Act
    for (let round = 1; round <= 20; round++) {
      const before = await active.topology();
      const to =
        round % 4 === 0 ? active.redis.find((node) => node.id !== before?.primary_node_id)?.id : undefined;
      const result = await shardguard(
        active,
        "switchover",
        "--shard",
        active.shard,
        "--json",
        ...(to ? ["--to", to] : []),
      );
      expect(result.code, `round ${round}: ${result.stderr}${result.stdout}`).toBe(0);
      const response = JSON.parse(result.stdout);
      expect(response).toMatchObject({ ok: true, outcome: "completed", epoch: round });
      if (to) expect(response.primary).toBe(to);
      moves.push({ from: before?.primary_node_id, to: response.primary });
      // Every node follows the new primary before the next round, as an operator would wait.
      await active.waitFor(
        `round ${round}: replicas following ${response.primary}`,
        async () => {
          const snapshot = await active.snapshot();
          return snapshot.nodes.every(
            (node) =>
              node.node_id === response.primary ||
              (node.role === "replica" &&
                node.primary_node_id === response.primary &&
                node.primary_link === "up"),
          );
        },
        20_000,
      );
    }
    await active.waitFor(
      "writes on the last primary",
      async () => {
        const address = await active.primaryAddress();
        return writer?.stats().lastAck?.address === address;
      },
      10_000,
    );
    await writer.stop();
    const finalPrimary = active.node(moves.at(-1)?.to ?? "");
    const client = finalPrimary.client();
    const verified = await writer.verify(client);
    client.disconnect();
    const status = JSON.parse((await shardguard(active, "status", "--shard", active.shard, "--json")).stdout);
    const history = JSON.parse(
      (await shardguard(active, "history", "--shard", active.shard, "--json")).stdout,
    );
    const primary = await shardguard(active, "primary", "--shard", active.shard);

    // Assess
    expect(verified.checked).toBeGreaterThan(100);
    expect(verified.lost).toEqual([]);
    expect(status.shards[0]).toMatchObject({
      shard: active.shard,
      status: "online",
      epoch: 20,
      primary: { node_id: finalPrimary.id, address: finalPrimary.address },
    });
    expect(status.shards[0].nodes.filter((node: { role: string }) => node.role === "primary")).toHaveLength(
      1,
    );
    expect(history.history.map((record: { epoch: number }) => record.epoch)).toEqual(
      Array.from({ length: 20 }, (_, index) => 20 - index),
    );
    expect(
      history.history.map((record: { old_primary_node_id: string; new_primary_node_id: string }) => ({
        from: record.old_primary_node_id,
        to: record.new_primary_node_id,
      })),
    ).toEqual([...moves].reverse());
    expect(history.history.every((record: { kind: string }) => record.kind === "switchover")).toBe(true);
    expect(primary).toMatchObject({ code: 0, stdout: `${finalPrimary.address}\n` });
  });

  it("takes no automatic action while paused and fails over once resumed", { timeout: 120_000 }, async () => {
    // Prepare
    cluster = await LocalCluster.start({ config: CONFIG });
    const paused = await shardguard(
      cluster,
      "pause",
      "--shard",
      cluster.shard,
      "--reason",
      "kernel upgrade",
      "--json",
    );
    expect(paused.code, paused.stderr).toBe(0);

    // Act: the primary dies during maintenance.
    cluster.node("node-1").signal("SIGKILL");
    // Negative check: unpaused, a controller ticking every 200 ms replaces a primary dead for
    // failureTimeoutMs (1 s) within about 1.5 s; 5 s of the topology unchanged shows the pause holds.
    const pausedShard = cluster;
    await holdsFor(
      async () => {
        const topology = await pausedShard.topology();
        return topology?.status === "paused" && topology.epoch === 0;
      },
      "the shard paused at epoch 0",
      CONFIG.failureTimeoutMs * 5,
      200,
    );
    const during = await cluster.topology();
    const status = JSON.parse(
      (await shardguard(cluster, "status", "--shard", cluster.shard, "--json")).stdout,
    );
    const resumed = await shardguard(cluster, "resume", "--shard", cluster.shard, "--json");
    const active = cluster;
    await active.waitFor(
      "a failover after resume",
      async () => {
        const topology = await active.topology();
        return topology?.status === "online" && topology.epoch === 1;
      },
      30_000,
    );
    const after = await cluster.topology();
    const history = JSON.parse(
      (await shardguard(cluster, "history", "--shard", cluster.shard, "--json")).stdout,
    );

    // Assess
    expect(during).toMatchObject({
      status: "paused",
      epoch: 0,
      primary_node_id: "node-1",
      paused_reason: "kernel upgrade",
    });
    expect(status.shards[0]).toMatchObject({ status: "paused", epoch: 0, paused_reason: "kernel upgrade" });
    expect(
      status.shards[0].nodes.find((node: { node_id: string }) => node.node_id === "node-1").db_status,
    ).toBe("down");
    expect(resumed.code, resumed.stderr).toBe(0);
    expect(after?.primary_node_id).not.toBe("node-1");
    expect(history.history).toHaveLength(1);
    expect(history.history[0]).toMatchObject({ kind: "failover", old_primary_node_id: "node-1", epoch: 1 });
  });

  it("answers an unknown shard with a one-line error and a non-zero exit", { timeout: 60_000 }, async () => {
    cluster = await LocalCluster.start({ config: CONFIG, nodes: 1 });
    for (const args of [
      ["status", "--shard", "no-such-shard"],
      ["history", "--shard", "no-such-shard"],
      ["primary", "--shard", "no-such-shard"],
      ["switchover", "--shard", "no-such-shard"],
    ]) {
      const result = await shardguard(cluster, ...args);
      expect(result.code, args.join(" ")).not.toBe(0);
      expect(result.stderr.trim().split("\n")).toEqual([
        expect.stringMatching(`unknown shard "no-such-shard" \\(known shards: .*${cluster.shard}`),
      ]);
    }
  });
});
