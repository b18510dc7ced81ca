import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  countKeys,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";
import { missingKeys } from "../support/data-safety.ts";

/**
 * Nemesis seed 7351 (guarantee 3), with real processes: gate `priority_zero_ahead_offline` holds an
 * offline shard for a drained node that alone holds the most data, and its reason names
 * `shardguard undrain` as the way out; the code before refused an undrain on an offline shard ("the
 * shard changed since it was read (offline at epoch N); try again"), so nothing could lift the hold.
 *
 * node-1 primary; node-3 drained while online. node-2 is cut off from node-1 (its handshake
 * refused: a wrong `masterauth`), so node-1's agent drops it from the replica set and node-3 alone
 * acknowledges the next writes (`WAIT 1`). node-1's host crashes (agent and database): node-2 is
 * outside the old primary's set and node-3 is drained, so nobody is eligible and the shard goes
 * offline. node-1's agent comes back without its database; offline, node-2 is eligible but behind
 * node-3, and the gate holds. The undrain the reason names brings the shard online on node-3 with
 * every acknowledged write.
 */

const PREFIX = "undrain-offline";
const COUNT = 50;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** `writeKeys` as a wait's probe: whether the writes went through, acknowledged by `replicas` replicas. */
function acknowledged(node: RedisNode, prefix: string, count: number, replicas: number): Promise<boolean> {
  return writeKeys(node, prefix, count, replicas).then(
    () => true,
    () => false,
  );
}

/** Keys `<prefix>:0..count-1`, as `writeKeys` writes them. */
function keysOf(prefix: string, count: number): string[] {
  return Array.from({ length: count }, (_, index) => `${prefix}:${index}`);
}

