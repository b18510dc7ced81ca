import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  linesWith,
  probeWrite,
  startChaosCluster,
  tryAcknowledgedWrite,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForNewPrimary,
  withClient,
} from "../support/chaos-cluster.ts";

/**
 * Nemesis seed 6811 (issue 29/30, guarantee 2), with real processes: an old primary hung through
 * its successor's whole term is fenced by the promotion after next. node-1 (primary, its guard
 * down to one member) has its agent killed and its redis hung; node-3 is promoted and cannot
 * fence it (it does not answer); then node-3's agent dies and its redis hangs too, and node-2 is
 * promoted. Each promotion used to fence only its direct predecessor (node-2: node-3), and node-3
 * retried node-1 only while it was primary, so nothing fenced node-1 again. node-1 wakes with its
 * old guard (one replica); a replica without an agent re-attaches to it (node-3's database,
 * pointed at node-1 by hand), and node-1 takes writes `WAIT 1` acknowledges beside the real
 * primary: two writable primaries, every such write lost when that replica follows node-2. Now the
 * topology keeps every replaced primary not known fenced (\`deposed\`, src/core/depose.ts
 * \`deposedAfter\`) and node-2 fences node-1 too, again every cycle until it answers.
 * On the code before, `acked` below is not empty.
 */

const PREFIX = "deposed-chain";
/** How long writes are tried on the woken node-1 once a replica re-attached to it. */
const TRY_WRITES_MS = 3_000;

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const id of ["node-1", "node-2", "node-3"]) {
    cluster?.node(id).signal("SIGCONT");
    cluster?.signalAgent(id, "SIGCONT");
  }
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

describe("an old primary hung through its successor's term", () => {
  it("is fenced by the promotion after next, so a replica re-attaching to it cannot make it writable", {
    timeout: 240_000,
  }, async () => {
    // Prepare: node-1 primary; node-2 frozen (redis and agent) until node-1's agent drops it, so
    // node-1's guard asks one acknowledgement (node-3's).
    cluster = await startChaosCluster({ config: CHAOS_CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    const node1 = active.node("node-1");
    active.node("node-2").signal("SIGSTOP");
    active.signalAgent("node-2", "SIGSTOP");
    await active.waitFor(
      "node-2 dropped from node-1's replica set",
      async () => {
        const members = (await active.snapshot()).replicaSets["node-1"] ?? [];
        return members.includes("node-3") && !members.includes("node-2");
      },
      WAIT_MS,
    );

    // Act 1: node-1's agent dies and its redis hangs; node-3 is promoted.
    const epoch0 = (await active.topology())?.epoch ?? 0;
    await active.stopAgent("node-1", "SIGKILL");
    node1.signal("SIGSTOP");
    const first = await waitForNewPrimary(active, epoch0);
    expect(first.primary_node_id).toBe("node-3");
    // node-2 comes back and follows node-3, a member of its set.
    active.node("node-2").signal("SIGCONT");
    active.signalAgent("node-2", "SIGCONT");
    await waitForFollowers(active, "node-3", ["node-2"]);
    await waitForMembers(active, "node-3", ["node-2"]);
    await active.waitFor(
      "node-3 writable",
      async () => (await probeWrite(active.node("node-3"), `${PREFIX}:probe3`)).accepted,
      WAIT_MS,
    );

    // Act 2: node-3's agent dies and its redis hangs; node-2 is promoted while node-1 still hangs.
    await active.stopAgent("node-3", "SIGKILL");
    active.node("node-3").signal("SIGSTOP");
    const second = await waitForNewPrimary(active, first.epoch);
    expect(second.primary_node_id).toBe("node-2");
    await active.waitFor(
      "node-2 writable",
      async () => (await probeWrite(active.node("node-2"), `${PREFIX}:probe2`)).accepted,
      WAIT_MS,
    );

    // Act 3: node-1 wakes. Up to a few cycles for node-2 to reach it (never, on the code before:
    // the writes below tell).
    node1.signal("SIGCONT");
    await active
      .waitFor(
        "node-2 fencing node-1",
        () =>
          linesWith(active.logLines("agent-node-2.log"), /^old primary fenced by its successor/).some(
            (line) => line.oldPrimaryAddress === node1.address,
          ),
        5_000,
      )
      .catch(() => undefined);
    // node-3's database wakes with its agent still dead and is pointed at node-1 by hand: a replica
    // node-1's guard counts, as the replica restarted with `replicaof node-2` was in 6811.
    active.node("node-3").signal("SIGCONT");
    const [host, port] = node1.address.split(":");
    await withClient(active.node("node-3"), (client) => client.replicaof(host ?? "", Number(port)));
    await active.waitFor(
      "node-3's database linked to node-1",
      async () =>
        withClient(active.node("node-3"), async (client) =>
          /master_link_status:up/.test(await client.info("replication")),
        ),
      WAIT_MS,
    );
    const outcomes: string[] = [];
    const acked: string[] = [];
    await withClient(node1, async (client) => {
      const until = Date.now() + TRY_WRITES_MS;
      for (let index = 0; Date.now() < until; index++) {
        const key = `${PREFIX}:${index}`;
        const outcome = await tryAcknowledgedWrite(client, key);
        outcomes.push(outcome);
        if (outcome === "acked") acked.push(key);
        await new Promise((resolve) => setTimeout(resolve, 20)); // pacing of the writer, not a wait for a condition
      }
    });

    // Assess: node-1 refused every write, and node-2 said it fenced node-1.
    const tally = Object.fromEntries(
      [...new Set(outcomes)].map((o) => [o, outcomes.filter((x) => x === o).length]),
    );
    expect(acked, `writes acknowledged on deposed node-1: ${JSON.stringify(tally)}`).toEqual([]);
    expect(outcomes.length).toBeGreaterThan(10);
    expect(
      linesWith(active.logLines("agent-node-2.log"), /^old primary fenced by its successor/).some(
        (line) => line.oldPrimaryAddress === node1.address,
      ),
    ).toBe(true);
    expect((await active.topology())?.primary_node_id).toBe("node-2");
  });
});
