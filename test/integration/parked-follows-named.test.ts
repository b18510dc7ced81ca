import { afterEach, describe, expect, it } from "vitest";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, type TestAgent } from "../support/agent-harness.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Simulator seed 250903 (docs/simulation.md, Results) with real processes: n1's
 * database died, its agent with it; n2's agent parked n2 (its primary's connection closed), and the
 * failover to n2 reached its `promote` phase, but n2's PROMOTE was late (the controller froze).
 * n1's database came back from its RDB: Redis 7 loads it under a new replication id, the shard's
 * as `master_replid2`, a process continuing n2's lineage. Before the fix n2's probe unparked n2
 * toward n1 ("replica unparked: its primary is back … a process continuing its lineage"): the
 * failover's own target followed the deposed primary onto a lineage the shard's history does not
 * record. Now a parked replica follows again by itself only the primary the topology stands for, or
 * when it names none (src/agent/primary-probe.ts, `#namedPrimary`): n2 waits parked for its own
 * PROMOTE. The second case pins that the same restart still unparks n2 while the topology names n1.
 * Real redis-server processes and agents, DynamoDB Local and SQS (loopback); the topology is
 * written as the frozen controller left it, no controller runs.
 */

const KEYS = 100;
/**
 * How long n2 must stay parked once n1 is back and n2's probe reaches it: on the code before, n2's
 * probe unparked it at the first probe that found n1 answering (one heartbeat cycle, 200 ms); many
 * cycles more, on a loaded machine.
 */
const HOLD_MS = 6000;
const WAIT_MS = 15_000;

let fixture: AgentFixture | undefined;

afterEach(async () => {
  await fixture?.close();
  fixture = undefined;
});

/** INFO replication of `node` as one string. */
async function replicationOf(node: RedisNode): Promise<string> {
  const client = node.client({ maxRetriesPerRequest: 0, lazyConnect: true });
  try {
    await client.connect();
    return await client.info("replication");
  } finally {
    client.disconnect();
  }
}

function field(info: string, name: string): string | undefined {
  return new RegExp(`^${name}:(.*)$`, "m").exec(info)?.[1]?.trim();
}

/**
 * n1 primary at epoch 0 with KEYS keys (and the pair's own), all on n2 and on n1's disk; n1's agent stops, its
 * database dies (SIGKILL), and n2's agent parks n2. `beforeRestart` then sets the topology; n1's
 * database comes back from its RDB (no agent: it stays a master), continuing n2's lineage.
 */
async function parkedThenPrimaryBack(
  active: AgentFixture,
  beforeRestart: (nodes: { n1: RedisNode; n2: RedisNode; n2Agent: TestAgent }) => Promise<void>,
): Promise<{ n1: RedisNode; n2: RedisNode; n2Agent: TestAgent; keys: number }> {
  const { n1, n2, n1Agent, n2Agent } = await active.linkedPair();
  const writer = n1.client();
  let keys: number;
  try {
    // No PING from n1 until it dies: a PING after the SAVE would put n2 ahead of n1's RDB.
    await writer.config("SET", "repl-ping-replica-period", "3600");
    for (let index = 0; index < KEYS; index++) await writer.set(`key-${index}`, "v");
    keys = await writer.dbsize();
    expect(Number(await writer.call("WAIT", "1", "5000"))).toBe(1);
    await active.stopAgent(n1Agent);
    await writer.save();
    n1.signal("SIGKILL");
  } finally {
    writer.disconnect();
  }
  await n1.stop();
  await waitFor(() => n2Agent.logger.find(/replica parked/), "n2 parked", WAIT_MS);
  expect(field(await replicationOf(n2), "master_port")).toBe("1");
  const before = await replicationOf(n2);
  await beforeRestart({ n1, n2, n2Agent });

  await n1.start();
  // n1 is back as a process continuing n2's lineage: a new id, n2's as its earlier one.
  const back = await replicationOf(n1);
  expect(field(back, "role")).toBe("master");
  expect(field(back, "master_replid2")).toBe(field(before, "master_replid"));
  expect(Number(field(back, "master_repl_offset"))).toBeGreaterThanOrEqual(
    Number(field(before, "master_repl_offset")),
  );
  return { n1, n2, n2Agent, keys };
}

