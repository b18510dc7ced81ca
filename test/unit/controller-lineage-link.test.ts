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

/**
 * Simulator seed 72080: the failover's target r1 applied its PROMOTE (PROMOTED continues LINEAGE
 * from 1000) while its controller was frozen in \`confirm\`, took writes alone, and restarted empty
 * (its agent reports the dead process: down, \`restarted\`, its last answer's prior as
 * \`answered_prior_lineage\`). r2, parked on LINEAGE at 1000, was cut off from the store when the
 * next controller went on. The offline mark names r1's new lineage; it now records r1's promotion
 * in the history, so the last resort finds r2 holding it to the promotion point.
 */
describe("the offline mark of a failover whose target died after its PROMOTE (simulator seed 72080)", () => {
  const PROMOTED = "lineage-r1";

  function frozenInConfirm(): { shard: MemoryShard; r2CutOff: { value: boolean } } {
    const shard = new MemoryShard();
    const r2CutOff = { value: true };
    shard.topology = {
      shard: "s1",
      epoch: 4,
      status: "failing_over",
      phase: "confirm",
      primary_node_id: "p1",
      primary_address: "p1.local:6379",
      updated_at: shard.now() - 60_000,
      failover: {
        kind: "failover",
        old_primary_node_id: "p1",
        new_primary_node_id: "r1",
        new_primary_address: "r1.local:6379",
        reason: "test",
        started_at: shard.now() - 60_000,
        candidates: [],
        phase_started: { epoch_bumped: shard.now() - 60_000, confirm: shard.now() - 60_000 },
        lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: 1000 },
      },
    };
    shard.nodes.set("p1", {
      role: "replica",
      primary: undefined,
      txn: 500,
      epoch: 4,
      replId: "lineage-p1-rdb",
    });
    shard.nodes.set("r1", { role: "primary", primary: undefined, txn: 1384, epoch: 4, replId: PROMOTED });
    shard.nodes.set("r2", { role: "replica", primary: undefined, txn: 1000, epoch: 4 });
    shard.onSnapshot = (read) => ({
      ...read,
      nodes: read.nodes.map((node) => {
        const now = shard.now();
        if (node.node_id === "r1" && shard.nodes.get("r1")?.replId === PROMOTED) {
          return {
            ...node,
            db_status: "down",
            last_updated: (now - 55_000) * 1000,
            agent_updated: (now - 200) * 1000,
            db_crash: {
              state: "restarted",
              run_id: "r1-run",
              first_seen: (now - 55_000) * 1000,
              last_seen: now * 1000,
            },
            answered_prior_lineage: { repl_id: LINEAGE, last_txn_id: 1000 },
          };
        }
        if (node.node_id === "r2" && r2CutOff.value) {
          return { ...node, last_updated: (now - 13_000) * 1000, agent_updated: (now - 13_000) * 1000 };
        }
        return node;
      }),
    });
    return { shard, r2CutOff };
  }

  it("records the target's promotion with the offline mark, and brings the shard back on the parked replica once it reports", async () => {
    // Prepare
    const { shard, r2CutOff } = frozenInConfirm();

    // Act: the continuation finds r1 dead and r2 stale.
    const offline = await runShardCycle(shard.deps(), "s1");

    // Assess
    expect(offline.outcome).toBe("offline");
    expect(shard.topology).toMatchObject({
      status: "offline",
      epoch: 5,
      lineage: { node_id: "r1", repl_id: PROMOTED, last_txn_id: 1384 },
      ancestry: [{ repl_id: LINEAGE, until: 1000, by: PROMOTED }],
    });

    // Act: r2 reports again; every node answers (r1's agent heard reporting its new process).
    r2CutOff.value = false;
    const back = await runShardCycle(shard.deps(), "s1");

    // Assess
    expect(back.outcome).toBe("completed");
    expect(shard.topology).toMatchObject({ status: "online", primary_node_id: "r2" });
  });
});

