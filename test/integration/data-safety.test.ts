import { setTimeout as delay } from "node:timers/promises";
import { afterEach, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  CHAOS_CONFIG,
  countKeys,
  probeWrite,
  roleOf,
  startChaosCluster,
  WAIT_MS,
  type WriteProbe,
  waitForNewPrimary,
  writeKeys,
} from "../support/chaos-cluster.ts";
import {
  corruptTopology,
  dbsize,
  probeAll,
  rawHeartbeat,
  rolesOf,
  type SpawnedAgent,
  selfReplicating,
  spawnAgent,
  writable,
} from "../support/data-safety.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * Issue 13, "Done when": data safety on the node. Real redis-server, `shardguard agent` and
 * `shardguard controller` processes on the local stack (CHAOS_CONFIG timings: heartbeat 250 ms,
 * failure timeout 1 s, fence timeout 600 ms). Every check is an observation a client or an
 * operator could make: real writes, ROLE, keys present, raw table items, the controller's log.
 */

/** What systemd `Restart=always` does: the primary's redis-server is back, empty, this soon. */
const EMPTY_RESTART_AFTER_MS = 300;
/** How long after the fault the shard must be whole again (the issue's "12 s later"). */
const SETTLE_MS = 12_000;
/** How long both replicas' redis-server stay SIGSTOPped around the primary's empty restart. */
const REPLICAS_HUNG_MS = 3_000;
/** How long the empty node-1 is watched under its restarted agent, before the controllers resume. */
const RESTARTED_AGENT_WATCH_MS = 8 * CHAOS_CONFIG.heartbeatIntervalMs;
/** Keys acknowledged by both replicas (WAIT 2) before the fault. */
const KEYS = 500;
/** Slack for process scheduling on two shared cores, on top of the issue's bounds. */
const SCHEDULING_SLACK_MS = 5_000;
/** The issue's bound for replacing a hung primary: failure timeout + 2 s (plus slack, see above). */
const HUNG_PRIMARY_DEADLINE_MS = CHAOS_CONFIG.failureTimeoutMs + 2_000 + SCHEDULING_SLACK_MS;
/** After SIGCONT every write probe on the woken old primary is refused for this long. */
const WOKEN_PROBE_MS = 3_000;
/** How long the primary's agent is silent before the test goes on: past its fence timeout and the failure timeout. */
const AGENT_STALL_MS = 2 * CHAOS_CONFIG.failureTimeoutMs;
/** Longest wait for the frozen primary's write fence to be in place before its agent resumes. */
const FENCE_ENGAGE_MS = 8_000;
/** How long the fenced primary is probed once its agent has read the malformed topology. */
const FENCE_PROBE_MS = 3_000;
/** Further wait for the controller's report, which should have come long before (many ticks of 200 ms). */
const CONTROLLER_REPORT_MS = 5_000;

let cluster: LocalCluster | undefined;
let extraAgent: SpawnedAgent | undefined;

afterEach(async () => {
  await extraAgent?.stop();
  extraAgent = undefined;
  await cluster?.stop();
  cluster = undefined;
});

/**
 * The fault itself: SIGKILL, then an empty redis-server on the same port EMPTY_RESTART_AFTER_MS
 * later (no persistence: --save ""). The pause is the fault's timeline (systemd's restart delay),
 * not a wait for a condition.
 */
async function crashAndRestartEmpty(node: RedisNode): Promise<void> {
  node.signal("SIGKILL");
  await delay(EMPTY_RESTART_AFTER_MS);
  await node.start();
}

/** No node replicates from itself (ROLE): an invariant at every moment, not only at the end. */
async function noSelfReplication(active: LocalCluster): Promise<boolean> {
  return (await selfReplicating(active)).length === 0;
}

function describeProbes(probes: readonly WriteProbe[]): string {
  return probes
    .map((probe) => `${probe.node}:${probe.role}:${probe.accepted ? "accepted" : probe.refusal}`)
    .join(", ");
}

