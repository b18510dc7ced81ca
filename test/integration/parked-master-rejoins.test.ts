import { afterEach, describe, expect, it } from "vitest";
import { isParked } from "../../src/agent/primary-probe.ts";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  describeInfo,
  describeReport,
  linesWith,
  replicationOf,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Simulator seed 310493 (liveness: the shard ended with a fenced master beside its primary, one
 * replica short; fixed by `judgeRestartedPark`, src/agent/topology-read.ts, and `parkOutgrown`,
 * src/core/identity.ts), with real redis-server processes and agents, DynamoDB Local, SQS and the
 * cluster's controller process.
 *
 * node-1 primary, node-2 and node-3 its replicas, KEYS acknowledged by both. The controller stops
 * (no failover while node-1 is silent: the topology keeps naming node-1 at its epoch). node-1's
 * database is SIGSTOPped (its agent runs): the replicas' probes hear nothing and their agents park
 * them ("primary silent"), parked from node-1 at the topology's epoch. node-2 SAVEs (parked), its
 * database is killed (SIGKILL) and started from that RDB without `replicaof` (the supervisor's
 * fenced config, played by the test): a master holding every key under a new id continuing
 * node-1's lineage. Its agent judges the new process (not the shard's primary: fenced) and, parked
 * from node-1 at the epoch the topology still names, keeps it a fenced master (`staysParked`,
 * src/agent/fencing.ts). Then node-1 wakes (SIGCONT, the same process, holding everything node-2
 * holds) and the controller runs again.
 *
 * On the code before (`681fc3a^`) nothing lifted that park: no probe watches a master's primary, and
 * no newer decision came (node-1 stayed the healthy primary), so node-2 stayed a fenced master (in
 * the seed for the last 84 s of the run). Now its agent reads node-1 and, finding it holds node-2's
 * data, ends the park: node-2 steps down to node-1 and replicates again.
 * Measured (twenty-sixth session, beside two simulator processes): on the code before 3 of 3 runs
 * failed so (node-2 still a fenced master on its new id 30 s after node-1 woke, its agent's last
 * word "writes fenced ... (parked from node-1)"; 44-51 s per test); now 4 of 4 pass (node-2's agent
 * logs "the park is over", node-2 linked to node-1 with every key, the epoch unchanged; 12-13 s).
 * No fixed sleeps: every wait is on a condition with a deadline.
 */

const PREFIX = "parked-master-rejoins";
const KEYS = 100;
/** Agents slowed by a loaded machine do not look dead mid-test (as in demoted-tip-follower). */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };

let cluster: LocalCluster | undefined;
const stoppedNodes: RedisNode[] = [];

afterEach(async (context) => {
  for (const node of stoppedNodes.splice(0)) if (node.running) node.signal("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("a parked replica whose database restarted from its RDB as a master (simulator seed 310493)", () => {
  it("steps down to the primary it was parked from once that primary answers holding its data", {
    timeout: 150_000,
  }, async () => {
    // Arrange: node-1 primary, KEYS acknowledged by both replicas; the controller stopped.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const node1 = active.node("node-1");
    const node2 = active.node("node-2");
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    await writeKeys(node1, `${PREFIX}:key`, KEYS, 2);
    const lineage = (await replicationOf(node1)).replId;
    for (const process of active.controllers) await process.stop(3000);
    const before = (await active.topology()) as Topology;
    expect(before).toMatchObject({ status: "online", primary_node_id: "node-1" });

    // Act 1: node-1's database silent (SIGSTOP); node-2's agent parks it from node-1.
    node1.signal("SIGSTOP");
    stoppedNodes.push(node1);
    await active.waitFor(
      "node-2 parked on node-1's lineage",
      async () => {
        const info = await replicationOf(node2);
        return isParked(info) && info.replId === lineage;
      },
      WAIT_MS,
    );

    // Act 2: node-2 SAVEs; its database is killed and started from the RDB as a master (fenced config).
    await withClient(node2, (client) => client.call("SAVE"));
    const restartsBefore = linesWith(active.logLines("agent-node-2.log"), "database restarted").length;
    node2.signal("SIGKILL");
    await active.waitFor("node-2's redis-server gone", () => !node2.running, WAIT_MS);
    await node2.start({ extraArgs: FENCED_START_ARGS });
    const restarted = await replicationOf(node2);
    expect(
      { role: restarted.role, newId: restarted.replId !== lineage, prior: restarted.prior?.replId },
      describeInfo("node-2", restarted),
    ).toEqual({ role: "primary", newId: true, prior: lineage });
    await active.waitFor(
      "node-2's agent judging its restarted database",
      () => linesWith(active.logLines("agent-node-2.log"), "database restarted").length > restartsBefore,
      WAIT_MS,
    );

    // Act 3: node-1 wakes (the same process); the controller runs again.
    node1.signal("SIGCONT");
    stoppedNodes.splice(0);
    // The controller returns once node-1's agent reports its database up again: a controller
    // reading the silent spell's reports would fail over, a new decision either code follows.
    const wokeAt = Date.now();
    await active.waitFor(
      "node-1's agent reporting its database up again",
      async () => {
        const report = active.heartbeatOf(await active.snapshot(), "node-1");
        return report?.db_status === "up" && report.role === "primary" && report.last_updated > wokeAt * 1000;
      },
      WAIT_MS,
    );
    active.startController();

    // Assess: node-2 a linked replica of node-1 again, holding every key; node-1 still the primary.
    let reports = "";
    const rejoined = await active
      .waitFor(
        "node-2 replicating from node-1 again",
        async () => {
          reports = (await active.snapshot()).nodes.map(describeReport).join("; ");
          const role = await roleOf(node2);
          return role.role === "slave" && role.primaryPort === node1.port && role.state === "connected";
        },
        WAIT_MS,
      )
      .then(
        () => true,
        () => false,
      );
    const agentLines = active
      .logLines("agent-node-2.log")
      .filter((line) => /park|stepping down|restarted|fence/.test(String(line.message ?? "")))
      .map((line) => `${line.message}${line.reason ? ` (${line.reason})` : ""}`)
      .slice(-8);
    const diagnostics =
      `INFO: ${describeInfo("node-1", await replicationOf(node1))}; ${describeInfo("node-2", await replicationOf(node2))}\n` +
      `reports: ${reports}\nnode-2's agent: ${agentLines.join(" | ")}`;
    console.log(diagnostics);
    expect(rejoined, `node-2 a linked replica of node-1 within ${WAIT_MS} ms:\n${diagnostics}`).toBe(true);
    expect(
      linesWith(active.logLines("agent-node-2.log"), /the park is over/).length,
      `node-2's agent ended the park:\n${diagnostics}`,
    ).toBeGreaterThan(0);
    expect(await countKeys(node2, `${PREFIX}:key`, KEYS), diagnostics).toBe(KEYS);
    const after = (await active.topology()) as Topology;
    expect(after, diagnostics).toMatchObject({
      status: "online",
      primary_node_id: "node-1",
      epoch: before.epoch,
    });
  });
});