/**
 * Simulator seed 325407: the failover to r1 stuck in promote; r1 applied its PROMOTE late (R1
 * continuing LINEAGE from 1000) just as a controller retargeted to r2, whose report then showed
 * LINEAGE at 1000 and no link (no \`target_link\`). r2 deposed r1 and caught up with it before its
 * own PROMOTE, so r2's new id R2 continues R1, not LINEAGE. The completion recorded only R1 -> R2;
 * p1, the old primary holding LINEAGE past 1000 (a tail nobody acknowledged), parked, found r2
 * neither holding its data nor superseding it and stayed parked for good. r1's report still showed
 * its promotion's link as the change completed.
 */
describe("the lineage history of a retarget whose target continued the earlier target's promotion (simulator seed 325407)", () => {
  const R1 = "lineage-r1";
  const R2 = "lineage-r2";

  function retargetedInConfirm(r1Report: {
    replId: string;
    prior?: { repl_id: string; last_txn_id: number };
  }): MemoryShard {
    const shard = new MemoryShard();
    shard.topology = {
      shard: "s1",
      epoch: 5,
      status: "failing_over",
      phase: "confirm",
      primary_node_id: "p1",
      primary_address: "p1.local:6379",
      updated_at: shard.now() - 1_000,
      failover: {
        kind: "failover",
        old_primary_node_id: "p1",
        new_primary_node_id: "r2",
        new_primary_address: "r2.local:6379",
        reason: "target r1 did not confirm in time after PROMOTE; promoting r2 instead",
        started_at: shard.now() - 60_000,
        candidates: [],
        phase_started: { epoch_bumped: shard.now() - 1_000, confirm: shard.now() - 500 },
        lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: 1000 },
      },
    };
    shard.nodes.set("p1", { role: "replica", primary: undefined, txn: 1096, epoch: 4, replId: LINEAGE });
    shard.nodes.set("r1", { role: "replica", primary: "r2", txn: 1000, epoch: 5, ...r1Report });
    shard.nodes.set("r2", {
      role: "primary",
      primary: undefined,
      txn: 1000,
      epoch: 5,
      replId: R2,
      prior: { repl_id: R1, last_txn_id: 1000 },
    });
    return shard;
  }

  it("records the earlier target's promotion a peer's report shows before the final target's, so the parked old primary follows it", async () => {
    // Prepare: r1, now r2's replica, still shows R1 continuing LINEAGE to 1000.
    const shard = retargetedInConfirm({ replId: R1, prior: { repl_id: LINEAGE, last_txn_id: 1000 } });

    // Act
    const result = await runShardCycle(shard.deps(), "s1");

    // Assess
    expect(result.outcome).toBe("completed");
    expect(shard.topology?.primary_node_id).toBe("r2");
    expect(shard.topology?.ancestry).toEqual([
      { repl_id: LINEAGE, until: 1000, by: R1 },
      { repl_id: R1, until: 1000, by: R2 },
    ]);
    // p1, parked on LINEAGE at 1096 (96 bytes nobody acknowledged): r2 took over from it.
    const primary = { replId: R2, offset: 1000, prior: { replId: R1, offset: 1000 } };
    expect(supersededBy(primary, { replId: LINEAGE, offset: 1096 }, shard.topology?.ancestry ?? [])).toBe(
      true,
    );
  });

  it("records no link from the plan's lineage that no report shows", async () => {
    // Prepare: r1 already moved on to r2's id (its report shows R2 continuing R1).
    const shard = retargetedInConfirm({ replId: R2, prior: { repl_id: R1, last_txn_id: 1000 } });

    // Act
    const result = await runShardCycle(shard.deps(), "s1");

    // Assess
    expect(result.outcome).toBe("completed");
    expect(shard.topology?.ancestry).toEqual([{ repl_id: R1, until: 1000, by: R2 }]);
  });
});
