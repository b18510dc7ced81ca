import { afterEach, describe, expect, it } from "vitest";
import { type ControllerView, controllerView } from "../../src/cli/status-view.ts";
import { parseFailoverConfig } from "../../src/core/config.ts";
import { confirmedCrash } from "../../src/core/crash.ts";
import type { Heartbeat, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import {
  CHAOS_CONFIG,
  describeReport,
  historyAt,
  linesWith,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  waitForNewPrimary,
  waitForWritablePrimary,
} from "../support/chaos-cluster.ts";
import { shardguard } from "../support/cli.ts";
import { continuousWriter, missingKeys } from "../support/data-safety.ts";

/**
 * Simulator seed 117581 (guarantee 3: a primary that cannot serve is replaced within the failure
 * timeout plus the graces), with real redis-server processes, agents, a controller, DynamoDB Local
 * and the SQS emulator. A change of primary starts the cool-down (`cooldown_until`, gate
 * `cooldown_online`: no automatic change until it ends, so a flapping shard does not ping-pong).
 * Here the new primary's database crashes inside that cool-down, its agent alive beside it and
 * confirming the crash (`db_crash`, refused over loopback). Nothing flaps there: the crash is the
 * primary's own agent's word. Before the fix (src/core/decide/online.ts of 794f0d5^) the gate held
 * the replacement for the rest of the cool-down, the shard without a writable primary all along (the
 * seed: 31 s at the simulator's 30 s cool-down; 5 minutes at the default). Now the gate yields to
 * the confirmed crash (`deadPrimary`) and the crash fast path replaces the primary at once.
 *
 * node-1 primary, node-2 and node-3 its replicas, a client writing all along that counts a key only
 * once a replica acknowledged it (`WAIT 1`) and follows whichever node takes writes. node-1's
 * redis-server is SIGKILLed: the crash fast path promotes node-2 or node-3 (the first promoted), the
 * other (the survivor) follows it, and the completed failover starts a 120 s cool-down. The client
 * writes on the first promoted node, acknowledged by the survivor; then that node's redis-server is
 * SIGKILLed as well. Asserted: the topology names a writable primary, the survivor, well inside the
 * cool-down (failure timeout plus a margin for two loaded cores); it holds every acknowledged key;
 * the failover's reason is the confirmed crash; and no controller decision after the crash said
 * "cool-down".
 *
 * Measured (2 loaded cores): with 794f0d5^'s src/core/decide/online.ts no writable primary 20 s
 * after the second kill, the topology still online on the dead node-2 with ~97 s of cool-down left,
 * the controller's rules on the confirmed crash "waiting (cooldown): in cool-down for 119019 ms more
 * after the last change of primary" (4 runs of 4); after, node-3 writable 0.96-1.31 s after the
 * kill, holding all 64-74 acknowledged keys (5 of 5). node-1 never comes back
 * (not needed for the hole). No fixed sleeps: every wait is on a condition with a deadline.
 */

const PREFIX = "cooldown-crash";
/**
 * A failure timeout of 3 s, as in the neighbouring tests: agents slowed by a loaded machine do not
 * look dead. A cool-down far past every deadline below: the code before holds the replacement that long.
 */
const CONFIG = { ...CHAOS_CONFIG, failureTimeoutMs: 3000, fenceTimeoutMs: 2000, cooldownMs: 120_000 };
const SETTINGS = parseFailoverConfig(CONFIG);
/** Guarantee 3's bound after a crash: the failure timeout plus a margin for two loaded cores. */
const WRITABLE_WITHIN_MS = CONFIG.failureTimeoutMs + 17_000;
/** Keys the client has acknowledged (`WAIT 1`) on each primary before it is killed. */
const ACKED_PER_PRIMARY = 30;

let cluster: LocalCluster | undefined;
const stops: Array<() => Promise<unknown>> = [];

afterEach(async (context) => {
  for (const stop of stops.splice(0)) await stop();
  await cluster?.stop({ keepLogs: context.task.result?.state === "fail" });
  cluster = undefined;
});

/** The topology, every node's report, what the controller would do now and the history, for a failure. */
async function diagnostics(active: LocalCluster): Promise<string> {
  const topology = await active.topology().catch(() => undefined);
  const snapshot = await active.snapshot().catch(() => undefined);
  const status = await shardguard(active, "status", "--shard", active.shard, "--json");
  let controller = `status exited ${status.code}: ${status.stderr.trim()}`;
  try {
    const parsed = JSON.parse(status.stdout) as { shards?: Array<{ controller?: { line?: string } }> };
    controller = parsed.shards?.[0]?.controller?.line ?? status.stdout.trim();
  } catch {
    // Not JSON: the exit code and stderr above say why.
  }
  const history = await active.aws.store.history.list(active.shard, 100).catch(() => []);
  return [
    `topology: status ${topology?.status}, epoch ${topology?.epoch}, primary ${topology?.primary_node_id}, ` +
      `cool-down ${topology?.cooldown_until === undefined ? "none" : `${topology.cooldown_until - Date.now()} ms more`}`,
    ...active.redis.map((node) =>
      describeReport(snapshot === undefined ? undefined : active.heartbeatOf(snapshot, node.id)),
    ),
    controller,
    ...history.map(
      (record) =>
        `history epoch ${record.epoch} ${record.kind} -> ${record.new_primary_node_id}: ${record.reason}`,
    ),
  ].join("\n");
}

describe("a primary whose database crashes within the cool-down after a failover, its agent confirming it (simulator seed 117581)", () => {
  it("is replaced at once by a writable primary holding every acknowledged write, cool-down notwithstanding", {
    timeout: 120_000,
  }, async () => {
    expect(WRITABLE_WITHIN_MS * 2).toBeLessThan(CONFIG.cooldownMs);

    // Arrange: node-1 primary, node-2 and node-3 its replicas in its stored set; a client writing
    // with `WAIT 1`, following whichever node takes writes.
    cluster = await startChaosCluster({ config: CONFIG, readyTimeoutMs: 60_000 });
    const active = cluster;
    await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
    await waitForMembers(active, "node-1", ["node-2", "node-3"]);
    const writer = continuousWriter(active, "node-1", { prefix: PREFIX, follow: true, waitReplicas: 1 });
    stops.push(writer.stop);
    const ackedOn = (id: string): number =>
      [...writer.report().ackedBy.values()].filter((by) => by === id).length;
    await active.waitFor(
      `${ACKED_PER_PRIMARY} keys acknowledged on node-1`,
      () => ackedOn("node-1") >= ACKED_PER_PRIMARY,
      WAIT_MS,
    );
    const initial = (await active.topology()) as Topology;
    expect(initial).toMatchObject({ status: "online", primary_node_id: "node-1" });

    // The first change of primary: node-1's redis-server SIGKILLed beside its live agent.
    active.node("node-1").signal("SIGKILL");
    const changed = await waitForNewPrimary(active, initial.epoch);
    const first = changed.primary_node_id ?? "";
    expect(["node-2", "node-3"]).toContain(first);
    const survivor = first === "node-2" ? "node-3" : "node-2";
    await waitForFollowers(active, first, [survivor]);
    await active.waitFor(
      `${ACKED_PER_PRIMARY} keys acknowledged on ${first} (by ${survivor})`,
      () => ackedOn(first) >= ACKED_PER_PRIMARY,
      WAIT_MS,
    );
    // The premise: the cool-down that failover started runs past this test's every deadline.
    const cooling = (await active.topology()) as Topology;
    expect(cooling).toMatchObject({ status: "online", epoch: changed.epoch, primary_node_id: first });
    const coolDownLeftMs = (cooling.cooldown_until ?? 0) - Date.now();
    expect(coolDownLeftMs, "cool-down left at the second kill").toBeGreaterThan(WRITABLE_WITHIN_MS + 10_000);
    const linesBefore = active.controllerLogLines().length;

    // Act: the first promoted node's redis-server is SIGKILLed inside the cool-down; its agent
    // lives and confirms the crash.
    const killedAt = performance.now();
    active.node(first).signal("SIGKILL");
    // The first snapshot that holds the agent's confirmed crash report, and what the controller
    // decides from it (the same rules and line as \`shardguard status\`).
    let crashed: Heartbeat | undefined;
    let atCrash: { epoch: number | undefined; view: ControllerView } | undefined;
    await active.waitFor(
      `${first}'s agent confirming its database's crash`,
      async () => {
        const snapshot = await active.snapshot();
        const heartbeat = active.heartbeatOf(snapshot, first);
        const now = active.aws.clock.now();
        if (heartbeat === undefined || confirmedCrash(heartbeat, SETTINGS, now) === undefined) return false;
        crashed = heartbeat;
        atCrash = { epoch: snapshot.topology?.epoch, view: controllerView(snapshot, SETTINGS, now) };
        return true;
      },
      WAIT_MS,
    );

    // Assess: a writable primary named by the topology within the failure timeout plus the margin,
    // the survivor, holding every acknowledged key; not held by the cool-down.
    let writable: { primary: string; afterMs: number } | undefined;
    let waited = "";
    try {
      writable = await waitForWritablePrimary(active, changed.epoch, killedAt, WRITABLE_WITHIN_MS);
    } catch (error) {
      waited = error instanceof Error ? (error.message.split("; topology:")[0] ?? "") : String(error);
    }
    const report = await writer.stop();
    const described = await diagnostics(active);
    console.log(
      `first failover onto ${first}; cool-down ${Math.round(coolDownLeftMs / 1000)} s left at the second kill; ` +
        `writable primary ${writable?.primary ?? "none"} ${Math.round(writable?.afterMs ?? -1)} ms after it; ` +
        `${report.acked.length} acknowledged keys (${ackedOn("node-1")} on node-1, ${ackedOn(first)} on ${first}); ` +
        `crash report ${JSON.stringify(crashed?.db_crash)}; at its confirmation ${atCrash?.view.line}\n${described}`,
    );
    expect(
      writable,
      `a writable primary within ${WRITABLE_WITHIN_MS} ms (${waited})\n${described}`,
    ).toBeDefined();
    expect(writable?.primary, described).toBe(survivor);
    expect(writable?.afterMs ?? Number.POSITIVE_INFINITY).toBeLessThan(WRITABLE_WITHIN_MS);
    const missing = await missingKeys(active.node(survivor), report.acked);
    expect(missing, `acknowledged keys missing on ${survivor}\n${described}`).toEqual([]);
    expect(report.acked.length).toBeGreaterThanOrEqual(2 * ACKED_PER_PRIMARY);
    const topology = (await active.topology()) as Topology;
    const record = await historyAt(active, changed.epoch + 1);
    expect(record, described).toMatchObject({ old_primary_node_id: first, new_primary_node_id: survivor });
    expect(record.reason).toMatch(new RegExp(`primary ${first}'s agent saw its database die`));
    expect(record.reason).not.toMatch(/cool-down/);
    expect(topology.epoch).toBeGreaterThan(changed.epoch);
    // What the controller decides from the first snapshot holding the confirmed crash: not the
    // cool-down (before the fix: "waiting (cooldown): in cool-down for ... ms more"), unless the
    // controller's failover had already moved the shard past the cool-down's epoch by that read.
    const heldAtCrash = atCrash?.epoch === changed.epoch && atCrash.view.code === "cooldown";
    expect(heldAtCrash, `at epoch ${atCrash?.epoch}: ${atCrash?.view.line}`).toBe(false);
    const afterKill = active.controllerLogLines().slice(linesBefore);
    const heldAfterKill = afterKill.filter(
      (line) => line.code === "cooldown" && line.epoch === changed.epoch,
    );
    expect(heldAfterKill, "controller decisions held by the cool-down after the crash").toEqual([]);
    expect(linesWith(afterKill, "failover started").length).toBeGreaterThan(0);
  });
});
