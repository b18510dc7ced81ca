import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { requestSwitchover, SWITCHOVER_ATTEMPTS } from "../../src/controller/requests.ts";
import { NOW } from "../support/builders.ts";
import { MemoryShard } from "../support/memory-shard.ts";
import { settled } from "../support/settled.ts";

/**
 * A switchover whose epoch bump finds the decision stale wrote nothing: the old primary's agent
 * moved its replica set between the read under the lock and the bump (CI saw it on round 11 of
 * the operator CLI's 20 switchovers). The request decides again instead of failing the operator,
 * a bounded number of times.
 */

beforeEach(() => {
  vi.useFakeTimers({ now: NOW });
});

afterEach(() => {
  vi.useRealTimers();
});

describe("a switchover that finds the old primary's replica set moved at its epoch bump", () => {
  it("decides again and completes when the set moved once", async () => {
    // Prepare: the first topology write finds the replica set one version on.
    const shard = new MemoryShard();
    let writes = 0;
    shard.beforeTopologyWrite = () => {
      writes += 1;
      if (writes === 1) shard.replicaSetVersion += 1;
    };

    // Act
    const result = await settled(requestSwitchover(shard.deps(), "s1", { to: "r1" }));

    // Assess
    expect(result).toMatchObject({ outcome: "completed", epoch: 4, primary: "r1" });
    expect(shard.topology).toMatchObject({ status: "online", epoch: 4, primary_node_id: "r1" });
    expect(shard.history).toMatchObject([{ epoch: 4, kind: "switchover" }]);
    expect(shard.lock?.expires_at).toBe(0);
  });

  it("decides again and completes when the primary looked not alive for the read under the lock", async () => {
    // Prepare: the read under the first attempt's lock finds p1's heartbeat past the failure
    // timeout (late for a moment on a loaded host: a fresh-clone CI run, round 18 of the operator
    // CLI's 20 switchovers, aborted with "the shard changed while locking: primary p1 is not alive").
    const shard = new MemoryShard();
    let late = 0;
    shard.onSnapshot = (read) => {
      if (shard.lock === undefined || shard.lock.expires_at === 0 || late > 0) return read;
      late += 1;
      const stale = (shard.now() - 10 * shard.config.failureTimeoutMs) * 1000;
      return {
        ...read,
        nodes: read.nodes.map((node) =>
          node.node_id === "p1" ? { ...node, last_updated: stale, agent_updated: stale } : node,
        ),
      };
    };

    // Act
    const result = await settled(requestSwitchover(shard.deps(), "s1", { to: "r1" }));

    // Assess: one read found p1 late; the next attempt decided again and completed.
    expect(late).toBe(1);
    expect(result).toMatchObject({ outcome: "completed", epoch: 4, primary: "r1" });
    expect(shard.history).toMatchObject([{ epoch: 4, kind: "switchover" }]);
    expect(shard.lock?.expires_at).toBe(0);
  });

  it("gives up with lost_race and nothing changed when the set moves at every attempt", async () => {
    // Prepare
    const shard = new MemoryShard();
    const before = shard.topology;
    shard.beforeTopologyWrite = () => {
      shard.replicaSetVersion += 1;
    };

    // Act
    const result = await settled(requestSwitchover(shard.deps(), "s1", { to: "r1" }));

    // Assess
    expect(result.outcome).toBe("lost_race");
    expect(result.reason).toMatch(
      /replica set of p1 changed from version \d+ since the decision; try again$/,
    );
    expect(shard.replicaSetVersion).toBe(1 + SWITCHOVER_ATTEMPTS);
    expect(shard.topology).toBe(before);
    expect(shard.sent).toEqual([]);
    expect(shard.lock?.expires_at).toBe(0);
  });
});
