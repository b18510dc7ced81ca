import { describe, expect, it } from "vitest";
import {
  AGENT_WATCHING_AFTER_MS,
  agentProtects,
  copiesUncertain,
  intactCopies,
  primaryRolledBack,
  type RoleRead,
  soleCopies,
} from "../../src/dev/nemesis/copies.ts";

const master: RoleRead = { role: "master" };
const linked = (following: string): RoleRead => ({ role: "slave", following, linkUp: true });
const unlinked = (following: string): RoleRead => ({ role: "slave", following, linkUp: false });

describe("intact copies: whom a kill -9 of redis leaves holding the data", () => {
  it.each<[string, string, Array<[string, RoleRead | undefined]>, string | undefined, string[]]>([
    [
      "the primary killed, a replica linked to it",
      "n1",
      [
        ["n1", master],
        ["n2", linked("n1")],
        ["n3", linked("n1")],
      ],
      "n1",
      ["n2", "n3"],
    ],
    [
      "a replica killed, the primary up",
      "n2",
      [
        ["n1", master],
        ["n2", linked("n1")],
        ["n3", undefined],
      ],
      "n1",
      ["n1"],
    ],
    [
      "the primary killed, its only replica resyncing (link down)",
      "n1",
      [
        ["n1", master],
        ["n2", unlinked("n1")],
        ["n3", undefined],
      ],
      "n1",
      [],
    ],
    [
      "the primary killed, the other node a master of its own (restarted, fenced)",
      "n2",
      [
        ["n1", master],
        ["n2", master],
        ["n3", undefined],
      ],
      "n2",
      [],
    ],
    [
      "a replica linked to a node that is not the topology's primary",
      "n1",
      [
        ["n1", master],
        ["n2", linked("n3")],
        ["n3", master],
      ],
      "n1",
      [],
    ],
    [
      "the primary paused (no answer): a replica killed leaves nobody",
      "n2",
      [
        ["n1", undefined],
        ["n2", linked("n1")],
        ["n3", unlinked("n1")],
      ],
      "n1",
      [],
    ],
    [
      "no topology primary",
      "n1",
      [
        ["n1", master],
        ["n2", linked("n1")],
      ],
      undefined,
      [],
    ],
  ])("%s", (_what, target, roles, primary, expected) => {
    expect(intactCopies(target, new Map(roles), primary)).toEqual(expected);
  });
});

describe("an agent protects its replica's copy only once it watches its primary (nemesis seed 6001)", () => {
  it.each<[string, { running: boolean; busy: boolean; upForMs: number | undefined }, boolean]>([
    ["running for a minute", { running: true, busy: false, upForMs: 60_000 }, true],
    [
      "running just past the settle time",
      { running: true, busy: false, upForMs: AGENT_WATCHING_AFTER_MS },
      true,
    ],
    // Seed 6001: node-35r's agent restarted 0.41 s before the primary's kill, booted after it.
    ["restarted 0.41 s ago (seed 6001)", { running: true, busy: false, upForMs: 410 }, false],
    ["not running", { running: false, busy: false, upForMs: undefined }, false],
    ["paused by a fault", { running: true, busy: true, upForMs: 60_000 }, false],
  ])("%s", (_name, agent, expected) => {
    expect(agentProtects(agent)).toBe(expected);
  });
});

describe("no copy is counted on while a fault may depose the primary (nemesis seed 6002)", () => {
  it.each<[string, { kind: string; targets: string[] }[], boolean]>([
    ["no fault", [], false],
    // Seed 6002: partition-nodes isolate of primary node-2; a scale-in stopped node-48b meanwhile.
    [
      "a partition between nodes, whatever it targets",
      [{ kind: "partition-nodes", targets: ["node-2"] }],
      true,
    ],
    ["a store outage", [{ kind: "store-outage", targets: ["node-1", "node-2", "node-3"] }], true],
    ["the primary's agent paused", [{ kind: "pause-agent", targets: ["node-2"] }], true],
    ["another replica's redis paused", [{ kind: "pause-redis", targets: ["node-3"] }], false],
    ["the membership change itself", [{ kind: "membership", targets: ["node-2", "node-48b"] }], false],
  ])("%s", (_name, faults, uncertain) => {
    expect(copiesUncertain(faults, "node-2") !== undefined).toBe(uncertain);
  });
});

describe("a primary this run restarted is no intact copy until the shard moves on (seeds 5401, 7341)", () => {
  const restarted = new Map([["n3", 4]]);
  it.each<[string, { epoch: number; status: string; primary_node_id?: string } | undefined, boolean]>([
    [
      "named at the epoch read after its restart",
      { epoch: 4, status: "online", primary_node_id: "n3" },
      true,
    ],
    [
      "named by a failover from it at a later epoch (seed 7341: epoch 5 failing over to node-2)",
      { epoch: 5, status: "failing_over", primary_node_id: "n3" },
      true,
    ],
    [
      "named by an offline topology at a later epoch (marked offline on its lineage)",
      { epoch: 5, status: "offline", primary_node_id: "n3" },
      true,
    ],
    [
      "brought online again at a later epoch (the controller judged it)",
      { epoch: 6, status: "online", primary_node_id: "n3" },
      false,
    ],
    ["another node named", { epoch: 5, status: "online", primary_node_id: "n1" }, false],
    ["no topology read", undefined, false],
    ["a node never restarted", { epoch: 4, status: "offline", primary_node_id: "n1" }, false],
  ])("%s", (_, topology, expected) => {
    expect(primaryRolledBack(topology, restarted)).toBe(expected);
  });
});

describe("sole copies: what destroying a node's dataset would destroy for good (the simulator's form)", () => {
  const set = (...keys: string[]) => new Set(keys);
  it.each<[string, Set<string>, string[], Set<string>[], string[]]>([
    ["another copy holds every acknowledged write", set("a", "b"), ["a", "b"], [set("a", "b", "c")], []],
    ["two copies hold them together", set("a", "b"), ["a", "b"], [set("a"), set("b")], []],
    ["a write only the target holds", set("a", "b"), ["a", "b"], [set("a")], ["b"]],
    ["no other copy counts (every replica's agent dead)", set("a", "b"), ["a", "b"], [], ["a", "b"]],
    ["an acknowledged write the target lacks is not its to destroy", set("a"), ["a", "b"], [set("a")], []],
    ["an unacknowledged write only the target holds", set("a", "x"), ["a"], [set("a")], []],
  ])("%s", (_, target, acknowledged, others, expected) => {
    expect(soleCopies(target, acknowledged, others)).toEqual(expected);
  });
});
