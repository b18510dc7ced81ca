import { describe, expect, it } from "vitest";
import type { Heartbeat, Topology } from "../../src/core/model.ts";
import {
  answerSentinel,
  INITIAL_EVENT_MEMORY,
  type MasterState,
  masterState,
  type SentinelReply,
  type SentinelView,
  sentinelEvents,
} from "../../src/core/sentinel.ts";
import { aHeartbeat, NOW } from "../support/builders.ts";
import { aTopology } from "../support/sentinel-builders.ts";

function nodes(): Heartbeat[] {
  return [
    aHeartbeat({
      node_id: "p1",
      role: "primary",
      node_address: "10.0.0.1:6379",
      primary_node_id: undefined,
      sentinel_address: "10.0.0.1:26379",
    }),
    aHeartbeat({ node_id: "r1", node_address: "10.0.0.2:6379", sentinel_address: "10.0.0.2:26379" }),
    aHeartbeat({ node_id: "r2", node_address: "10.0.0.3:6379", ageMs: 10_000 }),
  ];
}

function aView(overrides: Partial<SentinelView> = {}): SentinelView {
  return {
    shard: "s1",
    topology: aTopology(),
    nodes: nodes(),
    selfNodeId: "p1",
    nowMs: NOW,
    failureTimeoutMs: 3000,
    ...overrides,
  };
}

/** A map reply as a plain object of its string values (what clients build from it). */
function fieldsOf(value: SentinelReply | undefined): Record<string, string> {
  if (value?.type !== "map") throw new Error(`not a map: ${JSON.stringify(value)}`);
  return Object.fromEntries(
    value.entries.map(([key, item]) => [key, item.type === "bulk" ? item.value : "?"]),
  );
}

function itemsOf(value: SentinelReply): readonly SentinelReply[] {
  if (value.type !== "array") throw new Error(`not an array: ${JSON.stringify(value)}`);
  return value.items;
}

const bulkPair = (host: string, port: string): SentinelReply => ({
  type: "array",
  items: [
    { type: "bulk", value: host },
    { type: "bulk", value: port },
  ],
});

describe("SENTINEL get-master-addr-by-name", () => {
  const cases: Array<{ when: string; view: SentinelView; name?: string; expected: SentinelReply }> = [
    { when: "the shard is online", view: aView(), expected: bulkPair("10.0.0.1", "6379") },
    {
      when: "the shard is paused for maintenance (the primary still serves)",
      view: aView({ topology: aTopology({ status: "paused" }) }),
      expected: bulkPair("10.0.0.1", "6379"),
    },
    {
      when: "a failover is in progress (never the old primary)",
      view: aView({ topology: aTopology({ status: "failing_over", epoch: 4 }) }),
      expected: { type: "nullArray" },
    },
    {
      when: "the shard is offline",
      view: aView({
        topology: aTopology({ status: "offline", primary_node_id: undefined, primary_address: undefined }),
      }),
      expected: { type: "nullArray" },
    },
    {
      when: "the controller has not initialised the shard",
      view: aView({ topology: undefined }),
      expected: { type: "nullArray" },
    },
    { when: "the name is another shard", view: aView(), name: "s2", expected: { type: "nullArray" } },
    {
      when: "the name differs in case (master names are case-sensitive)",
      view: aView(),
      name: "S1",
      expected: { type: "nullArray" },
    },
    {
      when: "an IPv6 primary",
      view: aView({ topology: aTopology({ primary_address: "fd00::1:6380" }) }),
      expected: bulkPair("fd00::1", "6380"),
    },
  ];
  it.each(cases)("answers $expected.type when $when", ({ view, name, expected }) => {
    // Act
    const answer = answerSentinel("SENTINEL", ["get-master-addr-by-name", name ?? "s1"], view);

    // Assess
    expect(answer).toEqual(expected);
  });

  it("refuses a wrong number of arguments with an error, as Sentinel does", () => {
    expect(answerSentinel("sentinel", ["get-master-addr-by-name"], aView())).toMatchObject({ type: "error" });
  });
});

