import { afterEach, describe, expect, it, onTestFailed } from "vitest";
import { type CycleResult, runShardCycle } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Candidate, Heartbeat, Lineage, Topology } from "../../src/core/model.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, type TestAgent, tryWrite } from "../support/agent-harness.ts";
import { awsEnv } from "../support/aws.ts";
import { countKeys, withClient, writeKeys } from "../support/chaos-cluster.ts";
import { Gate, type TestController, testController } from "../support/frozen-controller.ts";
import { TcpProxy } from "../support/tcp-proxy.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Simulator seed 420097 (guarantee 1, 3,182 replica-acknowledged writes lost), with real
 * redis-server processes and agents, DynamoDB Local and SQS, and an in-process controller.
 *
 * n1 was the shard's first primary (lineage L1); n2 was promoted from it (lineage L2, recorded in
 * `topology.ancestry` as L1 -> L2 at the promotion's offset); n1 and n3 follow n2 and acknowledge
 * every write. n2's database restarts empty: n1's and n3's agents park their replicas (they hold
 * every write); n2's agent fences it. A failover to n1 is recorded past its point of no return and
 * its controller freezes before PROMOTE: n2's agent steps n2 down to n1, which refuses its sync
 * (-NOMASTERLINK: n1 is parked), so n2 stays an empty replica, link down, on the empty process's
 * own replication id at offset 0; n3's agent follows n1 too (refused as well). The next controller
 * retargets to n3 and freezes right after the epoch bump (phase `epoch_bumped`, before PROMOTE;
 * no lock left): n3's agent follows the old primary that plan names, n2 (refused again: n2's link
 * is down), and parks when n2's address is cut off. The cycle under test resumes that plan: before
 * PROMOTE, the continuation judges the shard as it was before the change
 * (src/core/continuation.ts `reconsider` -> `topologyBefore`). No follower names n2 and an online
 * topology stores no lineage: the demoted n2 is judged by the shard's lineage history
 * (online-view.ts `historyTip`). Without that history (the code before 889cc0f dropped `ancestry`
 * there) it was judged by its own empty lineage: n1 and n3 were "foreign", the shard went offline
 * on the empty lineage and was brought back on n2 at offset 0, over the two holders of every write.
 *
 * n2 is reached by the other nodes through a TCP proxy (its agent's `--address`). At the
 * simulator's decision (instrumented replay) n1's probe reported n2 `unreachable` and n3's
 * `restarted` (n1 and n2 had been partitioned), and n3 had parked on its connection to n2
 * closing. Here the proxy resets n1's probe connections from the empty restart on, and is cut and
 * restored once n3 follows n2. Without the first, both parked replicas' probes find n2 without
 * their data, and the controller takes the shard's lineage from them (online-view.ts
 * `restartedPrimary`): right on both codes (checked: the test then passed before 889cc0f too).
 *
 * Test-written, instead of frozen controllers: the two failover plans (epoch 2 to n1 in phase
 * `promote`, epoch 3 to n3 in phase `epoch_bumped`, n1 deposed), written as the controllers would
 * have (compare-and-set on the epoch). n2's promotion from n1 is done by hand (REPLICAOF NO ONE,
 * then n1 and n3 REPLICAOF n2) before the agents start, its link recorded in the online topology at
 * epoch 1 as the controller records one.
 */

/**
 * The in-process controller: the agents' cycle (FAST_TIMINGS), a failure timeout four times theirs
 * so that live nodes stay fresh under load (a parked replica's report was seen 2.4 s old with two
 * benchmarks beside), a lease longer than the whole cycle, no cool-down.
 */
const CONFIG = parseFailoverConfig({
  heartbeatIntervalMs: 200,
  failureTimeoutMs: 4000,
  fenceTimeoutMs: 600,
  lockLeaseMs: 20_000,
  cooldownMs: 0,
});
const PREFIX = "continuation-ancestry";
/** Keys acknowledged by both replicas on L1 (n1 primary), then on L2 (n2 primary). */
const L1_KEYS = 100;
const L2_KEYS = 200;
/** Generous bound for anything that waits on processes (two long benchmarks share the machine). */
const WAIT_MS = 30_000;

let fixture: AgentFixture | undefined;
let proxy: TcpProxy | undefined;
const controllers: TestController[] = [];

