import type { Redis } from "ioredis";
import { afterEach, describe, expect, it } from "vitest";
import type { Topology } from "../../src/core/model.ts";
import { AgentFixture } from "../support/agent-harness.ts";
import { cycleUntil } from "../support/controller-cycles.ts";
import { aScriptedShard, controller } from "../support/scripted-shard.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Nemesis seed 6303 (guarantee 2): primary node-22r's agent was dead when its only member
 * restarted empty; the shard went offline, naming no primary, and an operator's recover brought it
 * online on that member. The successor fenced only the primary the topology named (none) and the
 * node it followed (none), so node-22r kept `min-replicas-to-write 1` unfenced; when a replica with
 * no agent attached to it, Redis counted that replica and node-22r took `WAIT 1`-acknowledged writes
 * beside the new primary for 135 s. Now the offline topology keeps its old primaries
 * (`topology.deposed`, src/core/depose.ts `deposedWhenOffline`), and the node brought online fences
 * each before it opens its writes (`deposedAddresses`).
 */

let fixture: AgentFixture | undefined;

afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

/** One write and `WAIT 1`: "acked" when a replica acknowledged it, else the error's first word. */
async function tryWrite(client: Redis, key: string): Promise<string> {
  try {
    await client.set(key, "v");
    const acked = Number(await client.call("WAIT", "1", "500"));
    return acked >= 1 ? "acked" : "unacknowledged";
  } catch (error) {
    return error instanceof Error ? (error.message.split(" ")[0] ?? "error") : String(error);
  }
}

describe("an old primary the shard went offline from", () => {
  it("is kept in the offline topology, carried into the bring-online, and kept once the shard is online while its agent is unheard", async () => {
    // Prepare: p1 primary on lineage-a; both replicas on a lineage of their own (restarted empty).
    const shard = aScriptedShard();
    shard.node("p1", { role: "primary", primary: undefined, primary_link: undefined });
    shard.node("r1", { repl_id: "lineage-r1", txn: 10 });
    shard.node("r2", { repl_id: "lineage-r2", txn: 5 });
    await shard.start();
    const written: Topology[] = [];
    const store = shard.aws.store;
    const { deps } = controller(shard, {
      store: {
        ...store,
        topology: {
          ...store.topology,
          compareAndSet: async (...args: Parameters<typeof store.topology.compareAndSet>) => {
            const done = await store.topology.compareAndSet(...args);
            if (done) written.push(args[2]);
            return done;
          },
        },
      },
    });
    const p1Address = (await store.topology.read(shard.shard))?.primary_address;
    shard.kill("p1");
    await shard.waitUntilStale("p1");

    // Act 1: no node continues p1's lineage.
    await cycleUntil(deps, shard.shard, (result) => result.outcome === "offline");
    const offline = await store.topology.read(shard.shard);

    // Act 2: r1 now holds p1's lineage (as after an operator's recover onto a copy); the shard comes back on it.
    Object.assign(shard.get("r1"), { repl_id: "lineage-a", txn: 1000 });
    await cycleUntil(deps, shard.shard, (result) => result.outcome === "completed");
    const online = await store.topology.read(shard.shard);

    // Assess
    expect(offline).toMatchObject({ status: "offline", deposed: [{ node_id: "p1", address: p1Address }] });
    expect(offline?.primary_node_id).toBeUndefined();
    const promoting = written.filter((topology) => topology.status === "failing_over");
    expect(promoting.length).toBeGreaterThan(0);
    for (const topology of promoting) expect(topology.deposed).toEqual(offline?.deposed);
    expect(online).toMatchObject({ status: "online", primary_node_id: "r1" });
    // p1's agent never reported it a replica since: later promotions fence it too (nemesis seed 6811).
    expect(online?.deposed).toEqual(offline?.deposed);
  });

  it("is fenced by the node the shard is brought online on, so a replica with no agent cannot make it writable", async () => {
    // Prepare: n1, the old primary with no agent, keeps the guard its dead agent left (1 replica,
    // 10 s); n2 is brought online; `outsider` is a database with no agent.
    fixture = new AgentFixture();
    const active = fixture;
    const [n1, n2, outsider] = await active.startRedis(3);
    if (!n1 || !n2 || !outsider) throw new Error("redis nodes missing");
    const old = n1.client();
    const outside = outsider.client();
    try {
      // n2 restarted empty (it follows nobody) and the outsider is a database of its own.
      for (const node of [n2, outsider]) {
        const client = node.client();
        await client.call("REPLICAOF", "NO", "ONE");
        client.disconnect();
      }
      await old.config("SET", "min-replicas-max-lag", "10");
      await old.config("SET", "min-replicas-to-write", "1");
      await active.setTopology(undefined, {
        epoch: 5,
        status: "offline",
        lineage: { node_id: "n1", repl_id: "lineage-of-n1", last_txn_id: 0 },
        deposed: [{ node_id: "n1", address: n1.address }],
      });
      await active.startAgent(n2, { nodeId: "n2" });
      await active.waitForHeartbeat("n2", (hb) => hb.db_status === "up", "n2 reporting");
      await active.setTopology(5, {
        epoch: 6,
        status: "failing_over",
        phase: "promote",
        deposed: [{ node_id: "n1", address: n1.address }],
        failover: {
          kind: "bring_online",
          new_primary_node_id: "n2",
          new_primary_address: n2.address,
          reason: "test: recover",
          started_at: Date.now(),
          candidates: [],
          phase_started: {},
        },
      });

      // Act: n2 is promoted, then the outsider attaches to n1.
      await active.send("n2", active.command("PROMOTE", 6));
      await active.waitForHeartbeat("n2", (hb) => hb.role === "primary" && hb.epoch === 6, "promoted");
      const [host, port] = n1.address.split(":");
      await outside.call("REPLICAOF", host ?? "127.0.0.1", port ?? "0");
      await waitFor(
        async () =>
          (await outside.info("replication")).includes("master_link_status:up") ? true : undefined,
        "the outsider linked to n1",
        10_000,
      );
      // Redis counts a replica good once it acknowledged within the lag (REPLCONF ACK every
      // second, counted by its once-a-second cron): every write is tried for 3 s past the link.
      let attempt = 0;
      await holdsFor(
        async () => (await tryWrite(old, `after-${attempt++}`)) === "NOREPLICAS",
        "n1 refuses every write while the outsider is linked to it",
        3000,
      );

      // Assess: the fence n2 set (on the code before, n1 kept its guard of 1 and the outsider acknowledged the writes).
      expect(await old.config("GET", "min-replicas-to-write")).toEqual(["min-replicas-to-write", "1000000"]);
      expect(attempt).toBeGreaterThan(3);
    } finally {
      old.disconnect();
      outside.disconnect();
    }
  });
});
