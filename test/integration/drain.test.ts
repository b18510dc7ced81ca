import { afterEach, describe, expect, it } from "vitest";
import { LocalCluster } from "../../src/dev/local-cluster.ts";
import { WriteWorkload } from "../../src/dev/workload/writer.ts";
import { CHAOS_CONFIG } from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Issue 34, item 3: `shardguard drain` / `undrain` with real redis-server, agents, controller and
 * the CLI, under a steady `WAIT 1` writer. Draining the primary switches over away from it first
 * (zero loss); the drained node restarts (empty, as an upgrade from a config without data would)
 * without a failover; bad requests are refused with one line. Fast timings (CHAOS_CONFIG), so that
 * a restart the controller would take for a failure shows within seconds.
 */

/** stderr without the note that the request runs in-process (no controller function is set here). */
function errorLines(stderr: string): string[] {
  return stderr
    .trim()
    .split("\n")
    .filter((line) => !line.endsWith("in-process"));
}

let cluster: LocalCluster | undefined;
let writer: WriteWorkload | undefined;

afterEach(async () => {
  await writer?.stop();
  await cluster?.stop();
  writer = undefined;
  cluster = undefined;
});

describe("shardguard drain and undrain against real agents", () => {
  it("drains the primary with a zero-loss switchover, restarts it without a failover, and undrains it", {
    timeout: 240_000,
  }, async () => {
    // Prepare
    cluster = await LocalCluster.start({ config: CHAOS_CONFIG, readyTimeoutMs: 120_000 });
    const active = cluster;
    writer = new WriteWorkload({ resolvePrimary: () => active.primaryAddress(), waitReplicas: 1 });
    writer.start();
    await waitFor(() => (writer?.stats().acked ?? 0) > 50, "acknowledged writes", 15_000);
    const [first, second, third] = active.redis.map((node) => node.id) as [string, string, string];
    const before = await active.topology();
    expect(before?.primary_node_id).toBe(first);

    // Act: drain the primary, wait until it follows the new one.
    const drained = await shardguard(
      active,
      "drain",
      "--shard",
      active.shard,
      "--node",
      first,
      "--wait",
      "--json",
    );
    const status = JSON.parse((await shardguard(active, "status", "--shard", active.shard, "--json")).stdout);
    const text = (await shardguard(active, "status", "--shard", active.shard)).stdout;

    // Assess: a switchover away from it, then drained.
    expect(drained.code, drained.stderr).toBe(0);
    const response = JSON.parse(drained.stdout);
    expect(response).toMatchObject({ ok: true, outcome: "drained" });
    expect([second, third]).toContain(response.primary);
    expect(status.shards[0].drained).toEqual([first]);
    expect(status.shards[0].nodes.find((node: { node_id: string }) => node.node_id === first)).toMatchObject({
      drained: true,
      role: "replica",
    });
    expect(text).toMatch(`drained: ${first}`);
    const afterDrain = await active.topology();
    expect(afterDrain).toMatchObject({
      status: "online",
      drained: [first],
      primary_node_id: response.primary,
    });

    // Act: restart the drained node's redis-server, empty, as a replica of the primary.
    const node = active.node(first);
    const primaryAddress = afterDrain?.primary_address as string;
    const restartedAt = performance.now();
    await node.stop();
    node.wipeData();
    await node.start({ replicaOf: primaryAddress });

    // Assess: no failover for five failure timeouts (epoch and primary unchanged), writes go on.
    await holdsFor(
      async () => {
        const topology = await active.topology();
        return topology?.epoch === afterDrain?.epoch && topology?.status === "online";
      },
      "no failover while the drained node restarts",
      5 * CHAOS_CONFIG.failureTimeoutMs,
    );
    await active.waitFor(
      `${first} back as a replica of ${response.primary}`,
      async () =>
        (await active.snapshot()).nodes.some(
          (heartbeat) =>
            heartbeat.node_id === first &&
            heartbeat.role === "replica" &&
            heartbeat.primary_node_id === response.primary &&
            heartbeat.primary_link === "up",
        ),
      30_000,
    );
    const acks = writer.acks().filter((ack) => ack.at > restartedAt);
    let longest = 0;
    for (let index = 1; index < acks.length; index++) {
      longest = Math.max(longest, (acks[index]?.at ?? 0) - (acks[index - 1]?.at ?? 0));
    }
    process.stderr.write(
      `drained replica restart: ${acks.length} acknowledged writes after it, longest gap ${Math.round(longest)} ms\n`,
    );
    expect(acks.length).toBeGreaterThan(0);

    // Act: undrain.
    const undrained = await shardguard(active, "undrain", "--shard", active.shard, "--node", first, "--json");

    // Assess
    expect(undrained.code, undrained.stderr).toBe(0);
    expect(JSON.parse(undrained.stdout)).toMatchObject({ ok: true, outcome: "undrained" });
    expect((await active.topology())?.drained).toBeUndefined();
    await writer.stop();
    const client = active.node(response.primary).client();
    const verified = await writer.verify(client);
    client.disconnect();
    expect(verified.checked).toBeGreaterThan(100);
    expect(verified.lost).toEqual([]);
  });

  it("refuses an unknown node and the last eligible node with one line each, changing nothing", {
    timeout: 120_000,
  }, async () => {
    // Prepare
    cluster = await LocalCluster.start({ config: CHAOS_CONFIG, readyTimeoutMs: 120_000 });
    const active = cluster;
    const [, second, third] = active.redis.map((node) => node.id) as [string, string, string];
    const drainedOne = await shardguard(active, "drain", "--shard", active.shard, "--node", second);
    const before = await active.topology();

    // Act
    const unknown = await shardguard(active, "drain", "--shard", active.shard, "--node", "nobody");
    const last = await shardguard(active, "drain", "--shard", active.shard, "--node", third);

    // Assess
    expect(drainedOne.code, drainedOne.stderr).toBe(0);
    expect(unknown.code).not.toBe(0);
    expect(errorLines(unknown.stderr)).toEqual([
      expect.stringMatching(
        /^shardguard: drain of shard \S+: unknown node nobody: shard \S+ has node-1, node-2, node-3$/,
      ),
    ]);
    expect(last.code).not.toBe(0);
    expect(errorLines(last.stderr)).toEqual([
      expect.stringMatching(
        new RegExp(`^shardguard: drain of shard \\S+: draining ${third} would leave no node to fail over to`),
      ),
    ]);
    expect(await active.topology()).toEqual(before);
  });
});
