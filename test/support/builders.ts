import { type FailoverConfig, type FailoverConfigInput, parseFailoverConfig } from "../../src/core/config.ts";
import type { Decision } from "../../src/core/decide.ts";
import {
  type FailoverPhase,
  type FailoverState,
  type Heartbeat,
  type HeartbeatInput,
  heartbeatSchema,
  type Lock,
  type Topology,
} from "../../src/core/model.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";

/**
 * Snapshot builders for decision tests: a shard "s1" with primary p1 and replicas r1, r2 of
 * lineage "lineage-a", all fresh and healthy unless a builder method says otherwise.
 */

/** A fixed "now" in ms; heartbeats are written relative to it. */
export const NOW = 1_800_000_000_000;
export const LINEAGE = "lineage-a";

export function aConfig(overrides: FailoverConfigInput = {}): FailoverConfig {
  return parseFailoverConfig({
    failureTimeoutMs: 3000,
    maxLagOnFailover: 1000,
    quorum: "majority",
    ...overrides,
  });
}

/** A heartbeat whose database answered `ageMs` before NOW. */
export function aHeartbeat(
  overrides: Partial<HeartbeatInput> & { node_id: string; ageMs?: number },
): Heartbeat {
  const { ageMs = 200, ...fields } = overrides;
  return heartbeatSchema.parse({
    shard: "s1",
    node_address: `${fields.node_id}.local:6379`,
    role: "replica",
    last_updated: (NOW - ageMs) * 1000,
    last_txn_id: 1000,
    repl_id: LINEAGE,
    primary_node_id: "p1",
    primary_link: "up",
    epoch: 3,
    priority: 100,
    ...fields,
  });
}

export class ShardBuilder {
  private nodes = new Map<string, Heartbeat>();
  private topology: Topology | undefined;
  private lock: Lock | undefined;
  /** The primary's replica set under the write guard (undefined: a set written before the guard). */
  private guard: { members: readonly string[]; version: number } | undefined;

  constructor() {
    this.topology = {
      shard: "s1",
      epoch: 3,
      primary_node_id: "p1",
      primary_address: "p1.local:6379",
      status: "online",
      updated_at: NOW - 60_000,
    };
    this.withNode({
      node_id: "p1",
      role: "primary",
      primary_node_id: undefined,
      primary_link: undefined,
      last_txn_id: 1000,
    });
    this.withNode({ node_id: "r1", last_txn_id: 990 });
    this.withNode({ node_id: "r2", last_txn_id: 980 });
  }

  /** Adds or replaces a node; fields not given keep the node's current values (or the defaults). */
  withNode(overrides: Partial<HeartbeatInput> & { node_id: string; ageMs?: number }): this {
    const existing = this.nodes.get(overrides.node_id);
    let base: Partial<HeartbeatInput> & { ageMs?: number } = {};
    if (existing) {
      const { last_updated, ...rest } = existing;
      base = { ...rest, ageMs: NOW - last_updated / 1000 };
    }
    this.nodes.set(overrides.node_id, aHeartbeat({ ...base, ...overrides }));
    return this;
  }

  without(nodeId: string): this {
    this.nodes.delete(nodeId);
    return this;
  }

  /** The primary's database stopped answering `ageMs` ago; replicas see the link down. */
  withStalePrimary(ageMs = 10_000): this {
    this.withNode({ node_id: "p1", ageMs });
    for (const node of this.nodes.values()) {
      if (node.node_id !== "p1") this.withNode({ node_id: node.node_id, primary_link: "down" });
    }
    return this;
  }

  withTopology(overrides: Partial<Topology> | undefined): this {
    this.topology = overrides === undefined ? undefined : ({ ...this.topology, ...overrides } as Topology);
    return this;
  }

  paused(reason = "maintenance"): this {
    return this.withTopology({ status: "paused", paused_reason: reason });
  }

  coolingDown(forMs = 60_000): this {
    return this.withTopology({ cooldown_until: NOW + forMs });
  }

  offline(lineageTxn = 1000): this {
    return this.withTopology({
      status: "offline",
      primary_node_id: undefined,
      primary_address: undefined,
      lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: lineageTxn },
    });
  }

  failingOver(phase: FailoverPhase, target = "r1"): this {
    const failover: FailoverState = {
      kind: "failover",
      old_primary_node_id: "p1",
      new_primary_node_id: target,
      new_primary_address: this.nodes.get(target)?.node_address ?? `${target}.local:6379`,
      reason: "test",
      started_at: NOW - 5000,
      candidates: [],
      phase_started: { [phase]: NOW - 1000 },
      lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: 1000 },
    };
    return this.withTopology({ status: "failing_over", epoch: 4, phase, failover });
  }

  lockedBy(owner: string, expiresInMs = 30_000): this {
    this.lock = { owner, expires_at: NOW + expiresInMs };
    return this;
  }

  /** p1's replica set is the write guard's membership: only these nodes may be promoted. */
  guardedBy(members: readonly string[], version = 1): this {
    this.guard = { members, version };
    return this;
  }

  build(): ShardSnapshot {
    return {
      shard: "s1",
      nodes: [...this.nodes.values()],
      replicaSets: { p1: this.guard?.members ?? [...this.nodes.keys()].filter((id) => id !== "p1") },
      replicaSetVersions: this.guard ? { p1: this.guard.version } : {},
      topology: this.topology,
      lock: this.lock,
      malformed: [],
    };
  }
}

export function aShard(): ShardBuilder {
  return new ShardBuilder();
}

export function aHealthyShard(): ShardBuilder {
  return new ShardBuilder();
}

export function aShardWithStalePrimary(ageMs = 10_000): ShardBuilder {
  return new ShardBuilder().withStalePrimary(ageMs);
}

/** A decision as a table row compares it: the code of a hold, or the kind and target of an action. */
export function outcome(decision: Decision): Record<string, unknown> {
  return decision.kind === "none"
    ? { kind: "none", code: decision.code }
    : { kind: decision.kind, target: "target" in decision ? decision.target.node_id : undefined };
}
