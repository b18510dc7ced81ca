import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { runShardCycle } from "../../src/controller/orchestrator.ts";
import { LAST_COPY_GRACE } from "../../src/core/decide/gate.ts";
import { holdsThroughLinks, supersededBy } from "../../src/core/identity.ts";
import { LINEAGE, NOW } from "../support/builders.ts";
import { MemoryShard } from "../support/memory-shard.ts";

/**
 * Simulator seed 282286: n1, the deposed primary, restarted from its RDB under a new replication
 * id (998b, holding the shard's lineage afff to 17,952 as its \`prior_lineage\`) and stepped down
 * as a replica; the shard went offline and came back on n1 as the last resort. Its PROMOTE gave it
 * another id (cb55, prior 998b), and the shard's history recorded only 998b -> cb55: n2, parked on
 * afff at 17,952, found n1 neither continuing its data nor superseding it and stayed parked to the
 * end. The plan keeps the link the target's report showed (afff -> 998b), recorded with the
 * promotion's own.
 */

beforeEach(() => {
  vi.useFakeTimers({ now: NOW });
});

afterEach(() => {
  vi.useRealTimers();
});

const RESTARTED = "lineage-r";

/** An offline shard, past the last resort's grace, whose only node r1 holds the lineage as its prior. */
function offlineOnRestartedHolder(): MemoryShard {
  const shard = new MemoryShard();
  shard.trackLineages = true;
  shard.nodes.delete("p1");
  shard.nodes.delete("r2");
  shard.nodes.set("r1", {
    role: "replica",
    primary: undefined,
    txn: 1000,
    epoch: 3,
    replId: RESTARTED,
    prior: { repl_id: LINEAGE, last_txn_id: 1000 },
  });
  shard.topology = {
    shard: "s1",
    epoch: 4,
    status: "offline",
    lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: 1000 },
    updated_at: shard.now() - (LAST_COPY_GRACE + 1) * shard.config.failureTimeoutMs,
  };
  return shard;
}

describe("the lineage history of a bring-online on a node holding the lineage as its prior", () => {
  it("records the target's own link before the promotion's, so a replica of the old lineage follows the new primary (simulator seed 282286)", async () => {
    // Prepare
    const shard = offlineOnRestartedHolder();

    // Act
    const result = await runShardCycle(shard.deps(), "s1");

    // Assess
    expect(result.outcome).toBe("completed");
    expect(shard.topology?.primary_node_id).toBe("r1");
    const promotedTo = shard.nodes.get("r1")?.replId ?? "";
    expect(shard.topology?.ancestry).toEqual([
      { repl_id: LINEAGE, until: 1000, by: RESTARTED },
      { repl_id: RESTARTED, until: 1000, by: promotedTo },
    ]);
    // A replica parked on the shard's lineage at 1000: the new primary holds its data.
    const primary = { replId: promotedTo, offset: 1000, prior: { replId: RESTARTED, offset: 1000 } };
    const parked = { replId: LINEAGE, offset: 1000 };
    expect(holdsThroughLinks(primary, parked, shard.topology?.ancestry ?? [])).toBe(true);
    expect(supersededBy(primary, parked, shard.topology?.ancestry ?? [])).toBe(true);
  });

  it("records only the promotion's link when the promoted database no longer continues the lineage the plan saw", async () => {
    // Prepare: between the decision and PROMOTE, r1's database moved to another lineage.
    const shard = offlineOnRestartedHolder();
    shard.beforeTopologyWrite = () => {
      const r1 = shard.nodes.get("r1");
      if (r1 !== undefined && shard.topology?.status === "failing_over" && r1.replId === RESTARTED)
        r1.replId = "lineage-other";
    };

    // Act
    const result = await runShardCycle(shard.deps(), "s1");

    // Assess
    expect(result.outcome).toBe("completed");
    expect(shard.topology?.ancestry).toEqual([
      { repl_id: "lineage-other", until: 1000, by: shard.nodes.get("r1")?.replId },
    ]);
  });
});
