import { afterEach, describe, expect, it } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture } from "../support/agent-harness.ts";
import { countKeys, roleOf, withClient, writeKeys } from "../support/chaos-cluster.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Simulator seed 343143 (guarantee 3, every node back following the primary; 372957 and, on the
 * controller's side, 7046 are the same hole), with real redis-server processes and one real agent.
 * Redis clears a replica's `master_replid2` on a full sync. n1, primary on lineage L, saves its
 * RDB at offset p; n3 takes more of L (to q > p) and is promoted (lineage A, continuing L up to q);
 * n1's database dies and comes back from its RDB under a new replication id D continuing L up to p
 * (Redis 7). n2 full-syncs from it: it stands on D with no earlier lineage (the premise, checked).
 * Its agent starts, linked on D. The topology then names n3 (epoch 1, the link L -> A at q recorded
 * in `ancestry`), n3 hung (SIGSTOP): the agent points n2 at n3, and parks it after three silent
 * probes, before any sync. n3 wakes: it holds all of n2's data (L up to q >= p).
 *
 * On the code before e15de62 (7f22c89) n2 stays parked (REPLICAOF 127.0.0.1 1) for good at that
 * epoch: its probe judges n2 on D alone, which n3 neither continues nor (by the recorded history)
 * supersedes, and the topology's repoint to the address it is parked from waits (`staysParked`).
 * Now the agent remembers n1's `master_replid2` (L up to p) while n2 is linked on D
 * (`rememberPrior`, src/core/identity.ts), judges n3 on it and follows it; the heartbeats it wrote
 * while parked carry that earlier lineage as `prior_lineage` (the controller's side, seed 7046).
 *
 * Limits: no controller runs (the test writes the topology as one would, with n3's promotion
 * recorded in `ancestry`); only n2 has an agent, n1 and n3 are set up by hand (REPLICAOF NO ONE,
 * SIGKILL and restart from the RDB). The bound after n3 wakes is 30 s, many 200 ms cycles; the
 * old code's failure is that bound running out with n2 still parked, not a proof that it never
 * unparks. The controller's ranking of n2 is not exercised, only the heartbeat field it reads.
 */

const PREFIX = "remembered-prior";
/** Keys in n1's RDB (L up to p), and keys after it that only n3 keeps (L up to q). */
const SAVED_KEYS = 100;
const LATER_KEYS = 50;
/** How long n2 has to follow n3 once it wakes: the old code never does at this epoch. */
const FOLLOW_MS = 30_000;
const NO_PRIOR = "0000000000000000000000000000000000000000";

let fixture: AgentFixture | undefined;
let hung: RedisNode | undefined;

afterEach(async () => {
  hung?.signal("SIGCONT");
  hung = undefined;
  await fixture?.close();
  fixture = undefined;
});

/** INFO replication of `node` as fields. */
async function replication(node: RedisNode): Promise<Record<string, string>> {
  const text = await withClient(node, (client) => client.info("replication"));
  const fields: Record<string, string> = {};
  for (const line of text.split("\n")) {
    const at = line.indexOf(":");
    if (at > 0) fields[line.slice(0, at)] = line.slice(at + 1).trim();
  }
  return fields;
}

describe("a parked replica that full-synced from a primary continuing an earlier lineage (simulator seed 343143)", () => {
  it("follows a later primary holding all of its data through that earlier lineage", {
    timeout: 150_000,
  }, async () => {
    // Arrange: n1 primary on lineage L, n2 and n3 its replicas (no agents yet).
    const active = new AgentFixture();
    fixture = active;
    const [n1, n2, n3] = await active.startRedis(3);
    if (!n1 || !n2 || !n3) throw new Error("redis nodes missing");
    await writeKeys(n1, `${PREFIX}:saved`, SAVED_KEYS, 2);
    await withClient(n1, (client) => client.save());
    const lineageL = (await replication(n1)).master_replid ?? "";
    const savedAt = Number((await replication(n1)).master_repl_offset);
    // L past the RDB (to q), acknowledged by both replicas; then n3 is promoted: lineage A.
    await writeKeys(n1, `${PREFIX}:later`, LATER_KEYS, 2);
    await withClient(n3, (client) => client.call("REPLICAOF", "NO", "ONE"));
    const promoted = await replication(n3);
    expect(promoted.master_replid2, "n3's lineage A continues L").toBe(lineageL);
    const until = Number(promoted.second_repl_offset) - 1;
    expect(until, "n3 holds L past n1's RDB").toBeGreaterThan(savedAt);
    // n1's database dies and comes back from its RDB: a new id D continuing L up to p. n2 (at q on
    // L, past what D continues) full-syncs from it.
    n1.signal("SIGKILL");
    await n1.stop();
    await n1.start();
    const restarted = await replication(n1);
    expect(restarted.master_replid2, "n1 back on a new id continuing L").toBe(lineageL);
    const lineageD = restarted.master_replid ?? "";
    await waitFor(
      async () => {
        const info = await replication(n2);
        return info.master_link_status === "up" && info.master_replid === lineageD;
      },
      "n2 synced from n1 on D",
      30_000,
    );
    // The premise: the full sync left n2 on D with no earlier lineage, n1 shows L as its own.
    const synced = await replication(n2);
    expect(synced.master_replid2, "n2's earlier lineage cleared by the full sync").toBe(NO_PRIOR);
    expect(await countKeys(n2, `${PREFIX}:saved`, SAVED_KEYS)).toBe(SAVED_KEYS);
    expect(await countKeys(n2, `${PREFIX}:later`, LATER_KEYS)).toBe(0);
    // n2's agent starts with the topology naming n1, and probes n1 while linked on D.
    await active.setTopology(undefined, {
      epoch: 0,
      primary_node_id: "n1",
      primary_address: n1.address,
      status: "online",
    });
    const agent = await active.startAgent(n2, { nodeId: "n2" });
    await active.waitForHeartbeat(
      "n2",
      (hb) => hb.primary_link === "up" && hb.repl_id === lineageD && hb.primary_probe === "ok",
      "n2 linked on D, its probe answered by n1",
      30_000,
    );

    // Act: n3 hangs; the topology names it (epoch 1, n3's promotion recorded); n2's agent points n2
    // at it and parks it after its silent probes, before any sync.
    n3.signal("SIGSTOP");
    hung = n3;
    await active.setTopology(0, {
      epoch: 1,
      primary_node_id: "n3",
      primary_address: n3.address,
      status: "online",
      ancestry: [{ repl_id: lineageL, until, by: promoted.master_replid ?? "" }],
    });
    await waitFor(
      async () => (await roleOf(n2)).primaryPort === PARKED_PORT,
      "n2 parked by its agent from the silent n3",
      30_000,
    );
    expect(
      agent.logger.lines.some(
        (line) => line.message === "following the topology's primary" && line.attributes.primary === "n3",
      ),
      "n2's agent pointed it at n3 before the park",
    ).toBe(true);
    const parked = await replication(n2);
    expect(parked.master_replid, "n2 still on D, never synced from n3").toBe(lineageD);
    expect(parked.master_replid2).toBe(NO_PRIOR);
    const heartbeatsBefore = agent.heartbeats.written.length;
    n3.signal("SIGCONT");
    hung = undefined;
    const wokeAt = performance.now();

    // Assess: n2 follows n3 (the old code left it parked) and gets every key, L up to q.
    try {
      await waitFor(
        async () => {
          const role = await roleOf(n2);
          return role.role === "slave" && role.primaryPort === n3.port && role.state === "connected";
        },
        "n2 following n3",
        FOLLOW_MS,
      );
    } catch (error) {
      const role = await roleOf(n2);
      const unparked = agent.logger.lines.filter((line) => /unpark/.test(line.message)).length;
      throw new Error(
        `n2 not following n3 ${Math.round(performance.now() - wokeAt)} ms after n3 woke: ROLE ${role.role} of ` +
          `port ${role.primaryPort} (${role.state}; parked is port ${PARKED_PORT}), ${unparked} unpark line(s)\n` +
          `${error instanceof Error ? error.message : String(error)}`,
      );
    }
    console.log(`n2 following n3 ${Math.round(performance.now() - wokeAt)} ms after n3 woke`);
    const unparked = agent.logger.lines.filter((line) => /^replica unparked/.test(line.message)).at(-1);
    expect(String(unparked?.attributes.why ?? ""), "unparked by its probe of n3").toBe(
      "a process continuing its lineage",
    );
    await waitFor(
      async () => (await countKeys(n2, `${PREFIX}:later`, LATER_KEYS)) === LATER_KEYS,
      "n2 holding n3's keys",
      30_000,
    );
    expect(await countKeys(n2, `${PREFIX}:saved`, SAVED_KEYS)).toBe(SAVED_KEYS);
    // The heartbeats n2 wrote parked on D reported L (up to p at most) as its earlier lineage.
    const parkedBeats = agent.heartbeats.written
      .slice(0, heartbeatsBefore)
      .filter((hb) => hb.repl_id === lineageD && hb.primary_link !== "up");
    expect(parkedBeats.length, "heartbeats written while parked").toBeGreaterThan(0);
    for (const hb of parkedBeats) {
      expect(hb.prior_lineage?.repl_id).toBe(lineageL);
      expect(hb.prior_lineage?.last_txn_id ?? Number.POSITIVE_INFINITY).toBeLessThanOrEqual(savedAt);
    }
  });
});
