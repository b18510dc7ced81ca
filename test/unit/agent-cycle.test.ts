import { describe, expect, it } from "vitest";
import {
  type AgentCycleState,
  type CycleObservation,
  DOUBT_HEARTBEAT_MS,
  type FollowedPrimary,
  keepaliveMs,
  planCycle,
  reportSignature,
  topologyToWatch,
} from "../../src/core/agent-cycle.ts";
import type { HeartbeatInput } from "../../src/core/model.ts";
import { aHeartbeat, aShard, NOW as BUILDER_NOW } from "../support/builders.ts";

/**
 * planCycle: what one heartbeat cycle of the agent does, from what it remembers and what it
 * observed so far. One row per rule; the loop (src/agent/heartbeat-loop.ts) only carries it out.
 */

const timings = {
  heartbeatIntervalMs: 1000,
  failureTimeoutMs: 3000,
  primaryKeepaliveMs: 1000,
  replicaKeepaliveMs: 10_000,
};
const NOW = 1_000_000;

const replicaReport: HeartbeatInput = aHeartbeat({ node_id: "r1" });
const primaryReport: HeartbeatInput = aHeartbeat({
  node_id: "p1",
  role: "primary",
  primary_node_id: undefined,
  primary_link: undefined,
});

/** A replica agent in steady state: topology read, its last report written 2 s ago, nothing in doubt. */
function aState(overrides: Partial<AgentCycleState> = {}): AgentCycleState {
  return {
    storeRequested: false,
    topologyRead: true,
    confirmed: false,
    lastWritten: { keepaliveMs: 10_000, signature: reportSignature(replicaReport), at: NOW - 2000 },
    doubtSince: undefined,
    wokeFor: undefined,
    reportUntil: Number.NEGATIVE_INFINITY,
    topologyDoubt: false,
    dbUp: true,
    dbRestarted: false,
    crash: undefined,
    ...overrides,
  };
}

const replicaUp = { answered: true, role: "replica", link: "up", parked: false, probed: "ok" } as const;
const primaryUp = {
  answered: true,
  role: "primary",
  link: undefined,
  parked: false,
  probed: undefined,
} as const;
const crash = { state: "refused", run_id: "run-1", first_seen: 5_000_000, last_seen: 5_200_000 } as const;

describe("planCycle: whether the cycle reads the topology", () => {
  it.each<{
    name: string;
    state: AgentCycleState;
    observation: CycleObservation;
    because: string | undefined;
  }>([
    {
      name: "reads when forced (a command applied, a wake-up)",
      state: aState(),
      observation: { force: true },
      because: "forced",
    },
    {
      name: "reads when asked (start, a failed store call)",
      state: aState({ storeRequested: true }),
      observation: {},
      because: "requested",
    },
    {
      name: "reads before the topology was ever read",
      state: aState({ topologyRead: false }),
      observation: {},
      because: "topology never read",
    },
    {
      name: "reads before anything was written",
      state: aState({ lastWritten: undefined }),
      observation: {},
      because: "nothing written yet",
    },
    {
      name: "reads every cycle while in doubt",
      state: aState({ doubtSince: NOW - 100 }),
      observation: {},
      because: "in doubt",
    },
    {
      name: "stays quiet once the doubt lasted two failure timeouts",
      state: aState({ doubtSince: NOW - 6000 }),
      observation: {},
      because: undefined,
    },
    {
      name: "reads when its keepalive would pass before the next cycle",
      state: aState({ lastWritten: { keepaliveMs: 10_000, signature: "x", at: NOW - 9500 } }),
      observation: {},
      because: "keepalive due",
    },
    { name: "stays quiet within its keepalive", state: aState(), observation: {}, because: undefined },
    {
      name: "stays quiet when the report it would write is the one written",
      state: aState(),
      observation: { database: replicaUp, heartbeat: { ...replicaReport, last_txn_id: 5000 } },
      because: undefined,
    },
    {
      name: "reads when the report changed (the link went down)",
      state: aState(),
      observation: { database: replicaUp, heartbeat: { ...replicaReport, primary_link: "down" } },
      because: "report changed",
    },
    {
      name: "reads when a primary has a synced replica it cannot name (only the store tells)",
      state: aState({
        lastWritten: { keepaliveMs: 1000, signature: reportSignature(primaryReport), at: NOW - 100 },
      }),
      observation: { database: primaryUp, heartbeat: primaryReport, unknownReplica: true },
      because: "a replica the agent cannot name",
    },
    {
      name: "reads at once when this cycle's INFO puts it in doubt (the link is down)",
      state: aState(),
      observation: { database: { ...replicaUp, link: "down" } },
      because: "in doubt",
    },
  ])("$name", ({ state, observation, because }) => {
    // Act
    const plan = planCycle(state, observation, timings, NOW);

    // Assess
    expect(plan).toMatchObject({ readTopology: because !== undefined, because });
  });
});

