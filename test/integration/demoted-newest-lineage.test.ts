import { afterEach, describe, expect, it, onTestFailed } from "vitest";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import { type CycleResult, runShardCycle } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Heartbeat, Topology } from "../../src/core/model.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, type TestAgent } from "../support/agent-harness.ts";
import { awsEnv } from "../support/aws.ts";
import { countKeys, probeWrite, replicationOf, withClient, writeKeys } from "../support/chaos-cluster.ts";
import { Gate, type TestController, testController } from "../support/frozen-controller.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Simulator seed 7008's path with a real master (guarantee 1), fixed in 017e802, with real
 * redis-server processes and agents, DynamoDB Local and SQS, and an in-process controller.
 *
 * n1 was the shard's first primary (lineage L1); n2 was promoted from it (lineage L2, recorded in
 * `topology.ancestry` as L1 -> L2 at the promotion's offset, epoch 1); the agents point n1 and n3
 * at n2, and both acknowledge the A keys; n1 and n2 save their RDBs there. n1's database dies; n2
 * takes the B keys, which n3 alone acknowledges (`WAIT 1`). The three agents die (their state dirs
 * keep epoch 1); n3 is parked (`REPLICAOF 127.0.0.1 1`, as its agent parks a replica whose
 * connection closes) and n2's database dies. n1's comes back from its RDB as a master (a restarted
 * node: Redis 7 gives it a new replication id R, continuing L2 up to A); n2's comes back from its
 * older RDB with `replicaof` n1 in its config and syncs onto R: the shard's named primary is a
 * replica of the restarted node, holding L1 and A only. n1 is then parked too: n2's link to it
 * times out (`repl-timeout` 2 s, as the chaos tests set it) and n1 refuses the new sync
 * (-NOMASTERLINK). The agents start again: no node follows n2, the online topology stores no
 * lineage, and n3 alone holds every acknowledged key (L2 up to B).
 *
 * A controller cycle then judges n2, demoted past the failure timeout. Since 017e802 its
 * replacement is judged by the newest lineage of the shard's history (online-view.ts
 * `historyTip`: L2, up to n3's offset): n3 is promoted and the shard keeps every key. The code
 * before judged it by n2's own lineage R: n3 was "foreign replication lineage", n1 (on R) outside
 * n2's replica set, so the shard went offline on R and was brought back on n1; n3 full-synced
 * from it and the B keys were gone from every node (measured on 017e802^, below the assertion).
 *
 * Limits: the redis-server states after the agents die are set up by hand (SAVE, SIGKILL,
 * restarts, the two parks and n2's `repl-timeout`), as no fault of the harness makes a restarted
 * named primary sync from a restarted node; the topology (epoch 1, n2 named, the promotion's link
 * in `ancestry`) is written as a controller writes one. The agents, DynamoDB Local, SQS and the
 * controller's decisions and commands are real.
 */

/**
 * The in-process controller: the agents' cycle (FAST_TIMINGS), a failure timeout four times theirs
 * so that live nodes stay fresh under load, a lease longer than the whole cycle, no cool-down.
 */
const CONFIG = parseFailoverConfig({
  heartbeatIntervalMs: 200,
  failureTimeoutMs: 4000,
  fenceTimeoutMs: 600,
  lockLeaseMs: 20_000,
  cooldownMs: 0,
});
const PREFIX = "demoted-newest-lineage";
/** Keys on L1 (n1 primary), on L2 acknowledged by both replicas (A), on L2 acknowledged by n3 only (B). */
const L1_KEYS = 100;
const A_KEYS = 200;
const B_KEYS = 300;
/** Generous bound for anything that waits on processes (other tests share the two cores). */
const WAIT_MS = 30_000;

let fixture: AgentFixture | undefined;
const controllers: TestController[] = [];

afterEach(async () => {
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  await fixture?.close();
  fixture = undefined;
});

/** `node` a replica of the server on `port` with its link up. */
async function linkedTo(node: RedisNode, port: number): Promise<boolean> {
  const info = await replicationOf(node);
  return info.primary?.port === port && info.primary.link === "up";
}

/** What a test reads of a topology the controller wrote. */
function brief(topology: Topology) {
  return {
    epoch: topology.epoch,
    status: topology.status,
    phase: topology.phase,
    primary: topology.primary_node_id,
    target: topology.failover?.new_primary_node_id,
    lineage: topology.lineage,
  };
}

/** The acknowledged keys `node` holds, per part. */
async function keysOn(node: RedisNode) {
  return {
    l1: await countKeys(node, `${PREFIX}:l1`, L1_KEYS),
    a: await countKeys(node, `${PREFIX}:a`, A_KEYS),
    b: await countKeys(node, `${PREFIX}:b`, B_KEYS),
  };
}

describe("a demoted primary that no replica follows, on a restarted node's lineage (simulator seed 7008)", () => {
  it("is replaced by the holder of the newest lineage of the shard's history, with every acknowledged key", {
    timeout: 150_000,
  }, async () => {
    // Arrange 1: n1 primary on L1, n2 and n3 its replicas; n2 promoted (L2, continuing L1), n1 and
    // n3 follow it (their agents point them at it) and acknowledge the A keys.
    const active = new AgentFixture();
    fixture = active;
    const [n1, n2, n3] = await active.startRedis(3);
    if (!n1 || !n2 || !n3) throw new Error("redis nodes missing");
    await writeKeys(n1, `${PREFIX}:l1`, L1_KEYS, 2);
    const lineageL1 = (await replicationOf(n1)).replId;
    await withClient(n2, (client) => client.call("REPLICAOF", "NO", "ONE"));
    const promoted = await replicationOf(n2);
    const lineageL2 = promoted.replId;
    expect(promoted.prior?.replId, "n2's lineage L2 continues L1").toBe(lineageL1);
    const ancestry = [{ repl_id: lineageL1, until: promoted.prior?.offset ?? 0, by: lineageL2 }];
    // The online topology names n2 (epoch 1, its promotion's link recorded, no stored lineage);
    // the three agents start: n1's steps n1 down to n2, n3's repoints n3 to it (each agent keeps
    // epoch 1 in its state dir).
    await active.setTopology(undefined, {
      epoch: 1,
      primary_node_id: "n2",
      primary_address: n2.address,
      status: "online",
      ancestry,
    });
    const agents: [string, TestAgent][] = [];
    const startAgents = async (stateDirs?: ReadonlyMap<string, string>) => {
      for (const [id, node] of [
        ["n1", n1],
        ["n2", n2],
        ["n3", n3],
      ] as const) {
        const stateDir = stateDirs?.get(id);
        agents.push([id, await active.startAgent(node, { nodeId: id, ...(stateDir ? { stateDir } : {}) })]);
      }
    };
    await startAgents();
    onTestFailed(() => {
      for (const [id, agent] of agents) {
        for (const line of agent.logger.lines.filter((entry) => entry.level !== "debug")) {
          console.log(`${id} ${line.level} ${line.message} ${JSON.stringify(line.attributes).slice(0, 300)}`);
        }
      }
    });
    await waitFor(
      async () => (await linkedTo(n1, n2.port)) && (await linkedTo(n3, n2.port)),
      "n1 and n3 linked to n2 by their agents",
      WAIT_MS,
    );
    for (const id of ["n1", "n3"]) {
      await active.waitForHeartbeat(
        id,
        (hb) => hb.primary_node_id === "n2" && hb.primary_link === "up" && hb.repl_id === lineageL2,
        "linked to n2 on L2",
        WAIT_MS,
      );
    }
    await waitFor(
      async () => {
        const members = (await active.snapshot()).replicaSets.n2 ?? [];
        return members.includes("n1") && members.includes("n3");
      },
      "n1 and n3 in n2's replica set",
      WAIT_MS,
    );
    await waitFor(async () => (await probeWrite(n2, `${PREFIX}:probe`)).accepted, "n2 writable", WAIT_MS);
    await writeKeys(n2, `${PREFIX}:a`, A_KEYS, 2);
    const offsetA = (await replicationOf(n2)).offset;
    await waitFor(
      async () => (await replicationOf(n1)).offset >= offsetA,
      "n1 at n2's offset after the A keys",
      WAIT_MS,
    );
    // n1 and n2 save their RDBs here (L1 and A).
    await withClient(n1, (client) => client.call("SAVE"));
    await withClient(n2, (client) => client.call("SAVE"));

    // Arrange 2: n1's database dies; n2 takes the B keys, acknowledged by n3 alone (once n2's
    // write guard lets it write without n1).
    n1.signal("SIGKILL");
    await n1.stop();
    let refused = "";
    await waitFor(
      async () => {
        try {
          await writeKeys(n2, `${PREFIX}:b`, B_KEYS, 1);
          return true;
        } catch (error) {
          refused = error instanceof Error ? error.message : String(error);
          return false;
        }
      },
      "the B keys acknowledged by n3",
      WAIT_MS,
    ).catch((error: unknown) => {
      throw new Error(`${error instanceof Error ? error.message : String(error)}; last refusal: ${refused}`);
    });
    const offsetB = (await replicationOf(n2)).offset;
    await waitFor(
      async () => (await replicationOf(n3)).offset >= offsetB,
      "n3 at n2's offset after the B keys",
      WAIT_MS,
    );
    // The three agents die (they keep their state dirs: epoch 1). n3 is parked (as its agent parks
    // a replica whose connection closes) and n2's database dies.
    const stateDirs = new Map(agents.map(([id, agent]) => [id, agent.stateDir]));
    for (const [, agent] of agents.splice(0)) await active.stopAgent(agent);
    await withClient(n3, (client) => client.call("REPLICAOF", "127.0.0.1", String(PARKED_PORT)));
    n2.signal("SIGKILL");
    await n2.stop();

    // Arrange 3: n1 back from its RDB as a master on a new id R; n2 back from its older RDB as n1's
    // replica (its config's `replicaof`), synced onto R; then n1 parked: n2's link down.
    await n1.start();
    const restarted = await replicationOf(n1);
    const lineageR = restarted.replId;
    expect(restarted.role, "n1 back as a master").toBe("primary");
    expect(lineageR, "n1 back on a new replication id").not.toBe(lineageL2);
    await n2.start({ replicaOf: n1.address });
    await waitFor(
      async () => (await linkedTo(n2, n1.port)) && (await replicationOf(n2)).replId === lineageR,
      "n2 synced from n1 on R",
      WAIT_MS,
    );
    // The parked n1 sends n2 nothing: n2's link times out (2 s, as shortenReplicationTimeout sets
    // it) and n1 refuses the new sync (-NOMASTERLINK: it has no link of its own).
    await withClient(n2, (client) => client.config("SET", "repl-timeout", "2"));
    await withClient(n1, (client) => client.call("REPLICAOF", "127.0.0.1", String(PARKED_PORT)));
    await waitFor(
      async () => (await replicationOf(n2)).primary?.link === "down",
      "n2's link to the parked n1 down",
      WAIT_MS,
    );
    // The premise: n2 and n1 on R without the B keys, n3 parked on L2 with every key.
    expect(await keysOn(n2), "n2 (the named primary) holds L1 and A only").toEqual({
      l1: L1_KEYS,
      a: A_KEYS,
      b: 0,
    });
    expect(await keysOn(n1), "n1 holds L1 and A only").toEqual({ l1: L1_KEYS, a: A_KEYS, b: 0 });
    expect(await keysOn(n3), "n3 holds every acknowledged key").toEqual({
      l1: L1_KEYS,
      a: A_KEYS,
      b: B_KEYS,
    });
    expect((await replicationOf(n3)).replId, "n3 on L2").toBe(lineageL2);

    // Arrange 4: the three agents start again with their state dirs.
    await startAgents(stateDirs);
    // The shape the cycle decides on: n2 a replica of n1 (link down, on R) past the failure
    // timeout; n1 and n3 parked and fresh, n1 on R, n3 on L2 up to B; no node follows n2.
    const decidedOn = await waitFor(
      async () => {
        const shard = await active.snapshot();
        const now = Date.now() * 1000; // µs
        const of = (id: string) => shard.nodes.find((node) => node.node_id === id);
        const fresh = (hb: Heartbeat | undefined) =>
          hb !== undefined && now - (hb.agent_updated ?? hb.last_updated) < 1_000_000;
        const demoted = of("n2");
        const restartedNode = of("n1");
        const holder = of("n3");
        return (
          demoted !== undefined &&
          fresh(demoted) &&
          demoted.db_status === "up" &&
          demoted.role === "replica" &&
          demoted.primary_node_id === "n1" &&
          demoted.primary_link === "down" &&
          demoted.repl_id === lineageR &&
          now - (demoted.role_since ?? now) > (CONFIG.failureTimeoutMs + 1000) * 1000 &&
          fresh(restartedNode) &&
          restartedNode?.repl_id === lineageR &&
          restartedNode.primary_node_id === undefined &&
          restartedNode.primary_link === "down" &&
          fresh(holder) &&
          holder?.repl_id === lineageL2 &&
          holder.last_txn_id >= offsetB &&
          holder.primary_node_id === undefined &&
          holder.primary_link === "down" &&
          shard.nodes.every((node) => node.primary_node_id !== "n2") &&
          shard
        );
      },
      "n2 demoted past the failure timeout on R; n1 (R) and n3 (L2 up to B) parked and fresh",
      WAIT_MS,
    );
    for (const node of [n1, n3])
      expect((await replicationOf(node)).primary?.port, `${node.id} parked`).toBe(1);

    // Act: a controller cycle; every topology it writes is recorded.
    const written: Topology[] = [];
    const recorder = new Gate({
      name: "records the topology writes",
      matches: (call) => {
        if (call.op === "topology.compareAndSet") written.push(call.args[2] as Topology);
        return false;
      },
    });
    const controller = testController({ ...awsEnv() }, CONFIG, recorder);
    controllers.push(controller);
    const results: CycleResult[] = [await runShardCycle(controller.deps, active.shard)];
    const summary = () =>
      `cycles: ${JSON.stringify(results.map((result) => ({ outcome: result.outcome, reason: result.reason })))}; writes: ${JSON.stringify(
        written.map(brief),
      )}`;
    console.log(
      `decided on: ${JSON.stringify(
        decidedOn.nodes.map((hb) => ({
          id: hb.node_id,
          role: hb.role,
          repl: hb.repl_id.slice(0, 8),
          offset: hb.last_txn_id,
          primary: hb.primary_node_id,
          link: hb.primary_link,
          probe: hb.primary_probe,
        })),
      )}; L2 ${lineageL2.slice(0, 8)}, R ${lineageR.slice(0, 8)}, B at ${offsetB}; ${summary()}`,
    );

    // The shard online again (more cycles if the first stopped short). When another node than n3
    // serves, n3's sync from it is awaited (bounded): what that change cost, shown on failure.
    const online = await waitFor(
      async () => {
        const topology = (await active.snapshot()).topology;
        if (topology?.status === "online" && topology.epoch > 1) return topology;
        results.push(await runShardCycle(controller.deps, active.shard));
        return undefined;
      },
      "the shard online again",
      WAIT_MS,
      200,
    ).catch(() => undefined);
    const served = { n1, n2, n3 }[online?.primary_node_id ?? ""] as RedisNode | undefined;
    if (served !== undefined && served !== n3) {
      await waitFor(async () => linkedTo(n3, served.port), `n3 synced from ${served.id}`, WAIT_MS).catch(
        () => undefined,
      );
    }
    const held = `keys held (l1/a/b of ${L1_KEYS}/${A_KEYS}/${B_KEYS}): ${JSON.stringify({
      n1: await keysOn(n1),
      n2: await keysOn(n2),
      n3: await keysOn(n3),
    })}`;
    console.log(`online: ${online && JSON.stringify(brief(online))}; ${held}`);

    // Assess 1: the shard is neither taken offline nor failed over to n1 or back to n2 (the
    // restarted lineage R): the first change the controller writes promotes n3, L2's holder.
    const wrong = written.find(
      (topology) =>
        topology.status === "offline" ||
        (topology.failover !== undefined && topology.failover.new_primary_node_id !== "n3") ||
        (topology.status === "online" && topology.primary_node_id !== "n3"),
    );
    expect(
      wrong && brief(wrong),
      `a change onto the restarted lineage R: ${summary()}; ${held}`,
    ).toBeUndefined();
    expect(written[0]?.failover?.new_primary_node_id, `the first write fails over to n3: ${summary()}`).toBe(
      "n3",
    );

    // Assess 2: the shard ends online on n3, writable, with every acknowledged key.
    expect(online?.primary_node_id, summary()).toBe("n3");
    await waitFor(async () => (await probeWrite(n3, `${PREFIX}:after`)).accepted, "n3 writable", WAIT_MS);
    expect(await keysOn(n3), "every acknowledged key on the new primary").toEqual({
      l1: L1_KEYS,
      a: A_KEYS,
      b: B_KEYS,
    });
  });
});