describe("SENTINEL masters / master", () => {
  const cases: Array<{ when: string; topology: Topology | undefined; flags: string | undefined }> = [
    { when: "online", topology: aTopology(), flags: "master" },
    { when: "paused", topology: aTopology({ status: "paused" }), flags: "master" },
    {
      when: "failing over",
      topology: aTopology({ status: "failing_over" }),
      flags: "master,s_down,o_down,failover_in_progress",
    },
    {
      when: "offline with the last primary named",
      topology: aTopology({ status: "offline" }),
      flags: "master,s_down,o_down",
    },
    {
      when: "offline with no primary named",
      topology: aTopology({ status: "offline", primary_node_id: undefined, primary_address: undefined }),
      flags: undefined,
    },
    { when: "not initialised", topology: undefined, flags: undefined },
  ];
  it.each(cases)("flags the master $flags when the shard is $when", ({ topology, flags }) => {
    // Act
    const masters = itemsOf(answerSentinel("sentinel", ["masters"], aView({ topology })));
    const master = answerSentinel("sentinel", ["master", "s1"], aView({ topology }));

    // Assess
    if (flags === undefined) {
      expect(masters).toEqual([]);
      expect(master).toEqual({ type: "error", message: "ERR No such master with that name" });
      return;
    }
    expect(masters).toHaveLength(1);
    expect(fieldsOf(masters[0]).flags).toBe(flags);
    expect(fieldsOf(master)).toEqual(fieldsOf(masters[0]));
  });

  it("carries the fields redis-py's discover_master reads, counting fresh replicas and fresh peer agents only", () => {
    // Act
    const fields = fieldsOf(itemsOf(answerSentinel("SENTINEL", ["MASTERS"], aView()))[0]);

    // Assess
    expect(fields).toMatchObject({
      name: "s1",
      ip: "10.0.0.1",
      port: "6379",
      runid: "p1",
      flags: "master",
      "config-epoch": "3",
      "num-slaves": "1",
      "num-other-sentinels": "1",
      quorum: "1",
      "down-after-milliseconds": "3000",
    });
  });

  it("answers an unknown master name with Sentinel's error", () => {
    expect(answerSentinel("sentinel", ["master", "nope"], aView())).toEqual({
      type: "error",
      message: "ERR No such master with that name",
    });
  });
});

describe("SENTINEL replicas / slaves and sentinels", () => {
  it("lists every replica with its link, offset and priority; a stale one flagged s_down,disconnected", () => {
    // Act
    const replicas = itemsOf(answerSentinel("sentinel", ["replicas", "s1"], aView())).map(fieldsOf);
    const slaves = itemsOf(answerSentinel("sentinel", ["slaves", "s1"], aView())).map(fieldsOf);

    // Assess
    expect(slaves).toEqual(replicas);
    expect(replicas).toEqual([
      expect.objectContaining({
        name: "10.0.0.2:6379",
        ip: "10.0.0.2",
        port: "6379",
        runid: "r1",
        flags: "slave",
        "master-link-status": "ok",
        "master-host": "10.0.0.1",
        "master-port": "6379",
        "slave-repl-offset": "1000",
        "slave-priority": "100",
      }),
      expect.objectContaining({ runid: "r2", flags: "slave,s_down,disconnected" }),
    ]);
  });

  it("lists the other agents that serve the protocol, not itself nor agents without an endpoint", () => {
    // Act
    const sentinels = itemsOf(answerSentinel("sentinel", ["sentinels", "s1"], aView())).map(fieldsOf);

    // Assess
    expect(sentinels).toEqual([
      { name: "r1", ip: "10.0.0.2", port: "26379", runid: "r1", flags: "sentinel" },
    ]);
  });

  it("flags a peer agent that stopped heartbeating as disconnected (ioredis then skips it)", () => {
    // Prepare
    const stale = nodes().map((node) =>
      node.node_id === "r1"
        ? { ...node, agent_updated: (NOW - 60_000) * 1000, last_updated: (NOW - 60_000) * 1000 }
        : node,
    );

    // Act
    const [entry] = itemsOf(answerSentinel("sentinel", ["sentinels", "s1"], aView({ nodes: stale }))).map(
      fieldsOf,
    );

    // Assess
    expect(entry?.flags).toBe("sentinel,s_down,disconnected");
  });

  it("flags a replica and a peer agent whose heartbeat is dated beyond the clock bound as down (no evidence of liveness, as in decide)", () => {
    // Prepare: r1's clock ran 60 s ahead when it wrote.
    const ahead = nodes().map((node) =>
      node.node_id === "r1"
        ? { ...node, agent_updated: (NOW + 60_000) * 1000, last_updated: (NOW + 60_000) * 1000 }
        : node,
    );

    // Act
    const [replica] = itemsOf(answerSentinel("sentinel", ["replicas", "s1"], aView({ nodes: ahead }))).map(
      fieldsOf,
    );
    const [peer] = itemsOf(answerSentinel("sentinel", ["sentinels", "s1"], aView({ nodes: ahead }))).map(
      fieldsOf,
    );

    // Assess
    expect(replica).toMatchObject({ runid: "r1", flags: "slave,s_down,disconnected" });
    expect(peer?.flags).toBe("sentinel,s_down,disconnected");
  });

  it("answers replicas and sentinels of an unknown master with Sentinel's error", () => {
    expect(answerSentinel("sentinel", ["replicas", "s2"], aView())).toMatchObject({ type: "error" });
    expect(answerSentinel("sentinel", ["sentinels", "s2"], aView())).toMatchObject({ type: "error" });
  });
});

