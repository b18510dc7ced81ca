import { expect, onTestFailed, onTestFinished } from "vitest";
import { type CycleResult, runShardCycle } from "../../src/controller/orchestrator.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import type { Candidate, Heartbeat, Lineage, Topology } from "../../src/core/model.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, type TestAgent, tryWrite } from "./agent-harness.ts";
import { awsEnv } from "./aws.ts";
import { countKeys, withClient, writeKeys } from "./chaos-cluster.ts";
import { Gate, testController } from "./frozen-controller.ts";
import { TcpProxy } from "./tcp-proxy.ts";
import { waitFor } from "./wait.ts";

/**
 * A failover resumed before PROMOTE whose old primary restarted empty behind parked replicas
 * (simulator seeds 420097 and 171726), with real redis-server processes and agents, DynamoDB
 * Local and SQS, and an in-process controller; the scenario of continuation-ancestry.test.ts (with
 * lineage history) and resumed-no-history.test.ts (without), described in full in the former.
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
/** Keys acknowledged by both replicas on L1 (n1 primary; with history only), then on L2 (n2 primary). */
export const L1_KEYS = 100;
export const L2_KEYS = 200;
/** Generous bound for anything that waits on processes (two long benchmarks share the machine). */
const WAIT_MS = 30_000;

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

/**
 * How many times `agent` parked its replica: its probe's park, or a `REPLICAOF` it refused
 * (`judgeFollow`: the named primary holds none of its data, or did not answer).
 */
const parks = (agent: TestAgent) =>
  agent.logger.lines.filter((line) => /replica parked|^not following the named primary/.test(line.message))
    .length;

/**
 * Runs the scenario (asserting its setup) and returns its outcome, for the test to assert that the
 * resumed plan went to a holder of every acknowledged write and never took the shard offline. `history`: n2 was promoted from n1 (the topology's `ancestry`
 * records the link); otherwise n2 is the shard's initial primary and the topology has no history.
 */
export async function resumedEmptyPrimary({
  history,
  prefix,
}: {
  history: boolean;
  prefix: string;
}): Promise<ResumedOutcome> {
  // Arrange 1: the shard's primary n2, reached by the other nodes through the proxy (its agent's
  // address), n1 and n3 its replicas, on lineage L2. With history: n1 was the first primary (L1)
  // and n2 was promoted from it (L2 continuing L1, recorded in the topology's ancestry). Without:
  // n2 (started as node-1's replica) is made a primary before any write and the topology's first
  // epoch names it: the shard's only primary so far, no ancestry.
  const active = new AgentFixture();
  onTestFinished(() => active.close());
  const [n1, n2, n3] = await active.startRedis(3);
  if (!n1 || !n2 || !n3) throw new Error("redis nodes missing");
  const n2Proxy = new TcpProxy("127.0.0.1", n2.port);
  onTestFinished(() => n2Proxy.close());
  await n2Proxy.start();
  const n2Address = `127.0.0.1:${n2Proxy.port}`;
  if (history) await writeKeys(n1, `${prefix}:l1`, L1_KEYS, 2);
  const lineageL1 = (await replication(n1)).master_replid ?? "";
  await withClient(n2, (client) => client.call("REPLICAOF", "NO", "ONE"));
  const promoted = await replication(n2);
  const lineageL2 = promoted.master_replid ?? "";
  let ancestry: Topology["ancestry"];
  if (history) {
    expect(promoted.master_replid2, "n2's lineage L2 continues L1").toBe(lineageL1);
    ancestry = [{ repl_id: lineageL1, until: Number(promoted.second_repl_offset) - 1, by: lineageL2 }];
  }
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
  await waitFor(async () => (await tryWrite(n2, `${prefix}:probe`)) === "OK", "n2 writable", WAIT_MS);
  await writeKeys(n2, `${prefix}:l2`, L2_KEYS, 2);
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
    expect(await countKeys(node, `${prefix}:l2`, L2_KEYS), `${node.id} holds every write`).toBe(L2_KEYS);
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
        (line) => line.message === "following the topology's primary" && line.attributes.topologyEpoch === 3,
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
  onTestFinished(() => controller.aws.destroy());
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
  const offline = written.filter((topology) => topology.status === "offline").map(brief);
  const onHolder = online.primary_node_id === "n1" || online.primary_node_id === "n3";
  if (!onHolder || offline.length > 0)
    return { offline, primary: online.primary_node_id, l1Keys: undefined, l2Keys: 0, summary: summary() };
  const primary = online.primary_node_id === "n1" ? n1 : n3;
  await waitFor(
    async () => (await tryWrite(primary, `${prefix}:after`)) === "OK",
    `${online.primary_node_id} writable`,
    WAIT_MS,
  );
  return {
    offline,
    primary: online.primary_node_id,
    l1Keys: history ? await countKeys(primary, `${prefix}:l1`, L1_KEYS) : undefined,
    l2Keys: await countKeys(primary, `${prefix}:l2`, L2_KEYS),
    summary: summary(),
  };
}

/** What the resumed plan did: offline marks written, the primary it ended on, the keys it holds. */
export interface ResumedOutcome {
  readonly offline: readonly ReturnType<typeof brief>[];
  readonly primary: string | undefined;
  /** L1's writes on that primary (with history only). */
  readonly l1Keys: number | undefined;
  readonly l2Keys: number;
  readonly summary: string;
}
