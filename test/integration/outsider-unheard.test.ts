import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForHold,
  waitForNewPrimary,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Issue 30, finding 1(b) (guarantee 1): a replica without an agent acknowledges `WAIT` as a member
 * does, and no failover could rank it: the best member was promoted and what only that replica
 * acknowledged was lost (nemesis seed 4202: 133 writes, an AZ split with one attached). Now the
 * primary's heartbeat lists such replicas (`outsiders`) and the controller holds the failover
 * (`outsider_unheard`) while the old primary's last report lists one that no heartbeat names; an
 * agent started on it lifts the hold, and its offset ranks.
 *
 * Real redis-server, agent and controller processes, DynamoDB Local and SQS (loopback): node-1
 * primary, node-2 and node-3 members, node-4 a redis-server following node-1 with no agent.
 */

const PREFIX = "outsider";
const COUNT = 200;
/** A failure timeout long enough for node-1's heartbeat to stay fresh on loaded cores while the test prepares. */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 2000 };

let cluster: LocalCluster | undefined;

afterEach(async () => {
  for (const id of ["node-2", "node-3"]) cluster?.node(id).signal("SIGCONT");
  await cluster?.stop();
  cluster = undefined;
});

describe("a replica without an agent that acknowledged the primary's writes", () => {
  it("holds the failover while the dead primary's last report lists it, then promotes it once its agent runs, losing no acknowledged write", {
    timeout: 180_000,
  }, async () => {
    // Prepare: the shard online; node-4 follows node-1 with no agent.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    const primary = active.node("node-1");
    const outsider = new RedisNode(await freePort(), "node-4");
    active.attach(outsider);
    await outsider.start({ replicaOf: primary.address });
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await active.waitFor(
      "node-1's heartbeat listing node-4's address among its outsiders",
      async () =>
        active.heartbeatOf(await active.snapshot(), "node-1")?.outsiders?.includes(outsider.address) === true,
      WAIT_MS,
    );
    const epoch = (await active.topology())?.epoch ?? 0;

    // Act: the members stall while writes go on, acknowledged by node-4 (WAIT 1) within the guard's
    // lag; the primary's database is killed, then the members resume.
    for (const id of ["node-2", "node-3"]) active.node(id).signal("SIGSTOP");
    try {
      await writeKeys(primary, PREFIX, COUNT, 1);
      primary.signal("SIGKILL");
      await delay(100); // the members stay stalled past the kill: the fault's shape, not a wait for a condition
    } finally {
      for (const id of ["node-2", "node-3"]) active.node(id).signal("SIGCONT");
    }
    const held = await waitForHold(
      active,
      "outsider_unheard",
      "the controller holding the failover for node-4",
    );
    // Several failure timeouts more: the hold lasts while node-4 has no agent. On the code before,
    // node-2 or node-3 was promoted here by the crash fast path.
    await delay(4 * CONFIG.failureTimeoutMs); // the observation window, not a wait for a condition
    const during = await active.topology();

    // Assess: no promotion while node-4 is unaccounted for, and the reason names its address.
    expect({ epoch: during?.epoch, primary: during?.primary_node_id }).toEqual({ epoch, primary: "node-1" });
    expect(String(held.reason ?? held.message)).toContain(
      `node-1's last report lists replicas no node id names acknowledging its writes (${outsider.address})`,
    );

    // Act: an agent starts on node-4; its heartbeat names the address and its offset ranks.
    active.startAgent("node-4");
    const after = await waitForNewPrimary(active, epoch);

    // Assess: the new primary holds every write a replica acknowledged (node-4 acknowledged them
    // all; the members may hold them too, from what their kernels buffered while they were stopped).
    expect(await countKeys(active.node(after.primary_node_id ?? "node-4"), PREFIX, COUNT)).toBe(COUNT);
  });
});
