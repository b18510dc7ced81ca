import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { requestSwitchover } from "../../src/controller/requests.ts";
import { deposedAddresses } from "../../src/core/depose.ts";
import type { Topology } from "../../src/core/model.ts";
import { NOW } from "../support/builders.ts";
import { MemoryShard } from "../support/memory-shard.ts";
import { settled } from "../support/settled.ts";

/**
 * Nemesis seed 6811 (guarantee 2): node-2, primary at epoch 26, had its agent killed and its redis
 * hung; node-22r, promoted at 27, could not fence it, and epoch 28 came before node-2 woke. Each
 * promotion fenced only its direct predecessor, so nothing fenced node-2 again: woken with its old
 * guard, it took writes a replica restarted with \`replicaof node-2\` acknowledged, lost when that
 * replica followed the real primary. Now the topology keeps every replaced primary not known
 * fenced (\`deposed\`, src/core/depose.ts \`deposedAfter\`) through later changes, online too, and
 * each promotion's target fences it (\`deposedAddresses\`).
 */

beforeEach(() => {
  vi.useFakeTimers({ now: NOW });
});

afterEach(() => {
  vi.useRealTimers();
});

/** A memory shard whose written topologies are recorded, and whose nodes in `deaf` obey nothing past PAUSE_WRITES. */
function shardWithDeaf(...ids: string[]) {
  const deaf = new Set(ids);
  const shard = new MemoryShard();
  const written: Topology[] = [];
  const store = shard.store();
  const bus = shard.bus();
  const deps = shard.deps({
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
    bus: {
      ...bus,
      send: async (shardId, node, command) => {
        if (deaf.has(node) && command.type !== "PAUSE_WRITES") return;
        await bus.send(shardId, node, command);
      },
    },
  });
  return { shard, written, deps, deaf };
}

describe("an old primary never known fenced, through a chain of changes while online", () => {
  it("stays on the topology's deposed list, and the promotion after next fences it (nemesis seed 6811)", async () => {
    // Prepare: p1's agent obeys nothing once its writes are paused (it dies mid-switchover).
    const { shard, written, deps } = shardWithDeaf("p1");

    // Act: p1 -> r1 (epoch 4), then r1 -> r2 (epoch 5).
    const first = await settled(requestSwitchover(deps, "s1", { to: "r1" }));
    const second = await settled(requestSwitchover(deps, "s1", { to: "r2" }));

    // Assess
    expect(first).toMatchObject({ outcome: "completed", epoch: 4, primary: "r1" });
    expect(second).toMatchObject({ outcome: "completed", epoch: 5, primary: "r2" });
    const plan = written.find((topology) => topology.epoch === 5 && topology.status === "failing_over");
    expect(plan?.deposed).toEqual([{ node_id: "p1", address: "p1.local:6379", epoch: 4 }]);
    const fenced = deposedAddresses({
      selfId: "r2",
      selfAddress: "r2.local:6379",
      topology: plan,
      followed: "r1.local:6379",
      ignore: [],
    });
    expect(fenced).toEqual(["r1.local:6379", "p1.local:6379"]);
    // r1's heartbeat went at the cleanup (its agent re-creates it when it runs): it stays too,
    // until a report of its own says it stood down.
    expect(shard.topology).toMatchObject({ status: "online", epoch: 5, primary_node_id: "r2" });
    expect(shard.topology?.deposed).toEqual([
      { node_id: "p1", address: "p1.local:6379", epoch: 4 },
      { node_id: "r1", address: "r1.local:6379", epoch: 5 },
    ]);
  });

  it("leaves the list once its own agent reports it a replica at that epoch or later", async () => {
    // Prepare: p1's agent stood down at epoch 4 and, after the cleanup, reports again.
    const { shard, written, deps } = shardWithDeaf();
    await settled(requestSwitchover(deps, "s1", { to: "r1" }));
    expect(shard.topology?.deposed).toEqual([{ node_id: "p1", address: "p1.local:6379", epoch: 4 }]);
    shard.nodes.set("p1", { role: "replica", primary: "r1", txn: 1000, epoch: 4 });

    // Act
    const second = await settled(requestSwitchover(deps, "s1", { to: "r2" }));

    // Assess: the plan no longer fences p1; r1, replaced, joins.
    expect(second).toMatchObject({ outcome: "completed", epoch: 5, primary: "r2" });
    const plan = written.find((topology) => topology.epoch === 5 && topology.status === "failing_over");
    expect(plan?.deposed).toBeUndefined();
    expect(shard.topology?.deposed).toEqual([{ node_id: "r1", address: "r1.local:6379", epoch: 5 }]);
  });

  it("stays while its own agent's last report is older than the epoch that deposed it", async () => {
    // Prepare: p1 reports again, a replica, but at epoch 3 (it never obeyed the change at 4).
    const { shard, written, deps } = shardWithDeaf("p1");
    await settled(requestSwitchover(deps, "s1", { to: "r1" }));
    shard.nodes.set("p1", { role: "replica", primary: "r1", txn: 1000, epoch: 3 });

    // Act
    await settled(requestSwitchover(deps, "s1", { to: "r2" }));

    // Assess
    const plan = written.find((topology) => topology.epoch === 5 && topology.status === "failing_over");
    expect(plan?.deposed).toEqual([{ node_id: "p1", address: "p1.local:6379", epoch: 4 }]);
  });

  it("leaves the list when it becomes the shard's primary again", async () => {
    // Prepare: p1, deposed at 4 and not known to have stood down, is back and follows r1.
    const { shard, written, deps, deaf } = shardWithDeaf("p1");
    await settled(requestSwitchover(deps, "s1", { to: "r1" }));
    shard.nodes.set("p1", { role: "replica", primary: "r1", txn: 1000, epoch: 3 });
    deaf.clear();

    // Act: back to p1, whose agent obeys again.
    const back = await settled(requestSwitchover(deps, "s1", { to: "p1" }));

    // Assess: neither the plan (p1 its target) nor the online topology keeps p1.
    expect(back).toMatchObject({ outcome: "completed", epoch: 5, primary: "p1" });
    const atFive = written.filter((topology) => topology.epoch === 5);
    expect(atFive.length).toBeGreaterThan(1);
    for (const topology of atFive)
      expect(topology.deposed?.map((entry) => entry.node_id) ?? []).not.toContain("p1");
    expect(shard.topology?.deposed).toEqual([{ node_id: "r1", address: "r1.local:6379", epoch: 5 }]);
  });
});