describe("shardguard undrain on an offline shard", () => {
  it("lifts priority_zero_ahead_offline: the shard comes back on the drained node that alone holds every acknowledged write", {
    timeout: 240_000,
  }, async () => {
    // Prepare: writes every replica acknowledged, then node-3 drained while online.
    const startedAt = performance.now();
    cluster = await startChaosCluster({ readyTimeoutMs: 120_000 });
    const active = cluster;
    const upAt = performance.now();
    // The guard may still count a member just attached short of good (NOREPLICAS): until it does not.
    await active.waitFor(
      "writes both replicas acknowledge",
      () => acknowledged(active.node("node-1"), `${PREFIX}:before`, COUNT, 2),
      WAIT_MS,
    );
    const drained = await shardguard(active, "drain", "--shard", active.shard, "--node", "node-3", "--json");
    expect(drained.code, drained.stderr).toBe(0);
    expect(JSON.parse(drained.stdout)).toMatchObject({ ok: true, outcome: "drained" });

    // node-2 cannot resync: node-1 refuses its AUTH (no password is set there).
    await withClient(active.node("node-2"), async (client) => {
      await client.config("SET", "masterauth", "not-the-primary-password");
      await client.call("CLIENT", "KILL", "TYPE", "master");
    });
    await active.waitFor(
      "node-2 out of node-1's stored replica set, node-3 still in it",
      async () => {
        const members = (await active.snapshot()).replicaSets["node-1"] ?? [];
        return !members.includes("node-2") && members.includes("node-3");
      },
      WAIT_MS,
    );
    // node-1's write guard may still count node-2 until the agent lowers it: until a write goes through.
    await active.waitFor(
      "writes node-3 alone acknowledges",
      () => acknowledged(active.node("node-1"), `${PREFIX}:ahead`, COUNT, 1),
      WAIT_MS,
    );
    const written = [...keysOf(`${PREFIX}:before`, COUNT), ...keysOf(`${PREFIX}:ahead`, COUNT)];
    // The fault's shape: node-3 alone holds the last acknowledged writes.
    expect({
      "node-2": await countKeys(active.node("node-2"), `${PREFIX}:ahead`, COUNT),
      "node-3": await countKeys(active.node("node-3"), `${PREFIX}:ahead`, COUNT),
    }).toEqual({ "node-2": 0, "node-3": COUNT });
    const epoch = (await active.topology())?.epoch ?? 0;

    // Act: node-1's host crashes, its agent with its database (an agent that saw its database die
    // would lift the replica-set rule, and the failover would wait online, gate priority_zero_ahead):
    // nobody is eligible (node-2 outside node-1's set, node-3 drained) and the shard goes offline.
    await active.stopAgent("node-1", "SIGKILL");
    active.node("node-1").signal("SIGKILL");
    const killedAt = performance.now();
    let offlineEpoch = 0;
    await active.waitFor(
      "the shard offline",
      async () => {
        const topology = await active.topology();
        offlineEpoch = topology?.epoch ?? 0;
        return topology?.status === "offline";
      },
      WAIT_MS,
    );
    const offlineAt = performance.now();
    // The host is back with its agent, not its database (unheard, node-1 could still take writes:
    // gate unfenced_old_primary would hold first). node-2 may follow whichever node comes back.
    active.startAgent("node-1");
    await withClient(active.node("node-2"), (client) => client.config("SET", "masterauth", ""));
    // What the controller decides, as `shardguard status` gives it (`decide()` on the stored
    // reports; the controller logs a repeated code once per 30 s, whatever gate gives it).
    let hold: { code?: string; reason?: string } | undefined;
    await active.waitFor(
      "the controller holding the offline shard for node-3 (gate priority_zero_ahead_offline)",
      async () => {
        const status = await shardguard(active, "status", "--shard", active.shard, "--json");
        const controller = JSON.parse(status.stdout).shards[0]?.controller;
        hold = controller;
        return (
          controller?.code === "offline_no_candidate" &&
          /^shard offline; not bringing it back on node-2 .* node-3 \(drained, ranked priority 0, .*priority 0 is never promoted/.test(
            String(controller.reason),
          )
        );
      },
      // node-1's agent starts (a process start, slow on a loaded machine) before the gate is reached.
      2 * WAIT_MS,
    );
    const heldAt = performance.now();
    const reason = String(hold?.reason);
    console.log(`held: ${reason}`);
    const named = /\(shardguard (undrain --shard \S+ --node node-3)\)/.exec(reason)?.[1];
    expect(named).toBe(`undrain --shard ${active.shard} --node node-3`);
    const held = await active.topology();

    // Act: the way out the reason names.
    const undrained = await shardguard(active, ...(named ?? "").split(" "), "--json");
    console.log(`undrain: exit ${undrained.code} ${undrained.stdout.trim()} ${undrained.stderr.trim()}`);

    // Assess: the undrain goes through; the shard comes back on node-3 with every acknowledged write.
    expect(held).toMatchObject({ status: "offline", epoch: offlineEpoch, drained: ["node-3"] });
    expect(offlineEpoch).toBeGreaterThan(epoch);
    expect(undrained.code, undrained.stderr).toBe(0);
    expect(JSON.parse(undrained.stdout)).toMatchObject({ ok: true, outcome: "undrained" });
    const online = await waitForNewPrimary(active, offlineEpoch);
    const onlineAt = performance.now();
    expect(online.primary_node_id).toBe("node-3");
    expect(online.drained).toBeUndefined();
    expect((await roleOf(active.node("node-3"))).role).toBe("master");
    expect(await missingKeys(active.node("node-3"), written)).toEqual([]);
    // node-3 takes writes node-2 acknowledges: a writable primary (guarantee 3).
    await waitForFollowers(active, "node-3", ["node-2"]);
    await active.waitFor(
      "node-3 taking a write node-2 acknowledges",
      () => acknowledged(active.node("node-3"), `${PREFIX}:after`, 1, 1),
      WAIT_MS,
    );
    expect(await missingKeys(active.node("node-2"), written)).toEqual([]);
    const span = (from: number, to: number) => `${((to - from) / 1000).toFixed(1)} s`;
    console.log(
      `cluster up ${span(startedAt, upAt)}, fault shaped ${span(upAt, killedAt)}, offline ${span(killedAt, offlineAt)} after the crash, ` +
        `held ${span(offlineAt, heldAt)} later, online on node-3 ${span(heldAt, onlineAt)} after the hold was seen, settled ${span(onlineAt, performance.now())}`,
    );
  });
});
