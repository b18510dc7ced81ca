import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { roleOf, WAIT_MS } from "../support/chaos-cluster.ts";
import {
  awaitRecovery,
  BATCHES,
  FENCED,
  freezeControllers,
  PER_BATCH,
  promoteThenEmpty,
  sceneReport,
  startEmptiedCluster,
  stopEmptiedCluster,
} from "../support/emptied-promotion.ts";

/**
 * Open hole 7039 (docs/open-holes/README.md, first row: simulator hunt seed 7039; analysis in
 * docs/open-holes/sim-7039-analysis.md), with real processes. It fails on the code before the agent's
 * target check (\`judgeFollow\`, src/core/identity.ts), 3 of 3 runs: node-3 holds 0 of 1,000 keys.
 *
 * Guarantee 1, with real redis-server processes, agents, controllers, DynamoDB Local and SQS. The scenario
 * is the one of promoted-restarted-empty.test.ts (simulator seed 7011, fixed by 5e0772a), with one ordering
 * changed: node-1 primary, node-2 and node-3 members, every key acknowledged by both (`WAIT 2`). node-1's
 * database is killed and stays down; both replicas' agents park them. The controller promotes node-2 at a
 * new epoch; node-3's agent is stopped (SIGSTOP) as soon as the epoch moves, so node-3 stays parked with
 * every acknowledged key and the failover's `REPLICAOF node-2` command for it waits in its SQS queue.
 * node-2's database is then killed and restarted EMPTY at the same address (fenced by its config), the
 * controllers frozen, and node-2's agent fences it ("restarted without its data"). Then node-3's agent is
 * continued BEFORE the controllers (the merged test continues it only after they moved the shard past
 * node-2's epoch, which drops the stale command): the topology still names node-2 at the queued command's
 * epoch, so `screenCommand` passes the command (and the topology read would repoint it there too), and
 * `becomeReplicaOf` (src/agent/node-control.ts) issues `REPLICAOF node-2` without judging the target's
 * lineage: node-3 full-syncs node-2's empty dataset and every acknowledged key is lost (seen last session:
 * 1,000 of 1,000). The probe's `syncWouldDestroy` guard (src/agent/primary-probe.ts) covers only processes
 * the agent never pointed.
 *
 * The fix: before any \`REPLICAOF\` the agent issues (commands and topology repoints included) it reads
 * the target's INFO; a target holding none of its data, behind it, on a replication id the shard's record
 * does not name (restarted empty: offset 0, a new replid, no replid2 continuing it) is not followed, and
 * the replica stays parked and reports it (docs/agent.md#the-target-check-before-every-replicaof). node-3
 * stays parked with every key, the controllers move the shard past node-2's epoch and bring it back on
 * node-3.
 */

const PREFIX = "queued-replicaof-empty";

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await stopEmptiedCluster(cluster, context.task.result?.state === "fail");
  cluster = undefined;
});

describe("a parked replica holding every acknowledged key, its queued REPLICAOF naming a primary since restarted empty and fenced (open hole 7039)", () => {
  it("does not follow the empty process when its agent runs before the controllers, and the shard comes back with every acknowledged key", {
    timeout: 360_000,
  }, async () => {
    // Prepare and act: the scene of promoted-restarted-empty.test.ts up to node-2's agent's verdict
    // on its empty process, the controllers frozen (test/support/emptied-promotion.ts).
    cluster = await startEmptiedCluster();
    const active = cluster;
    const scene = await promoteThenEmpty(active, PREFIX);
    const { n2, n3, missingOn, verdict } = scene;

    // Act: node-3's agent runs again BEFORE the controllers (still frozen: the topology names node-2
    // at the queued command's epoch). Its queued `REPLICAOF node-2` passes the epoch screen (and its
    // topology read names node-2 too): it points node-3 at node-2's empty, fenced process. Wait until
    // node-3 is linked to it (the full sync done) or that wait is over (a fixed agent refuses).
    const node3LinesBefore = active.logLines("agent-node-3.log").length;
    active.signalAgent("node-3", "SIGCONT");
    const followedEmpty = await active
      .waitFor(
        "node-3 linked to node-2's restarted empty process",
        async () => {
          const role = await roleOf(n3);
          return role.role === "slave" && role.primaryPort === n2.port && role.state === "connected";
        },
        WAIT_MS,
      )
      .then(
        () => true,
        () => false,
      );
    const node3Said = active
      .logLines("agent-node-3.log")
      .slice(node3LinesBefore)
      .map(
        (line) =>
          `${String(line.message)}${line.commandType === undefined ? "" : ` ${String(line.commandType)} ${String(line.primary)} at epoch ${String(line.commandEpoch)}`}` +
          `${line.reason === undefined ? "" : ` (${String(line.reason)})`}`,
      )
      .filter((message, index, all) => all.indexOf(message) === index)
      .slice(0, 8);
    const n3Missing = await missingOn(n3);

    // Act: the controllers run again.
    freezeControllers(active, "SIGCONT");

    // Assess: an online primary past node-2's epoch that takes writes and holds every acknowledged
    // key, node-2 following it with every key too.
    const recovery =
      n3Missing === BATCHES * PER_BATCH && (await missingOn(n2)) === BATCHES * PER_BATCH
        ? {
            recovered:
              "not waited for: node-1 is down for good and node-2 and node-3 hold none of the acknowledged keys",
            serving: undefined,
            seen: [],
          }
        : await awaitRecovery(active, scene, PREFIX);
    const { missing, report } = await sceneReport(active, scene, recovery, [
      `node-3's agent resumed before the controllers: linked to node-2's empty process: ${followedEmpty}; ` +
        `acknowledged keys missing on node-3 then: ${n3Missing}; its agent said: ${node3Said.join(" | ")}`,
    ]);
    console.log(report);
    expect(verdict?.message, "node-2's agent fenced its empty process (the scenario's premise)").toBe(FENCED);
    expect(
      { missingAcknowledged: missing, recovered: recovery.recovered },
      "every WAIT 2-acknowledged key survives on node-3 and on the shard's final primary",
    ).toEqual({ missingAcknowledged: { "node-2": 0, "node-3": 0 }, recovered: "" });
  });
});