afterEach(async () => {
  for (const controller of controllers.splice(0)) controller.aws.destroy();
  await fixture?.close();
  fixture = undefined;
  await proxy?.close();
  proxy = undefined;
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

/** `node` a replica of the server on `port` with its link up. */
async function linkedTo(node: RedisNode, port: number): Promise<boolean> {
  const info = await replication(node);
  return info.master_port === String(port) && info.master_link_status === "up";
}

/** A candidate row as the controller ranks one, from the node's heartbeat. */
function candidateOf(heartbeat: Heartbeat): Candidate {
  return {
    node_id: heartbeat.node_id,
    node_address: heartbeat.node_address,
    last_txn_id: heartbeat.last_txn_id,
    priority: heartbeat.priority,
    eligible: true,
    reason: "eligible",
  };
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

/** How many times `agent` parked its replica. */
const parks = (agent: TestAgent) =>
  agent.logger.lines.filter((line) => /replica parked/.test(line.message)).length;

describe("a failover resumed before PROMOTE, its old primary restarted empty behind parked replicas", () => {
  it("is judged with the shard's lineage history: the holders of every write, never the empty node (simulator seed 420097)", {
    timeout: 120_000,
  }, async () => {
    // Arrange 1: n1 primary on L1 (redis-server's own replication), n2 and n3 its replicas.
    const active = new AgentFixture();
    fixture = active;
    const [n1, n2, n3] = await active.startRedis(3);
    if (!n1 || !n2 || !n3) throw new Error("redis nodes missing");
    await writeKeys(n1, `${PREFIX}:l1`, L1_KEYS, 2);
    const lineageL1 = (await replication(n1)).master_replid ?? "";
    // n2 promoted from n1 (lineage L2, continuing L1 up to the promotion); n1 and n3 follow it at
    // the address the other nodes reach it on (the proxy).
    const n2Proxy = new TcpProxy("127.0.0.1", n2.port);
    proxy = n2Proxy;
    await n2Proxy.start();
    const n2Address = `127.0.0.1:${n2Proxy.port}`;
    await withClient(n2, (client) => client.call("REPLICAOF", "NO", "ONE"));
    const promoted = await replication(n2);
    const lineageL2 = promoted.master_replid ?? "";
    expect(promoted.master_replid2, "n2's lineage L2 continues L1").toBe(lineageL1);
    const ancestry = [{ repl_id: lineageL1, until: Number(promoted.second_repl_offset) - 1, by: lineageL2 }];
    for (const replica of [n1, n3]) {
      await withClient(replica, (client) => client.call("REPLICAOF", "127.0.0.1", String(n2Proxy.port)));
    }
    await waitFor(
      async () => (await linkedTo(n1, n2Proxy.port)) && (await linkedTo(n3, n2Proxy.port)),
      "n1 and n3 linked to n2",
      WAIT_MS,
    );
    await active.setTopology(undefined, {
      epoch: 1,
      primary_node_id: "n2",
      primary_address: n2Address,
      status: "online",
      ancestry,
    });
    const n1Agent = await active.startAgent(n1, { nodeId: "n1" });
    const n2Agent = await active.startAgent(n2, { nodeId: "n2", address: n2Address });
    const n3Agent = await active.startAgent(n3, { nodeId: "n3" });
    for (const id of ["n1", "n3"]) {
      await active.waitForHeartbeat(
        id,
        (hb) => hb.primary_node_id === "n2" && hb.primary_link === "up" && hb.repl_id === lineageL2,
        "linked to n2 on L2",
        WAIT_MS,
      );
    }
    onTestFailed(() => {
      for (const [id, agent] of [
        ["n1", n1Agent],
        ["n2", n2Agent],
        ["n3", n3Agent],
      ] as const) {
        for (const line of agent.logger.lines.filter((entry) => entry.level !== "debug")) {
          console.log(`${id} ${line.level} ${line.message} ${JSON.stringify(line.attributes).slice(0, 300)}`);
        }
      }
    });
    // Arrange 2: writes on L2, acknowledged by both replicas, members of n2's replica set.
    await waitFor(
      async () => {
        const members = (await active.snapshot()).replicaSets.n2 ?? [];
        return members.includes("n1") && members.includes("n3");
      },
      "n1 and n3 in n2's replica set",
      WAIT_MS,
    );
    await waitFor(async () => (await tryWrite(n2, `${PREFIX}:probe`)) === "OK", "n2 writable", WAIT_MS);
    await writeKeys(n2, `${PREFIX}:l2`, L2_KEYS, 2);
    const offset = Number((await replication(n2)).master_repl_offset);
    for (const id of ["n1", "n2", "n3"]) {
      await active.waitForHeartbeat(
        id,
        (hb) => hb.last_txn_id >= offset,
        `reporting offset ${offset}`,
        WAIT_MS,
      );
    }

    // Arrange 3: n2's database restarts empty (fenced by its config, as docs/deploy.md asks): n1's
    // and n3's agents park their replicas, n2's agent fences the empty process and reports it down.
    n2.signal("SIGKILL");
    await n2.stop();
    n2.wipeData();
    await n2.start({ extraArgs: FENCED_START_ARGS });
    await waitFor(() => parks(n1Agent) > 0 && parks(n3Agent) > 0, "n1 and n3 parked", WAIT_MS);
    await waitFor(
      () => n2Agent.logger.find(/database restarted without its data/),
      "n2's agent: restarted without its data",
      WAIT_MS,
    );
    for (const node of [n1, n3]) {
      expect(await countKeys(node, `${PREFIX}:l2`, L2_KEYS), `${node.id} holds every write`).toBe(L2_KEYS);
    }
    const down = await active.waitForHeartbeat(
      "n2",
      (hb) => hb.db_status === "down" && hb.repl_id === lineageL2,
      "reported down with the dead process's lineage",
      WAIT_MS,
    );
    // From now on n1's probe connections to n2 are reset: n1 reports its primary unreachable.
    n2Proxy.resetRequestsContaining("shardguard-probe.n1.");
    await active.waitForHeartbeat(
      "n1",
      (hb) => hb.primary_probe === "unreachable",
      "n2 unreachable to n1's probe",
      WAIT_MS,
    );
    const planLineage: Lineage = { node_id: "n2", repl_id: lineageL2, last_txn_id: down.last_txn_id };
    const snapshot = await active.snapshot();
    const candidates = ["n1", "n3"].map((id) => {
      const heartbeat = snapshot.nodes.find((node) => node.node_id === id);
      if (heartbeat === undefined) throw new Error(`${id} has no heartbeat`);
      return candidateOf(heartbeat);
    });

    // Arrange 4: the failover to n1 at epoch 2, past its point of no return (phase promote); its
    // controller froze before PROMOTE. n2's agent steps n2 down to n1, which refuses its sync; n3's
    // agent follows n1 too, refused as well.
    const started = Date.now();
    await active.setTopology(1, {
      epoch: 2,
      primary_node_id: "n2",
      primary_address: n2Address,
      status: "failing_over",
      phase: "promote",
      ancestry,
      failover: {
        kind: "failover",
        old_primary_node_id: "n2",
        new_primary_node_id: "n1",
        new_primary_address: n1.address,
        reason: "test: primary n2 restarted without its data",
        started_at: started,
        candidates,
        phase_started: { locked: started, epoch_bumped: started, promote: started },
        lineage: planLineage,
      },
    });
    const demoted = await active.waitForHeartbeat(
      "n2",
      (hb) =>
        hb.db_status === "up" &&
        hb.role === "replica" &&
        hb.primary_node_id === "n1" &&
        hb.primary_link === "down" &&
        hb.last_txn_id === 0,
      "an empty replica of n1, link down",
      WAIT_MS,
    );
    expect(demoted.repl_id, "n2 on the empty process's own lineage").not.toBe(lineageL2);
    expect(n2Agent.logger.find("stepping down: not the topology's primary")).toBeDefined();
    await active.waitForHeartbeat("n3", (hb) => hb.primary_node_id === "n1", "following n1", WAIT_MS);

    // Arrange 5: the next controller retargeted to n3 at epoch 3 and froze after the epoch bump
    // (phase epoch_bumped, before PROMOTE); n1, the earlier target past its PROMOTE, is deposed.
    // n3's agent follows n2, the primary that plan names, refused too; n2's address is cut off
    // and restored: n3 parks.
    const parkedBefore = parks(n3Agent);
    const replanned = Date.now();
    await active.setTopology(2, {
      epoch: 3,
      primary_node_id: "n2",
      primary_address: n2Address,
      status: "failing_over",
      phase: "epoch_bumped",
      ancestry,
      deposed: [{ node_id: "n1", address: n1.address, epoch: 3 }],
      failover: {
        kind: "failover",
        old_primary_node_id: "n2",
        new_primary_node_id: "n3",
        new_primary_address: n3.address,
        reason: "test: target n1 did not confirm in time; promoting n3 instead",
        started_at: started,
        candidates: [...candidates].reverse(),
        phase_started: { locked: started, epoch_bumped: replanned, promote: started },
        lineage: planLineage,
      },
    });
    await waitFor(
      () =>
        n3Agent.logger.lines.some(
          (line) =>
            line.message === "following the topology's primary" && line.attributes.topologyEpoch === 3,
        ),
      "n3 following n2, the primary epoch 3's plan names",
      WAIT_MS,
    );
    const n3Probe = await waitFor(
      async () => {
        if (parks(n3Agent) > parkedBefore) return "parked already";
        const clients = (await withClient(n2, (client) => client.call("CLIENT", "LIST"))) as string;
        return clients.includes("name=shardguard-probe.n3.") && "probing n2";
      },
      "n3's probe connected to n2",
      WAIT_MS,
    );
    if (n3Probe === "probing n2") {
      await n2Proxy.cut();
      await n2Proxy.start();
    }
    await waitFor(() => parks(n3Agent) > parkedBefore, `n3 parked again (${n3Probe})`, WAIT_MS);
    // The shape the cycle decides on: n2 an empty replica for more than the failure timeout; n1
    // and n3 parked (no primary named), fresh, members of n2's replica set, holding L2 to its end;
    // n3's probe finds n2 without its data, n1's cannot reach it.
    const decidedOn = await waitFor(
      async () => {
        const shard = await active.snapshot();
        const nodes = shard.nodes;
        const now = Date.now() * 1000; // µs
        const of = (id: string) => nodes.find((node) => node.node_id === id);
        const empty = of("n2");
        const fresh = (hb: Heartbeat) => now - (hb.agent_updated ?? hb.last_updated) < 1_000_000;
        const holding = (hb: Heartbeat | undefined, probe: string) =>
          hb !== undefined &&
          fresh(hb) &&
          hb.primary_node_id === undefined &&
          hb.primary_link === "down" &&
          hb.primary_probe === probe &&
          hb.repl_id === lineageL2 &&
          hb.last_txn_id >= offset;
        return (
          empty !== undefined &&
          fresh(empty) &&
          empty.role === "replica" &&
          empty.last_txn_id === 0 &&
          empty.db_status === "up" &&
          now - (empty.role_since ?? now) > (CONFIG.failureTimeoutMs + 1000) * 1000 &&
          holding(of("n1"), "unreachable") &&
          holding(of("n3"), "restarted") &&
          ["n1", "n3"].every((id) => shard.replicaSets.n2?.includes(id)) &&
          shard
        );
      },
      "n2 demoted past the failure timeout; n1 and n3 parked, fresh, probing n2",
      WAIT_MS,
    );
    for (const node of [n1, n3]) expect((await replication(node)).master_port, `${node.id} parked`).toBe("1");

    // Act: a controller resumes the plan; every topology it writes is recorded.
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
      `n3 ${n3Probe}; decided on: n2's replica set ${JSON.stringify(decidedOn.replicaSets.n2)}, ${JSON.stringify(
        decidedOn.nodes.map((hb) => ({
          id: hb.node_id,
          role: hb.role,
          repl: hb.repl_id.slice(0, 8),
          offset: hb.last_txn_id,
          primary: hb.primary_node_id,
          link: hb.primary_link,
          probe: hb.primary_probe,
        })),
      )}; ${summary()}`,
    );

    // Assess 1: the resumed plan neither takes the shard offline (on n2's empty lineage) nor
    // promotes n2; it goes on to n3 or replans to n1, the holders of every write.
    const wrong = written.find(
      (topology) =>
        topology.status === "offline" ||
        topology.failover?.new_primary_node_id === "n2" ||
        (topology.status === "online" && topology.primary_node_id === "n2"),
    );
    expect(wrong && brief(wrong), `the shard offline or n2 promoted: ${summary()}`).toBeUndefined();
    expect(
      written[0]?.failover?.new_primary_node_id,
      `the first write resumes the failover to a holder: ${summary()}`,
    ).toMatch(/^n[13]$/);

    // Assess 2: the shard ends online on n1 or n3 (more cycles if the first stopped short), and
    // its writable primary holds every acknowledged write.
    const online = await waitFor(
      async () => {
        const topology = (await active.snapshot()).topology;
        if (topology?.status === "online" && topology.epoch > 3) return topology;
        results.push(await runShardCycle(controller.deps, active.shard));
        return undefined;
      },
      "the shard online again",
      WAIT_MS,
      200,
    );
    expect(written.filter((topology) => topology.status === "offline").map(brief), summary()).toEqual([]);
    expect(["n1", "n3"], summary()).toContain(online.primary_node_id);
    const primary = online.primary_node_id === "n1" ? n1 : n3;
    await waitFor(
      async () => (await tryWrite(primary, `${PREFIX}:after`)) === "OK",
      `${online.primary_node_id} writable`,
      WAIT_MS,
    );
    expect(await countKeys(primary, `${PREFIX}:l1`, L1_KEYS), "L1's writes on the primary").toBe(L1_KEYS);
    expect(await countKeys(primary, `${PREFIX}:l2`, L2_KEYS), "L2's writes on the primary").toBe(L2_KEYS);
  });
});
