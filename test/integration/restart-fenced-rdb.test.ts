import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  countKeys,
  expectKeysEverywhere,
  historyAt,
  probeWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  waitForAgentWrite,
  waitForFollowers,
  waitForMembers,
  waitForNewPrimary,
  waitForSettled,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";

/**
 * Simulator seed 420283 (guarantee 1: every acknowledged write lost), with real processes. The
 * primary's database, with both replicas holding every acknowledged write, is restarted from an old
 * RDB (its agent fences it: restarted without its data), then restarted empty (fenced again), then
 * restarted from an RDB that empty process saved. Judged only against the process before it, that
 * last process "continued its lineage": held pending until the peers reported since, then opened
 * (`rejudgeRestart` cleared the fence), and the node served alone, its parked members dropped from
 * the write guard, while they held every acknowledged write. Now a process the agent fenced as
 * restarted without its data is continued by nothing (`judgeRestart`'s `fenced`).
 *
 * In Redis 7.0 an empty master's RDB carries its replication id only if the process made a
 * replication backlog (docs/open-holes/sim-420283-analysis.md, "Correction"): here a backup job
 * (`redis-cli --rdb`, a dump over the replication protocol) does, as any replica attaching would.
 * The empty process takes a new id for that backlog, at offset 0, and its RDB keeps it: the
 * process restarted from it shows it as `master_replid2` at offset 0, the seed's shape.
 *
 * The controllers are frozen through the three restarts (in the seed, controller-overlap and a
 * pause: no decision for 46 s); the replicas report every cycle or two, so the code before's
 * rejudge came within a second of the last restart. node-1 must refuse every write through it and
 * HOLD_MS after; once the controllers resume, they replace it by a member holding every
 * acknowledged write, and node-1 resyncs from that member. The code before (2ece910^) reopened it
 * about a second after the last restart and it took 40 of 41 probe writes, holding none of the
 * `after` keys. With real processes the controllers, once resumed, still replaced it (both parked
 * members report it restarted: offline, then node-2), so the acknowledged writes survived there;
 * in the seed they kept it as a fresh primary to the end. The hold is what fails on that code.
 */

const PREFIX = "restart-fenced-rdb";
const COUNT = 200;
/** The replicas' keepalive: each writes its report every cycle or two instead of every 5 s. */
const REPLICA_KEEPALIVE_MS = 500;
/** How long node-1 must stay fenced once every member reported after its last restart's verdict. */
const HOLD_MS = 5000;
const FENCED = "database restarted without its data: fenced until it follows the shard's primary";
const REOPENED =
  "database restart judged on the other nodes' reports written since: it continues its lineage";
const CONTINUES_FENCED = "it continues only a process that had restarted without its data";

const run = promisify(execFile);

let cluster: LocalCluster | undefined;