describe("ROLE and other SENTINEL subcommands", () => {
  it("answers ROLE as a sentinel monitoring the shard", () => {
    expect(answerSentinel("ROLE", [], aView())).toEqual({
      type: "array",
      items: [
        { type: "bulk", value: "sentinel" },
        { type: "array", items: [{ type: "bulk", value: "s1" }] },
      ],
    });
  });

  it("answers SENTINEL myid with the agent's node id", () => {
    expect(answerSentinel("sentinel", ["myid"], aView())).toEqual({ type: "bulk", value: "p1" });
  });

  it.each(["failover", "reset", "monitor", "set"])(
    "refuses SENTINEL %s and says what to use instead",
    (sub) => {
      const answer = answerSentinel("sentinel", [sub, "s1"], aView());
      expect(answer).toMatchObject({
        type: "error",
        message: expect.stringContaining("shardguard switchover"),
      });
    },
  );

  it("answers an unknown subcommand with an error", () => {
    expect(answerSentinel("sentinel", ["frobnicate"], aView())).toMatchObject({
      type: "error",
      message: expect.stringContaining("unknown subcommand"),
    });
  });
});

describe("sentinel events", () => {
  const serving = (nodeId: string, host: string): MasterState => ({
    kind: "serving",
    primary: { nodeId, host, port: 6379 },
  });
  const down = (nodeId: string, host: string, failingOver = true): MasterState => ({
    kind: "down",
    last: { nodeId, host, port: 6379 },
    failingOver,
  });

  const cases: Array<{ when: string; states: MasterState[]; expected: string[] }> = [
    { when: "the first state is seen", states: [serving("a", "h1")], expected: [] },
    {
      when: "the same primary is seen again",
      states: [serving("a", "h1"), serving("a", "h1")],
      expected: [],
    },
    {
      when: "a failover completes",
      states: [serving("a", "h1"), down("a", "h1"), serving("b", "h2")],
      expected: ["+sdown master s1 h1 6379", "+odown master s1 h1 6379", "+switch-master s1 h1 6379 h2 6379"],
    },
    {
      when: "the topology moves to a new primary between two reads",
      states: [serving("a", "h1"), serving("b", "h2")],
      expected: ["+switch-master s1 h1 6379 h2 6379"],
    },
    {
      when: "the same primary comes back after the shard was offline",
      states: [serving("a", "h1"), down("a", "h1", false), serving("a", "h1")],
      expected: [
        "+sdown master s1 h1 6379",
        "+odown master s1 h1 6379",
        "-sdown master s1 h1 6379",
        "-odown master s1 h1 6379",
      ],
    },
    {
      when: "the agent started during a failover (the topology still names the old primary)",
      states: [down("a", "h1"), serving("b", "h2")],
      expected: ["+switch-master s1 h1 6379 h2 6379"],
    },
    {
      when: "the failover takes several reads",
      states: [serving("a", "h1"), down("a", "h1"), down("a", "h1"), down("a", "h1")],
      expected: ["+sdown master s1 h1 6379", "+odown master s1 h1 6379"],
    },
  ];
  it.each(cases)("publishes $expected.length events when $when", ({ states, expected }) => {
    // Act
    let memory = INITIAL_EVENT_MEMORY;
    const published: string[] = [];
    for (const state of states) {
      const step = sentinelEvents("s1", memory, state);
      memory = step.memory;
      published.push(...step.events.map((event) => `${event.channel} ${event.message}`));
    }

    // Assess
    expect(published).toEqual(expected);
  });

  it("derives the master state from the topology: serving only while online or paused", () => {
    expect(masterState(aTopology()).kind).toBe("serving");
    expect(masterState(aTopology({ status: "paused" })).kind).toBe("serving");
    expect(masterState(aTopology({ status: "failing_over" }))).toMatchObject({
      kind: "down",
      failingOver: true,
    });
    expect(masterState(aTopology({ status: "offline" }))).toMatchObject({ kind: "down", failingOver: false });
    expect(masterState(undefined).kind).toBe("unknown");
  });
});
