import { describe, expect, it } from "vitest";
import type { AgentContext } from "../../src/agent/context.ts";
import { rankedShortfall } from "../../src/agent/node-control.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import type { Topology } from "../../src/core/model.ts";

const warnings: string[] = [];
const ctx = {
  nodeId: "n2",
  epochContext: { epoch: 0 },
  logger: {
    warn: (message: string) => warnings.push(message),
    info: () => {},
    debug: () => {},
    error: () => {},
  },
} as unknown as AgentContext;

function failingOver(rankedOffset: number, target = "n2"): Topology {
  return {
    shard: "s1",
    epoch: 1,
    primary_node_id: "n1",
    primary_address: "n1:6379",
    status: "failing_over",
    phase: "promote",
    updated_at: 1,
    failover: {
      kind: "failover",
      old_primary_node_id: "n1",
      new_primary_node_id: target,
      new_primary_address: `${target}:6379`,
      reason: "test",
      started_at: 1,
      phase_started: {},
      candidates: [
        {
          node_id: "n2",
          node_address: "n2:6379",
          last_txn_id: rankedOffset,
          priority: 100,
          eligible: true,
          reason: "eligible",
        },
        {
          node_id: "n3",
          node_address: "n3:6379",
          last_txn_id: rankedOffset,
          priority: 100,
          eligible: true,
          reason: "eligible",
        },
      ],
    },
  };
}

const info = (offset: number) =>
  ({ role: "primary", replId: "r", offset, runId: "p" }) as unknown as ReplicationInfo;

describe("PROMOTE of a database that no longer holds what it was ranked on (simulator seeds 220263, 220883)", () => {
  it("refuses a target whose database restarted empty after the plan ranked it on offset 17904", () => {
    expect(rankedShortfall(ctx, failingOver(17904), info(0))).toMatch(
      /ranked n2 on offset 17904, its database holds 0/,
    );
    expect(warnings.at(-1)).toMatch(/not promoted/);
  });
  it("promotes a target at or past its ranked offset", () => {
    expect(rankedShortfall(ctx, failingOver(17904), info(17904))).toBeUndefined();
    expect(rankedShortfall(ctx, failingOver(17904), info(20000))).toBeUndefined();
  });
  it("judges nothing without a plan naming this node or a candidate row for it", () => {
    expect(rankedShortfall(ctx, undefined, info(0))).toBeUndefined();
    expect(rankedShortfall(ctx, failingOver(17904, "n3"), info(0))).toBeUndefined();
    const noRows = failingOver(17904);
    const failover = noRows.failover as NonNullable<Topology["failover"]>;
    expect(
      rankedShortfall(ctx, { ...noRows, failover: { ...failover, candidates: [] } }, info(0)),
    ).toBeUndefined();
  });
});