afterEach(async (context) => {
  for (const controller of cluster?.controllers ?? []) controller.child.kill("SIGCONT");
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** A database's replication as INFO gives it, with its process's run id. */
async function replicationOf(node: RedisNode) {
  return withClient(node, async (client) => {
    const info = `${String(await client.info("server"))}\n${String(await client.info("replication"))}`;
    const field = (name: string) => new RegExp(`^${name}:(\\S+)`, "m").exec(info)?.[1] ?? "";
    return {
      runId: field("run_id"),
      replId: field("master_replid"),
      offset: Number(field("master_repl_offset")),
      replId2: field("master_replid2"),
      secondOffset: Number(field("second_repl_offset")),
    };
  });
}

/** The identity of its database node `id`'s agent keeps in its state dir (the one the next restart is judged against). */
function agentIdentityOf(
  active: LocalCluster,
  id: string,
): { run_id?: string; repl_id?: string } | undefined {
  const started = active.logLines(`agent-${id}.log`).findLast((line) => line.message === "agent starting");
  try {
    return JSON.parse(readFileSync(join(String(started?.stateDir), "state.json"), "utf8")).db_identity;
  } catch {
    return undefined;
  }
}

describe("a primary's database restarted from an old RDB, then empty, then from the empty process's RDB (simulator seed 420283)", () => {
  it("stays fenced, is replaced by a member holding every acknowledged write, and loses none", {
    timeout: 180_000,
  }, async () => {
    // Prepare: node-1 primary, both members linked; keys before and after node-1's RDB, every one
    // acknowledged by both replicas.
    cluster = await startChaosCluster({
      readyTimeoutMs: 120_000,
      agentEnv: (id) =>
        id === "node-1" ? undefined : { [ENV.replicaKeepaliveMs]: String(REPLICA_KEEPALIVE_MS) },
    });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    const primary = active.node("node-1");
    await writeKeys(primary, `${PREFIX}:before`, COUNT, 2);
    await withClient(primary, (client) => client.save());
    await writeKeys(primary, `${PREFIX}:after`, COUNT, 2);
    const first = await replicationOf(primary);
    const epoch = (await active.topology())?.epoch ?? 0;
    for (const controller of active.controllers) controller.child.kill("SIGSTOP");
    const newLines = (from: number) => active.logLines("agent-node-1.log").slice(from);
    const verdictOn = (from: number, runId: string) =>
      newLines(from).find(
        (line) => line.runId === runId && (line.message === FENCED || line.message === REOPENED),
      );
    /** node-1's database killed and started again as a supervisor starts it (fenced); its agent's verdict on it. */
    const restart = async (what: string, wipe: boolean) => {
      primary.signal("SIGKILL");
      await primary.stop();
      if (wipe) primary.wipeData();
      const from = active.logLines("agent-node-1.log").length;
      await primary.start({ extraArgs: FENCED_START_ARGS });
      const started = await replicationOf(primary);
      await active.waitFor(
        `node-1's agent's verdict on its database ${what}`,
        () => newLines(from).some((line) => line.runId === started.runId && line.message === FENCED),
        WAIT_MS,
      );
      return started;
    };

    // node-1's database dies; both replicas' agents park them (they keep the `after` keys). It
    // comes back from the old RDB, without the `after` keys: fenced.
    primary.signal("SIGKILL");
    await active.waitFor(
      "node-2 and node-3 parked",
      async () =>
        (await Promise.all(["node-2", "node-3"].map((id) => roleOf(active.node(id))))).every(
          (role) => role.role === "slave" && role.primaryPort === PARKED_PORT,
        ),
      WAIT_MS,
    );
    const oldRdb = await restart("restarted from the old RDB", false);
    expect(await countKeys(primary, `${PREFIX}:after`, COUNT)).toBe(0);

    // Restarted empty: fenced again. A backup job dumps it over the replication protocol: the
    // process makes a backlog, under a new replication id at offset 0, and its agent reads it.
    const empty = await restart("restarted empty", true);
    await run("redis-cli", ["-p", String(primary.port), "--rdb", join(primary.dataDir, "backup.rdb")], {
      timeout: 10_000,
    });
    const backedUp = await replicationOf(primary);
    await active.waitFor(
      "node-1's agent keeping the empty process's new replication id",
      () => agentIdentityOf(active, "node-1")?.repl_id === backedUp.replId,
      WAIT_MS,
    );
    expect(agentIdentityOf(active, "node-1")?.run_id).toBe(empty.runId);

    // Act: the empty process saves its RDB; node-1's database restarts from it.
    await withClient(primary, (client) => client.save());
    const from = active.logLines("agent-node-1.log").length;
    primary.signal("SIGKILL");
    await primary.stop();
    await primary.start({ extraArgs: FENCED_START_ARGS });
    const last = await replicationOf(primary);
    const shape = [first, oldRdb, empty, backedUp, last]
      .map((point) => `${point.runId.slice(0, 6)} ${point.replId.slice(0, 6)}@${point.offset}`)
      .concat(`last replid2 ${last.replId2.slice(0, 6)}@${last.secondOffset - 1}`)
      .join(" -> ");
    // The seed's shape: the empty process's id, kept by its RDB, as the last one's replid2 at 0.
    expect({ shape, replId2: last.replId2, at: last.secondOffset - 1 }).toEqual({
      shape,
      replId2: backedUp.replId,
      at: 0,
    });
    await active.waitFor(
      "node-1's agent's verdict on the process restarted from the empty process's RDB",
      // Fenced, or (the code before) held pending on the peers' reports.
      () => newLines(from).some((line) => line.runId === last.runId && line.why !== undefined),
      WAIT_MS,
    );

    // Assess: node-1 refuses every write until both members reported after the verdict (the code
    // before reopened it then), and HOLD_MS after; its report says its database is down.
    const judgedMs = Date.now();
    const accepted: string[] = [];
    let round = 0;
    const probe = async () => {
      const result = await probeWrite(primary, `${PREFIX}:probe:${round}`);
      if (result.accepted) accepted.push(`probe ${round} as ${result.role}`);
      round++;
    };
    await probe();
    for (const id of ["node-2", "node-3", "node-1"]) await waitForAgentWrite(active, id, judgedMs, 0);
    const holdUntil = performance.now() + HOLD_MS;
    while (performance.now() < holdUntil) {
      await probe();
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const reported = active.heartbeatOf(await active.snapshot(), "node-1");
    const verdict = verdictOn(from, last.runId);
    const lines = newLines(from).map(
      (line) => `${String(line.message)}${line.why ? ` (${String(line.why)})` : ""}`,
    );
    console.log(
      `node-1's processes (run id, replication id@offset): ${shape}\n` +
        `${round} write probes, accepted: ${accepted.length}; node-1 reported db ${reported?.db_status}\n` +
        `node-1's agent logged since the last restart: ${[...new Set(lines)].join(" | ")}`,
    );
    // The code before: pending, then "it continues its lineage", and the fork took writes.
    expect({ reopened: newLines(from).find((line) => line.message === REOPENED)?.why, accepted }).toEqual({
      reopened: undefined,
      accepted: [],
    });
    expect(verdict?.message).toBe(FENCED);
    expect(String(verdict?.why)).toContain(CONTINUES_FENCED);
    expect(reported?.db_status).toBe("down");

    // Assess: the controllers resume and replace node-1 by a member; node-1 follows it, and every
    // acknowledged write is on every node.
    for (const controller of active.controllers) controller.child.kill("SIGCONT");
    const replaced = await waitForNewPrimary(active, epoch);
    const record = await historyAt(active, replaced.epoch);
    console.log(`what replaced node-1: ${record.kind} at epoch ${record.epoch}: ${record.reason}`);
    expect(["node-2", "node-3"]).toContain(replaced.primary_node_id);
    await waitForSettled(active);
    await expectKeysEverywhere(active, [
      [`${PREFIX}:before`, COUNT],
      [`${PREFIX}:after`, COUNT],
    ]);
    await active.waitFor(
      "the new primary taking writes",
      async () =>
        (await probeWrite(active.node(replaced.primary_node_id ?? ""), `${PREFIX}:after-failover`)).accepted,
      WAIT_MS,
    );
  });
});
