import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  withClient,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";
import { holdsFor } from "../support/wait.ts";

/**
 * Issue 30, finding 8 (guarantee 2): `shardguard recover` set the shard's lineage to the chosen
 * node's, naming it as the old primary too, so the offline replica-set rule compared the node
 * with itself. The situation that prompts a recover: the old primary's replicas detached (its
 * replica set empty, its write guard needing nobody), its agent paused, the shard offline with no
 * candidate, its database still writable. Recovering on a replica then made two writable
 * primaries; now it is refused with what to do. Real redis-server, agents, controller, the CLI.
 */

/**
 * The production failure timeout: on loaded cores node-1's heartbeat must not go stale (and be
 * failed over) while its replicas detach, before its agent is paused on purpose.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000 };

/** Long enough for the controller's next cycles (200 ms apart) to act on an accepted recover. */
const STILL_OFFLINE_MS = 5_000;

let cluster: LocalCluster | undefined;

afterEach(async () => {
  cluster?.signalAgent("node-1", "SIGCONT");
  await cluster?.stop();
  cluster = undefined;
});

describe("shardguard recover and the old primary's replica set", () => {
  it("refuses to recover on a replica outside the set of an old primary that may still take writes", {
    timeout: 180_000,
  }, async () => {
    // Prepare: both replicas detached (their handshake refused), node-1's set empty and writable alone.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 90_000 });
    const active = cluster;
    for (const id of ["node-2", "node-3"]) {
      await withClient(active.node(id), async (client) => {
        await client.config("SET", "masterauth", "not-the-primary-password");
        await client.call("CLIENT", "KILL", "TYPE", "master");
      });
    }
    await active.waitFor(
      "node-1 writable with an empty replica set",
      async () => {
        const snapshot = await active.snapshot();
        const emptySet =
          snapshot.replicaSetVersions["node-1"] !== undefined &&
          (snapshot.replicaSets["node-1"] ?? []).length === 0;
        return emptySet && (await probeWrite(active.node("node-1"), "recover-before")).accepted;
      },
      WAIT_MS,
    );
    active.signalAgent("node-1", "SIGSTOP");
    await active.waitFor(
      "the shard offline",
      async () => (await active.topology())?.status === "offline",
      WAIT_MS,
    );
    const offline = await active.topology();
    const stillWritable = await probeWrite(active.node("node-1"), "recover-offline");
    expect(stillWritable.accepted, JSON.stringify(stillWritable)).toBe(true);

    // Act
    const result = await shardguard(
      active,
      "recover",
      "--shard",
      active.shard,
      "--to",
      "node-2",
      "--reason",
      "node-1 looks gone; keeping node-2's data",
      "--json",
    );

    // Assess: refused with the reason; the shard stays offline and node-2 read-only while node-1 serves.
    expect(result.code, result.stdout + result.stderr).not.toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ ok: false, outcome: "refused" });
    expect(result.stdout).toMatch(/node-2 is not in node-1's replica set.*two writable primaries/);
    await holdsFor(
      async () => {
        const topology = await active.topology();
        const replica = await probeWrite(active.node("node-2"), "recover-after");
        return topology?.status === "offline" && topology.epoch === offline?.epoch && !replica.accepted;
      },
      "the shard offline at its epoch, node-2 refusing writes",
      STILL_OFFLINE_MS,
    );
  });
});
