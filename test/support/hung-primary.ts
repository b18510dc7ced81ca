import { PARKED_PORT } from "../../src/agent/primary-probe.ts";
import type { FailoverState, Lineage, Topology } from "../../src/core/model.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  replicationOf,
  roleOf,
  WAIT_MS,
  waitForFollowers,
  waitForMembers,
  withClient,
  writeKeys,
} from "./chaos-cluster.ts";

/**
 * The scene of tests whose controller's plans the test writes itself: node-1 primary on lineage L,
 * `keys` acknowledged by node-2 and node-3 (`WAIT 2`, to offset `x`), no replication PINGs (offsets
 * move with writes only), the cluster's controllers stopped; then node-1 hung whole (its agent and
 * database SIGSTOPped) and both replicas parked by their probes.
 */
export interface HungPrimary {
  readonly node1: RedisNode;
  readonly node2: RedisNode;
  readonly node3: RedisNode;
  /** node-1's offset once every key was acknowledged: the replicas' too. */
  readonly x: number;
  /** The topology the stopped controller left: online on node-1. */
  readonly online: Topology;
  /** L, node-1's replication id, at x. */
  readonly lineage: Lineage;
}

export async function hangPrimaryParkReplicas(
  active: LocalCluster,
  prefix: string,
  keys: number,
): Promise<HungPrimary> {
  const [node1, node2, node3] = ["node-1", "node-2", "node-3"].map((id) => active.node(id));
  if (!node1 || !node2 || !node3) throw new Error("three nodes expected");
  for (const node of active.redis)
    await withClient(node, (client) => client.config("SET", "repl-ping-replica-period", "3600"));
  await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
  await waitForMembers(active, "node-1", ["node-2", "node-3"]);
  await writeKeys(node1, `${prefix}:acked`, keys, 2);
  const x = (await replicationOf(node1)).offset;
  await active.waitFor(
    "node-2 and node-3 at node-1's offset",
    async () => (await roleOf(node2)).offset === x && (await roleOf(node3)).offset === x,
    WAIT_MS,
  );
  for (const controller of active.controllers) await controller.stop(3000);
  const online = (await active.topology()) as Topology;
  const lineage = { node_id: "node-1", repl_id: (await replicationOf(node1)).replId, last_txn_id: x };

  active.signalAgent("node-1", "SIGSTOP");
  node1.signal("SIGSTOP");
  await active.waitFor(
    "node-2 and node-3 parked by their probes",
    async () =>
      (await roleOf(node2)).primaryPort === PARKED_PORT && (await roleOf(node3)).primaryPort === PARKED_PORT,
    WAIT_MS,
  );
  return { node1, node2, node3, x, online, lineage };
}

/**
 * The plan a controller stores when it fails node-1 over to `target` (phase promote, `startedAt`
 * for every phase so far): node-2 and node-3 ranked on x, the plan's lineage L at x.
 */
export function planOnto(
  active: LocalCluster,
  scene: HungPrimary,
  target: string,
  startedAt: number,
  reason: string,
): FailoverState {
  return {
    kind: "failover",
    old_primary_node_id: "node-1",
    new_primary_node_id: target,
    new_primary_address: active.node(target).address,
    reason,
    started_at: startedAt,
    candidates: ["node-2", "node-3"].map((id) => ({
      node_id: id,
      node_address: active.node(id).address,
      last_txn_id: scene.x,
      priority: 100,
      eligible: true,
      reason: "eligible",
    })),
    phase_started: { locked: startedAt, epoch_bumped: startedAt, promote: startedAt },
    lineage: scene.lineage,
  };
}
