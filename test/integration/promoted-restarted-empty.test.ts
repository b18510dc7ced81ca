import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { probeWrite, WAIT_MS } from "../support/chaos-cluster.ts";
import {
  awaitRecovery,
  FENCED,
  freezeControllers,
  promoteThenEmpty,
  sceneReport,
  startEmptiedCluster,
  stopEmptiedCluster,
} from "../support/emptied-promotion.ts";

/**
 * Simulator seed 7011 (guarantee 1, 1,246 replica-acknowledged writes lost; docs/simulation.md),
 * with real redis-server processes, agents, controllers, DynamoDB Local and SQS. The seed's n2, n1
 * and n3 are node-1, node-2 and node-3 here: node-1 primary, node-2 and node-3 members, every key
 * acknowledged by both (`WAIT 2`). node-1's database is killed and stays down; both replicas' agents
 * park them. The controller promotes node-2; node-3, parked with every acknowledged write, has not
 * followed it yet (its agent frozen from the epoch bump on: in the seed its repoint was late), so
 * node-2 lifts its promotion fence with an empty replica set at the new epoch. node-2's database is
 * then killed and restarted EMPTY at the same address (fenced by its config, as a supervisor starts
 * it), the controllers frozen (the seed's stalled controller) until its agent judged the new process.
 *
 * On the code before 5e0772a, `judgeRestart` (src/core/identity.ts) looked only at the replica-set
 * members (none) and at the replicas synced to the old process at its last read (none): it judged
 * the restart "harmless: no other node holds its data" and node-2 served its empty dataset at the
 * new epoch; node-3's agent, run again, applied its repoint and node-3 full-synced the empty
 * dataset: every acknowledged key lost, as in the seed. Now every stored heartbeat of the shard
 * counts, member or not, however old: node-3's is on the lineage node-2 was promoted from, so
 * node-2 is fenced ("restarted without its data") and never takes a write while empty; the
 * controllers, run again, move the shard past node-2's epoch (offline), node-3's agent runs again,
 * the shard comes back on node-3 with every acknowledged key, and node-2 follows it.
 */

const PREFIX = "promoted-restarted-empty";
/** How long after its agent's verdict node-2 must refuse every write (its agent writing meanwhile). */
const HOLD_MS = 4000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  await stopEmptiedCluster(cluster, context.task.result?.state === "fail");
  cluster = undefined;
});

describe("a primary promoted with an empty replica set, restarted empty while a parked non-member holds the lineage (simulator seed 7011)", () => {
  it("is fenced as restarted without its data, never serves the empty dataset, and the shard comes back with every acknowledged key", {
    timeout: 360_000,
  }, async () => {
    // Prepare and act: node-1 dead, node-2 promoted with an empty set, restarted empty, its agent's
    // verdict read; the controllers frozen, node-3's agent too (test/support/emptied-promotion.ts).
    cluster = await startEmptiedCluster();
    const active = cluster;
    const scene = await promoteThenEmpty(active, PREFIX);
    const { n2, epoch, verdict } = scene;
    const judgedAt = Date.now();

    // Assess: node-2 refuses every write while its agent writes for HOLD_MS after its verdict.
    const accepted: string[] = [];
    let probes = 0;
    await active.waitFor(
      `node-2 probed while its agent writes for ${HOLD_MS} ms after its verdict`,
      async () => {
        const probe = await probeWrite(n2, `${PREFIX}:probe:${probes++}`);
        if (probe.accepted) accepted.push(`probe ${probes - 1} as ${probe.role}`);
        const heartbeat = active.heartbeatOf(await active.snapshot(), "node-2");
        return (heartbeat?.agent_updated ?? 0) / 1000 > judgedAt + HOLD_MS;
      },
      WAIT_MS,
    );

    // Act: the controllers run again; node-3's agent once they moved the shard past node-2's epoch
    // (or once that wait is over: on the code before node-2 serves, healthy, and nothing moves). Its
    // repoint to node-2 at node-2's epoch waits in its queue: run while that epoch stands, it would
    // full-sync node-3 from node-2's empty process, on the code after the fix too (1 of 2 runs that
    // thawed it together with the controllers): a late REPLICAOF is screened on the epoch only.
    freezeControllers(active, "SIGCONT");
    const replaced = await active
      .waitFor(
        "the controllers moving the shard past node-2's epoch",
        async () => ((await active.topology())?.epoch ?? 0) > epoch,
        WAIT_MS,
      )
      .then(
        () => "",
        (error: unknown) => (error instanceof Error ? error.message : String(error)),
      );
    active.signalAgent("node-3", "SIGCONT");

    // Assess: an online primary past node-2's epoch that takes writes and holds every acknowledged
    // key, node-2 following it with every key too.
    const recovery = await awaitRecovery(active, scene, PREFIX);
    const { missing, report } = await sceneReport(active, scene, recovery, [
      `${probes} write probes on node-2 while held, accepted: ${accepted.length}`,
    ]);
    console.log(report);
    expect({
      verdict: verdict?.message,
      acceptedWhileEmpty: accepted,
      replaced: replaced.split(";")[0],
      recovered: recovery.recovered,
      missingAcknowledged: missing,
    }).toEqual({
      verdict: FENCED,
      acceptedWhileEmpty: [],
      replaced: "",
      recovered: "",
      missingAcknowledged: { "node-2": 0, "node-3": 0 },
    });
  });
});
