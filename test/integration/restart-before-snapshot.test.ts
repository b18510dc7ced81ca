import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS } from "../../src/dev/local-stack/redis-nodes.ts";
import { TcpProxy } from "../../src/dev/nemesis/tcp-proxy.ts";
import { awsEnv } from "../support/aws.ts";
import {
  countKeys,
  probeWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForSettled,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Nemesis seed 7335, incident A (guarantee 5, then 1; 167 acknowledged writes lost), with real
 * processes: the primary's redis-server restarted from an RDB behind what its replicas held, while
 * its agent, itself just restarted, had read no snapshot of the shard (its store calls slowed). The
 * agent's first INFO read judged the new process "harmless: no other node holds its data" — from
 * knowing of no node at all — stored it as the node's identity and opened it: the fork took writes.
 * Now that verdict, as "it continues", holds the process fenced until a snapshot read after the
 * restart judges it again, and that snapshot shows the replicas holding more of the lineage.
 *
 * node-1 primary, node-2 and node-3 members. Keys `before`, then an RDB of node-1, then keys
 * `after` that both replicas acknowledge (the RDB lacks them). The replicas' databases are frozen
 * until node-1 has dropped them and its agent has stored its identity with no synced replica (as in
 * the incident: the agent died inside the 5 s offset refresh after a promotion); the controllers are
 * frozen (in the incident, `follower_unheard` held the failover). node-1's agent dies, its database
 * is SIGKILLed (the replicas' agents park them) and restarted from the RDB, fenced as a supervisor
 * starts it; node-1's agent restarts on its state dir with every store chunk delayed
 * STORE_DELAY_MS each way. The code before opened node-1 on its first INFO read; now it stays fenced,
 * is judged "restarted without its data" on its first snapshot, and the controller brings the shard
 * back on a replica holding every acknowledged write.
 */

const PREFIX = "restart-before-snapshot";
const COUNT = 200;
/** Each chunk through node-1's restarted agent's store proxy, each way: its first snapshot lands seconds after its first INFO read. */
const STORE_DELAY_MS = 850;
/** How long node-1 must stay fenced after its agent's verdict and first report, controllers still frozen. */
const HOLD_MS = 5000;
const OPENED = "no other node holds its data";
const FENCED = "database restarted without its data: fenced until it follows the shard's primary";

let cluster: LocalCluster | undefined;
let proxy: TcpProxy | undefined;

afterEach(async (context) => {
  for (const node of cluster?.redis ?? []) node.signal("SIGCONT");
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  await proxy?.stop();
  cluster = undefined;
  proxy = undefined;
});

/** node-1's agent's state dir, as its last "agent starting" line names it. */
function stateDirOf(active: LocalCluster, id: string): string {
  const line = active.logLines(`agent-${id}.log`).findLast((entry) => entry.message === "agent starting");
  if (typeof line?.stateDir !== "string") throw new Error(`no state dir in ${id}'s log`);
  return line.stateDir;
}

interface StoredIdentity {
  readonly run_id: string;
  readonly offset: number;
  readonly role: string;
  readonly synced: number;
}

function storedIdentity(stateDir: string): StoredIdentity | undefined {
  try {
    const state = JSON.parse(readFileSync(join(stateDir, "state.json"), "utf8")) as {
      db_identity?: StoredIdentity;
    };
    return state.db_identity;
  } catch {
    return undefined;
  }
}

async function offsetOf(active: LocalCluster, id: string): Promise<number> {
  return withClient(active.node(id), async (client) => {
    const info = String(await client.info("replication"));
    return Number(/master_repl_offset:(\d+)/.exec(info)?.[1] ?? Number.NaN);
  });
}

async function onlineReplicas(active: LocalCluster, id: string): Promise<number> {
  return withClient(active.node(id), async (client) => {
    const info = String(await client.info("replication"));
    return [...info.matchAll(/^slave\d+:.*state=online/gm)].length;
  });
}

describe("a primary's database restarted from a behind RDB before its restarted agent read the shard (nemesis seed 7335)", () => {
  it("stays fenced until a snapshot read after the restart judges it, and every acknowledged write survives", {
    timeout: 240_000,
  }, async () => {
    // Prepare: node-1 primary, both members linked; keys before and after node-1's RDB.
    const direct = awsEnv().AWS_ENDPOINT_URL_DYNAMODB;
    if (!direct) throw new Error("no AWS_ENDPOINT_URL_DYNAMODB from the global setup");
    const slow = TcpProxy.forUrl(direct, "node-1 -> DynamoDB");
    proxy = slow;
    await slow.start();
    slow.setMode({ kind: "delay", delayMs: STORE_DELAY_MS });
    cluster = await startChaosCluster({ readyTimeoutMs: 120_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    const primary = active.node("node-1");
    await writeKeys(primary, `${PREFIX}:before`, COUNT, 2);
    await withClient(primary, (client) => client.save());
    const rdbOffset = await offsetOf(active, "node-1");
    await writeKeys(primary, `${PREFIX}:after`, COUNT, 2);
    const afterOffset = await offsetOf(active, "node-1");
    const stateDir = stateDirOf(active, "node-1");

    // The controllers freeze; the replicas' databases freeze until node-1 drops them and its agent
    // stores its identity, past the `after` keys, with no synced replica.
    for (const controller of active.controllers) controller.child.kill("SIGSTOP");
    await withClient(primary, (client) => client.config("SET", "repl-timeout", "2"));
    for (const id of ["node-2", "node-3"]) active.node(id).signal("SIGSTOP");
    await active.waitFor(
      "node-1 with no online replica, its agent's stored identity saying so",
      async () => {
        if ((await onlineReplicas(active, "node-1")) !== 0) return false;
        const stored = storedIdentity(stateDir);
        return stored?.role === "primary" && stored.synced === 0 && stored.offset >= afterOffset;
      },
      WAIT_MS,
    );
    const previous = storedIdentity(stateDir);
    await active.stopAgent("node-1", "SIGKILL");
    for (const id of ["node-2", "node-3"]) active.node(id).signal("SIGCONT");

    // node-1's database dies; both replicas' agents park them (they keep the `after` keys).
    primary.signal("SIGKILL");
    await primary.stop();
    await active.waitFor(
      "node-2 and node-3 parked",
      async () =>
        (await Promise.all(["node-2", "node-3"].map((id) => roleOf(active.node(id))))).every(
          (role) => role.role === "slave" && role.primaryPort === PARKED_PORT,
        ),
      WAIT_MS,
    );
    expect(await countKeys(active.node("node-2"), `${PREFIX}:after`, COUNT)).toBe(COUNT);
    expect(await countKeys(active.node("node-3"), `${PREFIX}:after`, COUNT)).toBe(COUNT);

    // Act: node-1's database back from its RDB (a master, fenced as a supervisor starts it), then its
    // agent on its state dir, every store chunk delayed.
    await primary.start({ extraArgs: FENCED_START_ARGS });
    const rdbHeld = await countKeys(primary, `${PREFIX}:after`, COUNT);
    const linesBefore = active.logLines("agent-node-1.log").length;
    const restartedUs = active.aws.clock.now() * 1000;
    active.startAgent("node-1", {
      env: {
        AWS_ENDPOINT_URL_DYNAMODB: slow.urlFor(direct),
        [ENV.storeTimeoutMs]: String(8 * STORE_DELAY_MS),
      },
    });
    const newLines = () => active.logLines("agent-node-1.log").slice(linesBefore);
    const messages = () =>
      newLines().map((line) => `${String(line.message)}${line.why ? ` (${String(line.why)})` : ""}`);

    // Assess: node-1 refuses every write until its agent has read the shard and judged it, and
    // for HOLD_MS after; it is judged restarted without its data.
    const accepted: string[] = [];
    const probe = async (round: number) => {
      const result = await probeWrite(primary, `${PREFIX}:probe:${round}`);
      if (result.accepted) accepted.push(`probe ${round} as ${result.role}`);
    };
    let round = 0;
    const openedLine = () =>
      newLines().find((line) => line.why === OPENED && line.message === "database restarted");
    await active.waitFor(
      "node-1's restarted agent's verdict on its database, and its first report",
      async () => {
        await probe(round++);
        if (openedLine() === undefined && !newLines().some((line) => line.message === FENCED)) return false;
        const report = active.heartbeatOf(await active.snapshot(), "node-1");
        return report !== undefined && (report.agent_updated ?? report.last_updated) > restartedUs;
      },
      WAIT_MS,
    );
    const holdUntil = performance.now() + HOLD_MS;
    while (performance.now() < holdUntil) {
      await probe(round++);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const opened = openedLine();
    console.log(
      `RDB at offset ${rdbOffset}, the 'after' keys up to ${afterOffset}; stored identity ${JSON.stringify(previous)}; ` +
        `the restarted database held ${rdbHeld} of ${COUNT} 'after' keys; ${round} write probes, accepted: ${accepted.length}\n` +
        `node-1's restarted agent logged: ${[...new Set(messages())].join(" | ")}`,
    );
    expect(rdbHeld).toBe(0);
    // The code before: opened on the first INFO read, and the fork took writes once the topology's
    // guard was set (16 of ~120 probes in 2 runs).
    expect({ opened: opened?.why, accepted }).toEqual({ opened: undefined, accepted: [] });
    expect(newLines().some((line) => line.message === FENCED)).toBe(true);

    // Assess: the controllers resume; the shard comes back on a node holding every acknowledged
    // write, and every node holds them once settled.
    slow.heal();
    for (const controller of active.controllers) controller.child.kill("SIGCONT");
    await waitForSettled(active);
    const final = (await active.topology())?.primary_node_id ?? "node-1";
    for (const id of [final, "node-1", "node-2", "node-3"]) {
      const held = {
        before: await countKeys(active.node(id), `${PREFIX}:before`, COUNT),
        after: await countKeys(active.node(id), `${PREFIX}:after`, COUNT),
      };
      expect({ id, ...held }).toEqual({ id, before: COUNT, after: COUNT });
    }
  });
});