describe("planCycle: doubt (fast heartbeats)", () => {
  it.each<{
    name: string;
    state: AgentCycleState;
    observation: CycleObservation;
    doubtSince: number | undefined;
  }>([
    {
      name: "a replica whose link is down is in doubt from now",
      state: aState(),
      observation: { database: { ...replicaUp, link: "down" } },
      doubtSince: NOW,
    },
    {
      name: "a stretch of doubt keeps its start",
      state: aState({ doubtSince: NOW - 500 }),
      observation: { database: { ...replicaUp, link: "down" } },
      doubtSince: NOW - 500,
    },
    {
      name: "a parked replica is in doubt",
      state: aState(),
      observation: { database: { ...replicaUp, parked: true } },
      doubtSince: NOW,
    },
    {
      name: "a replica whose probe finds the primary fenced is in doubt",
      state: aState(),
      observation: { database: { ...replicaUp, probed: "fenced" } },
      doubtSince: NOW,
    },
    {
      name: "a healthy replica ends the doubt",
      state: aState({ doubtSince: NOW - 500 }),
      observation: { database: replicaUp },
      doubtSince: undefined,
    },
    {
      name: "a database that died with a crash report stays in doubt",
      state: aState({ crash }),
      observation: { database: { answered: false } },
      doubtSince: NOW,
    },
    {
      name: "a database down without a crash report is not in doubt",
      state: aState(),
      observation: { database: { answered: false } },
      doubtSince: undefined,
    },
    {
      name: "doubt is unchanged until the database was read",
      state: aState({ doubtSince: NOW - 500 }),
      observation: {},
      doubtSince: NOW - 500,
    },
  ])("$name", ({ state, observation, doubtSince }) => {
    expect(planCycle(state, observation, timings, NOW).doubtSince).toBe(doubtSince);
  });

  it("beats every DOUBT_HEARTBEAT_MS while in doubt and at the interval otherwise", () => {
    expect(planCycle(aState({ doubtSince: NOW - 100 }), {}, timings, NOW).cadenceMs).toBe(DOUBT_HEARTBEAT_MS);
    expect(planCycle(aState(), {}, timings, NOW).cadenceMs).toBe(1000);
  });
});

describe("planCycle: the write guard", () => {
  it.each<{
    name: string;
    state: AgentCycleState;
    observation: CycleObservation;
    guard: boolean;
    guardFirst: boolean;
  }>([
    {
      name: "a primary the topology no longer confirms raises its guard before the heartbeat goes out",
      state: aState({ confirmed: false }),
      observation: { database: primaryUp },
      guard: true,
      guardFirst: true,
    },
    {
      name: "a confirmed primary's guard follows the write",
      state: aState({ confirmed: true }),
      observation: { database: primaryUp },
      guard: true,
      guardFirst: false,
    },
    {
      name: "a replica's guard follows the write",
      state: aState(),
      observation: { database: replicaUp },
      guard: true,
      guardFirst: false,
    },
    {
      name: "no guard without a database that answered",
      state: aState(),
      observation: { database: { answered: false } },
      guard: false,
      guardFirst: false,
    },
    {
      name: "no guard before the topology was read (fenced start)",
      state: aState({ topologyRead: false, confirmed: undefined }),
      observation: { database: primaryUp },
      guard: false,
      guardFirst: false,
    },
    {
      name: "a database restarted without its data is guarded before any topology read",
      state: aState({ topologyRead: false, dbRestarted: true }),
      observation: { database: primaryUp },
      guard: true,
      guardFirst: true,
    },
  ])("$name", ({ state, observation, guard, guardFirst }) => {
    expect(planCycle(state, observation, timings, NOW)).toMatchObject({ guard, guardFirst });
  });
});

describe("planCycle: the heartbeat write", () => {
  it.each<{ name: string; state: AgentCycleState; observation: CycleObservation; verdict: string }>([
    {
      name: "writes a replica's report",
      state: aState(),
      observation: { heartbeat: replicaReport },
      verdict: "write",
    },
    {
      name: "writes a replica's report before any topology read",
      state: aState({ topologyRead: false }),
      observation: { heartbeat: replicaReport },
      verdict: "write",
    },
    {
      name: "never claims primary before reading the topology (it could revive a replaced primary)",
      state: aState({ topologyRead: false }),
      observation: { heartbeat: primaryReport },
      verdict: "primary_before_topology",
    },
    {
      name: "drops a report built before a change of role",
      state: aState(),
      observation: { heartbeat: replicaReport, roleChanged: true },
      verdict: "role_changed",
    },
    {
      name: "has nothing to write before the database ever answered",
      state: aState(),
      observation: {},
      verdict: "nothing_to_write",
    },
  ])("$name", ({ state, observation, verdict }) => {
    expect(planCycle(state, observation, timings, NOW).writeHeartbeat).toBe(verdict);
  });
});

