import type { Topology } from "../../src/core/model.ts";
import { NOW } from "./builders.ts";

/** Shard s1 online at epoch 3 with primary p1 on 10.0.0.1:6379, unless overridden. */
export function aTopology(overrides: Partial<Topology> = {}): Topology {
  return {
    shard: "s1",
    epoch: 3,
    primary_node_id: "p1",
    primary_address: "10.0.0.1:6379",
    status: "online",
    updated_at: NOW,
    ...overrides,
  };
}
