import { afterEach, describe, expect, it } from "vitest";
import type { Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  linesWith,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
} from "../support/chaos-cluster.ts";

/**
 * Two controller processes on a 1 s tick, racing through 20 failovers, each caused by a kill -9
 * of the primary's redis-server (restarted empty as a replica of the new primary before the next
 * round). Every failover must be one plan per epoch: no epoch in which two nodes applied a
 * PROMOTE, one "failover started" per epoch across both controllers, and every write that both
 * replicas acknowledged before a kill still on the final primary.
 */

const ROUNDS = 20;
const KEYS_PER_ROUND = 50;
const NODES = ["node-1", "node-2", "node-3"];

let cluster: LocalCluster | undefined;
/** A failed run keeps its process logs (their directory is in the failure message). */
let keepLogs = false;

afterEach(async () => {
  await cluster?.stop({ keepLogs });
  cluster = undefined;
  keepLogs = false;
});

/** Writes the round's keys, each one accepted, then waits until both replicas acknowledged them. */
async function writeRound(active: LocalCluster, primary: string, round: number): Promise<void> {
  await active.waitFor(
    `${primary} accepting writes`,
    async () => (await probeWrite(active.node(primary), "probe")).accepted,
    WAIT_MS,
  );
  await withClient(active.node(primary), async (client) => {
    for (let index = 0; index < KEYS_PER_ROUND; index++) {
      expect(await client.set(`round-${round}:${index}`, `value-${round}-${index}`)).toBe("OK");
    }
    expect(Number(await client.call("WAIT", "2", "5000"))).toBe(2);
  });
}

describe("chaos: two controllers racing", () => {
  it(`fail over ${ROUNDS} kill -9s on a 1 s tick with one promotion per epoch and no acknowledged write lost`, {
    timeout: 600_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster({ controllers: 2, config: { ...CHAOS_CONFIG, tickIntervalMs: 1000 } });
    const active = cluster;
    let topology = (await active.topology()) as Topology;
    const started = performance.now();

    // Act
    keepLogs = true; // until the rounds are through: a stuck round leaves its logs to read
    for (let round = 0; round < ROUNDS; round++) {
      const old = topology.primary_node_id as string;
      const others = NODES.filter((id) => id !== old);
      await waitForFollowers(active, old, others);
      await writeRound(active, old, round);
      active.node(old).signal("SIGKILL");
      topology = await waitForNewPrimary(active, topology.epoch);
      const primary = topology.primary_node_id as string;
      await active.node(old).start({ replicaOf: active.node(primary).address });
    }
    const elapsedS = Math.round((performance.now() - started) / 1000);
    keepLogs = false;

    // Assess
    const primary = topology.primary_node_id as string;
    await waitForFollowers(
      active,
      primary,
      NODES.filter((id) => id !== primary),
    );
    for (let round = 0; round < ROUNDS; round++) {
      expect(await countKeys(active.node(primary), `round-${round}`, KEYS_PER_ROUND), `round ${round}`).toBe(
        KEYS_PER_ROUND,
      );
    }
    const promotedAt = new Map<number, Set<string>>();
    for (const id of NODES) {
      for (const line of linesWith(active.logLines(`agent-${id}.log`), "command applied")) {
        if (line.commandType !== "PROMOTE") continue;
        const epoch = Number(line.commandEpoch);
        promotedAt.set(epoch, (promotedAt.get(epoch) ?? new Set()).add(id));
      }
    }
    const doubled = [...promotedAt].filter(([, nodes]) => nodes.size > 1);
    expect(doubled, "epochs with two promoted nodes").toEqual([]);
    const startedLines = linesWith(active.controllerLogLines(), "failover started");
    const perEpoch = new Map<number, number>();
    for (const line of startedLines)
      perEpoch.set(Number(line.epoch), (perEpoch.get(Number(line.epoch)) ?? 0) + 1);
    expect([...perEpoch.values()].every((count) => count === 1)).toBe(true);
    const history = await active.aws.store.history.list(active.shard, 100);
    expect(history.filter((record) => record.kind === "failover")).toHaveLength(ROUNDS);
    const byController = new Map<string, number>();
    for (const line of startedLines) {
      const file = String(line.log_file);
      byController.set(file, (byController.get(file) ?? 0) + 1);
    }
    console.log(
      `${ROUNDS} failovers in ${elapsedS} s, final epoch ${topology.epoch}, failovers started per controller ${JSON.stringify(Object.fromEntries(byController))}, epochs with a PROMOTE ${promotedAt.size}`,
    );
  });
});