describe("data safety on the node (issue 13)", () => {
  it("keeps every WAIT 2 write when the primary's redis-server restarts empty 300 ms after a SIGKILL", {
    timeout: 90_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const old = active.node("node-1");
    await writeKeys(old, "acked", KEYS, 2);

    // Act: crash, and an empty redis-server on the same port; then wait (at most SETTLE_MS after
    // the kill) for the shard to be whole: online, one writable primary holding the keys, node-1 a
    // replica.
    const killedAt = performance.now();
    await crashAndRestartEmpty(old);
    await active
      .waitFor(
        "the shard whole again",
        async () => {
          const primaries = writable(await probeAll(active, "settling"));
          return (
            primaries.length === 1 &&
            (await countKeys(active.node(primaries[0] as string), "acked", KEYS)) === KEYS &&
            (await roleOf(old)).role === "slave" &&
            (await active.topology())?.status === "online"
          );
        },
        Math.max(0, SETTLE_MS - (performance.now() - killedAt)),
      )
      .catch(() => undefined);

    // Assess
    const probes = await probeAll(active, "after-restart");
    const primaries = writable(probes);
    const sizes = await Promise.all(active.redis.map(async (node) => `${node.id}=${await dbsize(node)}`));
    console.log(
      `empty restart: ${Math.round(performance.now() - killedAt)} ms after the kill probes [${describeProbes(probes)}], DBSIZE ${sizes.join(" ")}, ` +
        `topology ${JSON.stringify(await active.topology().catch((error: Error) => error.message))}`,
    );
    expect.soft(primaries, "exactly one writable primary").toHaveLength(1);
    const primary = primaries[0];
    expect(primary, "a writable primary").toBeDefined();
    expect
      .soft(await countKeys(active.node(primary as string), "acked", KEYS), `WAIT 2 keys on ${primary}`)
      .toBe(KEYS);
    expect.soft((await roleOf(old)).role, "the restarted node-1 is a replica").toBe("slave");
  });

  it("keeps every WAIT 2 write when the primary restarts empty while both replicas are hung (the nemesis's seed 3101)", {
    timeout: 90_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const old = active.node("node-1");
    await writeKeys(old, "acked", KEYS, 2);
    const replicas = [active.node("node-2"), active.node("node-3")];

    // Act: the replicas' redis hang; the primary crashes and is back empty; the replicas wake.
    for (const replica of replicas) replica.signal("SIGSTOP");
    await crashAndRestartEmpty(old);
    // The fault's timeline, not a wait: the replicas stay hung longer than Redis's once-a-second
    // reconnect and the agents' probe timeout.
    await delay(REPLICAS_HUNG_MS);
    for (const replica of replicas) replica.signal("SIGCONT");
    let primary: string | undefined;
    await active
      .waitFor(
        "a writable primary holding the acknowledged keys",
        async () => {
          const primaries = writable(await probeAll(active, "hung-replicas"));
          primary = primaries.length === 1 ? primaries[0] : undefined;
          return primary !== undefined && (await countKeys(active.node(primary), "acked", KEYS)) === KEYS;
        },
        SETTLE_MS + SCHEDULING_SLACK_MS,
      )
      .catch(() => undefined);

    // Assess
    const sizes = await Promise.all(active.redis.map(async (node) => `${node.id}=${await dbsize(node)}`));
    const topology = await active.topology().catch((error: Error) => error.message);
    console.log(
      `empty restart under hung replicas: writable primary ${primary ?? "none"}, DBSIZE ${sizes.join(" ")}, topology ${JSON.stringify(topology)}`,
    );
    expect(primary, "one writable primary").toBeDefined();
    expect(await countKeys(active.node(primary as string), "acked", KEYS), `WAIT 2 keys on ${primary}`).toBe(
      KEYS,
    );
    expect(primary, "the node restarted empty is not the primary").not.toBe("node-1");
  });

  it("keeps a database restarted empty fenced across a restart of its agent (the nemesis's seed 3102)", {
    timeout: 90_000,
  }, async () => {
    // Prepare: no controller acts meanwhile (in the nemesis run, a DynamoDB outage held them).
    cluster = await startChaosCluster();
    const active = cluster;
    const old = active.node("node-1");
    await writeKeys(old, "acked", KEYS, 2);
    for (const controller of active.controllers) controller.child.kill("SIGSTOP");

    // Act: redis back empty; its agent fences it; then the agent restarts (same state dir).
    await crashAndRestartEmpty(old);
    await active.waitFor(
      "node-1's agent to fence the empty restart",
      () =>
        active
          .logLines("agent-node-1.log")
          .some((line) => String(line.message).startsWith("database restarted without its data")),
      WAIT_MS,
    );
    await active.stopAgent("node-1", "SIGKILL");
    const restartedAtMs = active.aws.clock.now();
    active.startAgent("node-1");
    await active.waitFor(
      "the restarted agent's first heartbeat",
      async () =>
        Number((await rawHeartbeat(active.shard, "node-1"))?.agent_updated ?? 0) / 1000 > restartedAtMs,
      WAIT_MS,
    );
    // Negative check: over several of the new agent's cycles (RESTARTED_AGENT_WATCH_MS, 8
    // heartbeats), with the store answering and no controller acting, node-1 must stay fenced.
    let whileControllersHeld: WriteProbe | undefined;
    let heldAtMs = 0;
    await holdsFor(
      async () => {
        whileControllersHeld = await probeWrite(old, "restarted-agent");
        heldAtMs = active.aws.clock.now() - restartedAtMs;
        return !whileControllersHeld.accepted;
      },
      "node-1 refusing writes under its restarted agent",
      RESTARTED_AGENT_WATCH_MS,
      100,
    ).catch(() => undefined);
    for (const controller of active.controllers) controller.child.kill("SIGCONT");
    let primary: string | undefined;
    await active
      .waitFor(
        "a writable primary holding the acknowledged keys",
        async () => {
          const primaries = writable(await probeAll(active, "agent-restart"));
          primary = primaries.length === 1 ? primaries[0] : undefined;
          return primary !== undefined && (await countKeys(active.node(primary), "acked", KEYS)) === KEYS;
        },
        SETTLE_MS + SCHEDULING_SLACK_MS,
      )
      .catch(() => undefined);

    // Assess
    const sizes = await Promise.all(active.redis.map(async (node) => `${node.id}=${await dbsize(node)}`));
    console.log(
      `empty restart, then its agent restarted: node-1 ${whileControllersHeld?.accepted ? "accepted" : whileControllersHeld?.refusal} a write ${heldAtMs} ms after its agent restarted, before the controllers resumed; ` +
        `writable primary ${primary ?? "none"}, DBSIZE ${sizes.join(" ")}`,
    );
    expect.soft(whileControllersHeld?.accepted, "the empty node-1 accepted a write").toBe(false);
    expect(primary, "one writable primary").toBeDefined();
    expect(await countKeys(active.node(primary as string), "acked", KEYS), `WAIT 2 keys on ${primary}`).toBe(
      KEYS,
    );
    expect(primary, "the node restarted empty is not the primary").not.toBe("node-1");
  });

  it("keeps one writable primary with its data when the primary's agent restarts with an empty state dir and no --node-id", {
    timeout: 90_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const old = active.node("node-1");
    await writeKeys(old, "acked", KEYS, 2);

    // Act: the sidecar comes back without its state: a new, generated node id.
    await active.stopAgent("node-1", "SIGKILL");
    const restartedAt = performance.now();
    extraAgent = spawnAgent(active, old, { logName: "agent-node-1-fresh.log" });
    // Negative check: the new node id may make the controller act, and the shard must not break
    // meanwhile; SETTLE_MS (the issue's "12 s later") of no node replicating from itself.
    await holdsFor(() => noSelfReplication(active), "no node replicating from itself", SETTLE_MS, 500);

    // Assess: one writable primary, never two. By SETTLE_MS on an idle host; on a loaded one the
    // fresh agent can take 5-6 s to start, past the failure timeout, and the failover it triggers
    // (node-1's old heartbeat goes stale) may still be inside its promotion window at SETTLE_MS (a
    // CI run and the clock watch's measurements: node-2 answered NOREPLICAS at 12.1-12.3 s, its
    // failover completing at 12.2 s). So the probe repeats, within WAIT_MS, failing on two writables.
    let probes = await probeAll(active, "after-agent-restart");
    const doubles: string[] = [];
    const primaries = await waitFor(
      async () => {
        probes = await probeAll(active, "after-agent-restart");
        const found = writable(probes);
        if (found.length > 1) doubles.push(describeProbes(probes));
        return found.length === 1 ? found : false;
      },
      "exactly one writable primary",
      WAIT_MS,
    ).catch(() => writable(probes));
    expect.soft(doubles, "probe rounds with two writable primaries").toEqual([]);
    const roles = await rolesOf(active);
    const self = await selfReplicating(active);
    console.log(
      `empty state dir: ${Math.round(performance.now() - restartedAt)} ms after the agent restart probes ` +
        `[${describeProbes(probes)}], ROLE ${roles.map((r) => `${r.node.id}(:${r.node.port})=${r.role}${r.primaryPort ? `->:${r.primaryPort}` : ""}`).join(" ")}`,
    );
    expect.soft(self, "nodes replicating from themselves").toEqual([]);
    expect.soft(primaries, "exactly one writable primary").toHaveLength(1);
    const primary = primaries[0];
    expect(primary, "a writable primary").toBeDefined();
    expect(await countKeys(active.node(primary as string), "acked", KEYS), `WAIT 2 keys on ${primary}`).toBe(
      KEYS,
    );
  });

  it("replaces a SIGSTOPped primary within the failure timeout + 2 s with default Redis settings, and the woken one refuses every write", {
    timeout: 90_000,
  }, async () => {
    // Prepare: default repl-timeout (60 s); no shortenReplicationTimeout here.
    cluster = await startChaosCluster();
    const active = cluster;
    const old = active.node("node-1");
    const before = await active.topology();
    await writeKeys(old, "acked", KEYS, 2);

    // Act
    const stoppedAt = performance.now();
    old.signal("SIGSTOP");
    let winner: string | undefined;
    await active.waitFor(
      "a replica to take writes",
      async () => {
        const probes = await Promise.all(
          [active.node("node-2"), active.node("node-3")].map((node) => probeWrite(node, "takeover-probe")),
        );
        winner = writable(probes)[0];
        return winner !== undefined;
      },
      HUNG_PRIMARY_DEADLINE_MS,
    );
    const takeoverMs = performance.now() - stoppedAt;
    console.log(
      `hung primary: a replica (${winner}) took writes ${Math.round(takeoverMs)} ms after SIGSTOP ` +
        `(bound ${CHAOS_CONFIG.failureTimeoutMs + 2000} ms + ${SCHEDULING_SLACK_MS} ms slack)`,
    );
    const after = await waitForNewPrimary(active, before?.epoch ?? 0);
    const newPrimary = active.node(after.primary_node_id as string);
    old.signal("SIGCONT");
    const continuedAt = performance.now();
    const accepted: Array<{ at: number; probe: WriteProbe }> = [];
    let probesSent = 0;
    while (performance.now() - continuedAt < WOKEN_PROBE_MS) {
      const probe = await probeWrite(old, `woken-probe:${probesSent}`);
      probesSent++;
      if (probe.accepted) accepted.push({ at: Math.round(performance.now() - continuedAt), probe });
    }
    console.log(
      `hung primary: after SIGCONT ${accepted.length} of ${probesSent} write probes on node-1 accepted` +
        (accepted.length > 0
          ? ` (first ${accepted[0]?.at} ms, last ${accepted.at(-1)?.at} ms after SIGCONT)`
          : ""),
    );

    // Assess
    expect(takeoverMs).toBeLessThan(HUNG_PRIMARY_DEADLINE_MS);
    expect(after.primary_node_id).toBe(winner);
    expect
      .soft(
        accepted.map((a) => a.at),
        "ms after SIGCONT at which node-1 accepted a write",
      )
      .toEqual([]);
    await active.waitFor(
      `node-1 to rejoin as a replica of ${newPrimary.id}`,
      async () => {
        const role = await roleOf(old);
        return role.role === "slave" && role.primaryPort === newPrimary.port && role.state === "connected";
      },
      WAIT_MS,
    );
    expect(writable(await probeAll(active, "after-rejoin"))).toEqual([newPrimary.id]);
    expect(await countKeys(newPrimary, "acked", KEYS)).toBe(KEYS);
  });

  it("fails closed on a malformed TOPOLOGY item: the primary's fence is not lifted and the controller reports inconsistent_topology", {
    timeout: 90_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster();
    const active = cluster;
    const primary = active.node("node-1");
    // The primary's agent freezes past its fence timeout and both replicas' databases freeze,
    // so that nothing confirms node-1 as primary: whatever its agent reads next decides whether
    // node-1 may take writes again.
    active.signalAgent("node-1", "SIGSTOP");
    active.node("node-2").signal("SIGSTOP");
    active.node("node-3").signal("SIGSTOP");

    // Act: the TOPOLOGY item becomes one no schema accepts (epoch a string, unknown status).
    const original = await corruptTopology(active.shard, { epoch: "1", status: "bogus" });
    await active.waitFor(
      "node-1's agent silent past its fence and failure timeouts",
      async () =>
        active.aws.clock.now() -
          Number((await rawHeartbeat(active.shard, "node-1"))?.agent_updated ?? 0) / 1000 >
        AGENT_STALL_MS,
      WAIT_MS,
    );
    // Redis's own guard needs its lag window (whole seconds) to see the frozen replicas: give
    // node-1's fence that long to be in place, so that what follows tests lifting it, not setting it.
    const fencedBeforeResume = await active
      .waitFor(
        "node-1 to refuse writes while its agent is frozen",
        async () => !(await probeWrite(primary, "pre-resume-probe")).accepted,
        FENCE_ENGAGE_MS,
      )
      .then(
        () => true,
        () => false,
      );
    const resumedAtMs = active.aws.clock.now();
    active.signalAgent("node-1", "SIGCONT");
    await active.waitFor(
      "node-1's agent to write a heartbeat after its stall",
      async () =>
        Number((await rawHeartbeat(active.shard, "node-1"))?.agent_updated ?? 0) / 1000 > resumedAtMs,
      WAIT_MS,
    );
    // Negative check: for FENCE_PROBE_MS after its agent read the malformed topology, node-1
    // refuses every write; stops at the first it takes (the assessment below shows when).
    const probes: Array<{ at: number; probe: WriteProbe }> = [];
    const probingFrom = performance.now();
    await holdsFor(
      async () => {
        const at = Math.round(performance.now() - probingFrom);
        const probe = await probeWrite(primary, `fence-probe:${probes.length}`);
        probes.push({ at, probe });
        return !probe.accepted;
      },
      "node-1 fenced after reading a malformed topology",
      FENCE_PROBE_MS,
      20,
    ).catch(() => undefined);

    // Assess
    const accepted = probes.filter((p) => p.probe.accepted);
    console.log(
      `malformed topology (was ${JSON.stringify({ epoch: original.epoch, status: original.status })}): ` +
        `node-1 ${fencedBeforeResume ? "refused writes" : `still took writes ${FENCE_ENGAGE_MS} ms later`} before its agent resumed; ` +
        `${accepted.length} of ${probes.length} write probes on node-1 accepted after its agent resumed`,
    );
    expect
      .soft(
        accepted.map((p) => `${p.at} ms: ${p.probe.role} accepted`),
        "node-1 took writes after reading a malformed topology",
      )
      .toEqual([]);
    let inconsistent: Record<string, unknown> | undefined;
    await active
      .waitFor(
        "the controller to report inconsistent_topology",
        () => {
          inconsistent = active.controllerLogLines().find((line) => line.code === "inconsistent_topology");
          return inconsistent !== undefined;
        },
        CONTROLLER_REPORT_MS,
      )
      .catch(() => undefined);
    const codes = [...new Set(active.controllerLogLines().map((line) => line.code))].filter(Boolean);
    expect(inconsistent, `controller codes seen: ${codes.join(", ")}`).toBeDefined();
  });
});
