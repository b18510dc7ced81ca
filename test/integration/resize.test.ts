import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import { LocalCluster } from "../../src/dev/local-cluster.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { WriteWorkload } from "../../src/dev/workload/writer.ts";
import { CHAOS_CONFIG, withClient } from "../support/chaos-cluster.ts";
import { type CliResult, shardguard } from "../support/cli.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Issue 34, item 3: resizing and replacing nodes the way docs/runbook.md says, with real
 * redis-server, agents, controller and the CLI, under a steady `WAIT 1` writer: grow 3 → 5 (new ids,
 * redis started fenced, an agent beside each), shrink back to 3 (drain, stop, decommission), then
 * replace a dead node by a new id at its old address. Each step ends with the primary's replica
 * set and its write guard (`min-replicas-to-write`) matching the nodes that run, and no
 * acknowledged write is lost.
 */

const STEP_MS = 60_000;

let cluster: LocalCluster | undefined;
let writer: WriteWorkload | undefined;

afterEach(async () => {
  await writer?.stop();
  await cluster?.stop();
  writer = undefined;
  cluster = undefined;
});

/** Starts a node as docs/deploy.md says (fenced until its agent read the topology) and its agent. */
async function addNode(active: LocalCluster, id: string, port?: number): Promise<RedisNode> {
  const node = new RedisNode(port ?? (await freePort()), id);
  active.redis.push(node);
  await node.start({ extraArgs: ["--min-replicas-to-write", "1000000", "--min-replicas-max-lag", "10"] });
  active.startAgent(id);
  return node;
}

/** The primary's stored replica set and its database's `min-replicas-to-write`, once both match `members`. */
async function waitForGuard(active: LocalCluster, members: readonly string[]): Promise<void> {
  const expected = [...members].sort();
  let seen = "";
  try {
    await waitFor(
      async () => {
        const topology = await active.topology();
        const primary = topology?.primary_node_id;
        if (primary === undefined) return false;
        const stored = [...((await active.snapshot()).replicaSets[primary] ?? [])].sort();
        const reply = (await withClient(active.node(primary), (client) =>
          client.config("GET", "min-replicas-to-write"),
        )) as string[];
        seen = `set [${stored.join(", ")}], min-replicas-to-write ${reply[1]}`;
        return stored.join() === expected.join() && Number(reply[1]) === expected.length;
      },
      `the primary's replica set [${expected.join(", ")}] guarded`,
      STEP_MS,
    );
  } catch (error) {
    throw new Error(`${error instanceof Error ? error.message : String(error)}; last seen: ${seen}`);
  }
}

/**
 * `shardguard decommission` of a node whose agent was just stopped: refused while its last report
 * stands (its keepalive plus the failure timeout), then done; any other refusal is returned as is.
 */
async function decommission(active: LocalCluster, id: string): Promise<CliResult> {
  for (const deadline = performance.now() + STEP_MS; ; ) {
    const result = await shardguard(active, "decommission", "--shard", active.shard, "--node", id, "--json");
    if (result.code === 0 || !result.stderr.includes(`refused: ${id}'s agent reported`)) return result;
    if (performance.now() > deadline) return result;
    await delay(500); // the refusal's own window, a few seconds at CHAOS_CONFIG: no condition to wait on here
  }
}

/** Acknowledged writes after `since` (performance.now()): the writer went on through the step. */
function ackedSince(since: number): number {
  return writer?.acks().filter((ack) => ack.at > since).length ?? 0;
}

describe("resizing and replacing nodes", () => {
  it("grows 3 → 5, shrinks back to 3 and replaces a dead node at its address, losing no acknowledged write", {
    timeout: 420_000,
  }, async () => {
    // Prepare
    cluster = await LocalCluster.start({ config: CHAOS_CONFIG, readyTimeoutMs: 120_000 });
    const active = cluster;
    writer = new WriteWorkload({ resolvePrimary: () => active.primaryAddress(), waitReplicas: 1 });
    writer.start();
    await waitFor(() => (writer?.stats().acked ?? 0) > 50, "acknowledged writes", 15_000);
    await waitForGuard(active, ["node-2", "node-3"]);

    // Act: grow to five.
    let since = performance.now();
    await addNode(active, "node-4");
    await addNode(active, "node-5");
    // Assess: both joined the set and the guard; writes went on.
    await waitForGuard(active, ["node-2", "node-3", "node-4", "node-5"]);
    expect(ackedSince(since)).toBeGreaterThan(0);

    // Act: shrink back: drain, stop, decommission each.
    since = performance.now();
    for (const id of ["node-4", "node-5"]) {
      const drained = await shardguard(active, "drain", "--shard", active.shard, "--node", id, "--json");
      expect(drained.code, drained.stderr).toBe(0);
      await active.stopAgent(id, "SIGTERM");
      await active.node(id).destroy();
      const retired = await decommission(active, id);
      expect(retired.code, retired.stderr).toBe(0);
      // The topology forgets the retired id's drain (status would list it for good otherwise).
      const undrained = await shardguard(active, "undrain", "--shard", active.shard, "--node", id, "--json");
      expect(undrained.code, undrained.stderr).toBe(0);
    }
    expect((await active.topology())?.drained).toBeUndefined();
    // Assess
    await waitForGuard(active, ["node-2", "node-3"]);
    expect(ackedSince(since)).toBeGreaterThan(0);

    // Act: node-3 dies for good; node-6 replaces it at the same address under a new id.
    since = performance.now();
    const dead = active.node("node-3");
    await active.stopAgent("node-3", "SIGKILL");
    await dead.destroy();
    await waitForGuard(active, ["node-2"]);
    await addNode(active, "node-6", dead.port);
    const retired = await decommission(active, "node-3");
    expect(retired.code, retired.stderr).toBe(0);
    // Assess: node-6 joined under its own id; node-3 is in no set.
    await waitForGuard(active, ["node-2", "node-6"]);
    expect(ackedSince(since)).toBeGreaterThan(0);
    const topology = await active.topology();
    expect(topology?.primary_node_id).toBe("node-1");
    await writer.stop();
    const client = active.node("node-1").client();
    const verified = await writer.verify(client);
    client.disconnect();
    expect(verified.checked).toBeGreaterThan(100);
    expect(verified.lost).toEqual([]);
  });
});