describe("planCycle: waking the controller", () => {
  const down = { ...replicaReport, db_status: "down", db_crash: crash } as const;
  it.each<{
    name: string;
    state: AgentCycleState;
    heartbeat: HeartbeatInput;
    wake: object | undefined;
    wokeFor: string | undefined;
  }>([
    {
      name: "wakes it for a confirmed crash report",
      state: aState({ crash }),
      heartbeat: down,
      wake: { reason: "crash", key: "crash:5000000" },
      wokeFor: "crash:5000000",
    },
    {
      name: "wakes it once per crash",
      state: aState({ crash, wokeFor: "crash:5000000" }),
      heartbeat: down,
      wake: undefined,
      wokeFor: "crash:5000000",
    },
    {
      name: "does not wake it for a crash seen once (not confirmed)",
      state: aState({ crash }),
      heartbeat: { ...down, db_crash: { ...crash, last_seen: crash.first_seen } },
      wake: undefined,
      wokeFor: undefined,
    },
    {
      name: "wakes it for a replica's link down while in doubt",
      state: aState({ doubtSince: NOW - 100 }),
      heartbeat: { ...replicaReport, primary_link: "down" },
      wake: { reason: "link_down", key: `link_down:${NOW - 100}` },
      wokeFor: `link_down:${NOW - 100}`,
    },
    {
      name: "wakes it for a replica's probe that finds the primary hung or fenced (the link stays up)",
      state: aState({ doubtSince: NOW - 100 }),
      heartbeat: { ...replicaReport, primary_probe: "unreachable" },
      wake: { reason: "probe", key: `probe:${NOW - 100}` },
      wokeFor: `probe:${NOW - 100}`,
    },
    {
      name: "forgets what it woke for once the doubt is over",
      state: aState({ wokeFor: "probe:1" }),
      heartbeat: replicaReport,
      wake: undefined,
      wokeFor: undefined,
    },
  ])("$name", ({ state, heartbeat, wake, wokeFor }) => {
    expect(planCycle(state, { heartbeat }, timings, NOW)).toMatchObject({ wake, wokeFor });
  });
});

describe("keepaliveMs: the longest an agent stays silent while nothing it reports changes", () => {
  it.each<{ name: string; state: AgentCycleState; role: "primary" | "replica"; expected: number }>([
    { name: "a primary at its keepalive", state: aState(), role: "primary", expected: 1000 },
    {
      name: "a replica with nothing to watch at its keepalive",
      state: aState(),
      role: "replica",
      expected: 10_000,
    },
    {
      name: "every cycle while in doubt",
      state: aState({ doubtSince: NOW - 100 }),
      role: "replica",
      expected: 1000,
    },
    {
      name: "every cycle while its database is down",
      state: aState({ dbUp: false }),
      role: "replica",
      expected: 1000,
    },
    {
      name: "every cycle while the topology shows something to watch",
      state: aState({ topologyDoubt: true }),
      role: "replica",
      expected: 1000,
    },
    {
      name: "every cycle while the controller asked for reports",
      state: aState({ reportUntil: NOW + 1 }),
      role: "replica",
      expected: 1000,
    },
    {
      name: "every cycle while its database restarted without its data",
      state: aState({ dbRestarted: true }),
      role: "primary",
      expected: 1000,
    },
  ])("$name", ({ state, role, expected }) => {
    expect(keepaliveMs(state, timings, role, NOW)).toBe(expected);
  });
});

describe("topologyToWatch: a replica reports every cycle while its topology read shows something to watch", () => {
  const online = aShard().build().topology;
  const p1 = { node_id: "p1", address: "p1.local:6379" };
  const fresh = aHeartbeat({ node_id: "p1", role: "primary", ageMs: 200 });
  it.each<{ name: string; read: FollowedPrimary; watch: boolean }>([
    {
      name: "nothing while it follows the named primary, fresh and up",
      read: { topology: online, named: p1, following: p1.address, heartbeat: fresh },
      watch: false,
    },
    {
      name: "no topology yet",
      read: { topology: undefined, named: undefined, following: p1.address, heartbeat: fresh },
      watch: true,
    },
    {
      name: "the shard failing over",
      read: {
        topology: aShard().failingOver("epoch_bumped").build().topology,
        named: p1,
        following: p1.address,
        heartbeat: fresh,
      },
      watch: true,
    },
    {
      name: "another primary named",
      read: {
        topology: online,
        named: { node_id: "r2", address: "r2.local:6379" },
        following: p1.address,
        heartbeat: fresh,
      },
      watch: true,
    },
    {
      name: "the primary's database down",
      read: {
        topology: online,
        named: p1,
        following: p1.address,
        heartbeat: { ...fresh, db_status: "down" },
      },
      watch: true,
    },
    {
      name: "the primary's heartbeat stale",
      read: {
        topology: online,
        named: p1,
        following: p1.address,
        heartbeat: aHeartbeat({ node_id: "p1", role: "primary", ageMs: 3500 }),
      },
      watch: true,
    },
    {
      name: "the primary's heartbeat dated beyond the clock bound (no evidence it is alive, as in decide)",
      read: {
        topology: online,
        named: p1,
        following: p1.address,
        heartbeat: aHeartbeat({ node_id: "p1", role: "primary", ageMs: -60_000 }),
      },
      watch: true,
    },
  ])("$name", ({ read, watch }) => {
    expect(topologyToWatch(read, timings, BUILDER_NOW)).toBe(watch);
  });
});