describe("a parked replica whose deposed primary comes back continuing its lineage", () => {
  it("stays parked while the topology names itself, the failover's target past its promote phase (simulator seed 250903)", {
    timeout: 60_000,
  }, async () => {
    // Prepare: n2 parked from n1; the failover to n2 at epoch 1 is at its promote phase, its PROMOTE
    // not sent (the controller froze), and n2's agent has read it.
    fixture = new AgentFixture();
    const active = fixture;

    // Act: n1's database is back from its RDB.
    const { n1, n2, n2Agent, keys } = await parkedThenPrimaryBack(active, async ({ n1, n2, n2Agent }) => {
      await active.setTopology(0, {
        epoch: 1,
        primary_node_id: "n1",
        primary_address: n1.address,
        status: "failing_over",
        phase: "promote",
        failover: {
          kind: "failover",
          old_primary_node_id: "n1",
          new_primary_node_id: "n2",
          new_primary_address: n2.address,
          reason: "test: n1 down, PROMOTE late",
          started_at: Date.now(),
          candidates: [],
          phase_started: {},
        },
      });
      await waitFor(
        () => n2Agent.logger.find(/the topology names this node primary but its database is a replica/),
        "n2's agent read the failover to itself",
        WAIT_MS,
      );
    });
    // n2's probe reaches the restarted n1 (its client name on n1's connections).
    const seen = n1.client();
    try {
      await waitFor(
        async () => String(await seen.call("CLIENT", "LIST")).includes("name=shardguard-probe.n2."),
        "n2's probe connected to the restarted n1",
        WAIT_MS,
      );
    } finally {
      seen.disconnect();
    }

    // Assess: n2 stays parked (on the code before, it replicated from n1 within a probe cycle or
    // two), and its agent logs no unpark.
    await holdsFor(
      async () => {
        const info = await replicationOf(n2);
        const unparked = n2Agent.logger.find(/replica unparked/);
        if (field(info, "master_port") !== "1" || unparked !== undefined)
          throw new Error(
            `n2 follows ${field(info, "master_host")}:${field(info, "master_port")} ` +
              `(link ${field(info, "master_link_status")}); agent: ${unparked?.message ?? "no unpark logged"} ` +
              `${JSON.stringify(unparked?.attributes ?? {})}`,
          );
        return true;
      },
      "n2 parked while the topology names it the failover's target",
      HOLD_MS,
      200,
    );
    expect(n2Agent.logger.find(/replica unparked/)).toBeUndefined();
    const replica = n2.client();
    try {
      expect(await replica.dbsize()).toBe(keys);
    } finally {
      replica.disconnect();
    }
  });

  it("follows it again while the topology names it (the fix does not hold back the named primary)", {
    timeout: 60_000,
  }, async () => {
    // Prepare: n2 parked from n1; the topology still names n1 at epoch 0 (no failover).
    fixture = new AgentFixture();
    const active = fixture;

    // Act: n1's database is back from its RDB.
    const { n1, n2, n2Agent, keys } = await parkedThenPrimaryBack(active, async () => {});

    // Assess: n2's agent unparks it toward n1, and n2 links up with every key.
    const unparked = await waitFor(
      () => n2Agent.logger.find(/replica unparked/),
      "n2 unparked toward the restarted n1",
      WAIT_MS,
    );
    expect(JSON.stringify(unparked.attributes)).toContain("continuing its lineage");
    await waitFor(
      async () => {
        const info = await replicationOf(n2);
        return field(info, "master_port") === String(n1.port) && field(info, "master_link_status") === "up";
      },
      "n2 linked to n1",
      WAIT_MS,
    );
    const replica = n2.client();
    try {
      expect(await replica.dbsize()).toBe(keys);
    } finally {
      replica.disconnect();
    }
  });
});
