import { readFileSync } from "node:fs";
import { stripVTControlCharacters } from "node:util";
import { describe, expect, it } from "vitest";
import { renderShardStatus, shardStatus } from "../../src/cli/status-view.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { aConfig, aHeartbeat, NOW } from "../support/builders.ts";

/**
 * README's `shardguard status` example is this snapshot rendered by the real view: a shard 21 s after
 * a kill -9 failover from node-1 to node-2, node-3 in sync and heard, node-4 quiet.
 */
function exampleSnapshot(): ShardSnapshot {
  const at = (ageMs: number) => (NOW - ageMs) * 1000;
  const node = (id: string, ip: string, fields: Parameters<typeof aHeartbeat>[0]) =>
    aHeartbeat({
      shard: "orders",
      node_address: `10.0.1.${ip}:6379`,
      repl_id: "8f3c",
      ...fields,
      node_id: id,
    });
  return {
    shard: "orders",
    nodes: [
      node("node-1", "11", {
        node_id: "node-1",
        role: "primary",
        primary_node_id: undefined,
        primary_link: undefined,
        db_status: "down",
        last_txn_id: 51_842,
        ageMs: 21_300,
        agent_updated: at(400),
        keepalive_ms: 1000,
      }),
      node("node-2", "12", {
        node_id: "node-2",
        role: "primary",
        primary_node_id: undefined,
        primary_link: undefined,
        last_txn_id: 71_648,
        ageMs: 900,
        keepalive_ms: 2000,
      }),
      node("node-3", "13", {
        node_id: "node-3",
        primary_node_id: "node-2",
        primary_probe: "ok",
        last_txn_id: 71_648,
        ageMs: 200,
        keepalive_ms: 1000,
      }),
      node("node-4", "14", {
        node_id: "node-4",
        primary_node_id: "node-2",
        primary_probe: "ok",
        last_txn_id: 53_190,
        ageMs: 19_000,
        keepalive_ms: 20_000,
      }),
    ],
    replicaSets: { "node-2": ["node-3", "node-4"] },
    replicaSetVersions: {},
    topology: {
      shard: "orders",
      epoch: 4,
      primary_node_id: "node-2",
      primary_address: "10.0.1.12:6379",
      status: "online",
      updated_at: NOW - 20_000,
      cooldown_until: NOW + 280_000,
    },
    lock: undefined,
    malformed: [],
  };
}

function readmeExample(): string {
  const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");
  const block = /<!-- status-example -->\n```text\n\$ shardguard status --shard orders\n([\s\S]*?)```/.exec(
    readme,
  );
  if (!block?.[1]) throw new Error("README.md has no status example block");
  return block[1];
}

describe("docs: the status example", () => {
  it("README's example is what the view renders", () => {
    // Act
    const rendered = stripVTControlCharacters(
      renderShardStatus(shardStatus(exampleSnapshot(), NOW, aConfig()), { controllerLine: true }),
    );
    // Assess
    expect(readmeExample()).toBe(`${rendered}\n`);
  });
});
