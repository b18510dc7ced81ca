import { discardMetrics, silentLogger } from "../../src/adapters/observability.ts";
import { drainNode, undrainNode } from "../../src/controller/requests.ts";
import { createControllerRuntime } from "../../src/controller/runtime.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { Ack, WriteWorkload } from "../../src/dev/workload/writer.ts";

/**
 * A rolling restart of every node of a shard, driven by the runbook's commands (docs/runbook.md):
 * for each replica, then the primary: drain (a primary is switched over away from first), wait
 * until it follows the primary, restart its redis-server empty as a replica of the primary (an
 * upgrade that keeps no data), wait until it follows again, undrain. A `WAIT 1` writer runs
 * throughout; each step reports its longest stretch without an acknowledged write.
 */

export interface RollingStep {
  readonly node: string;
  /** The node was the primary when its step began (its drain switched over away from it). */
  readonly wasPrimary: boolean;
  readonly durationMs: number;
  /** Longest time between two acknowledged writes during the step. */
  readonly longestGapMs: number;
}

export interface RollingResult {
  readonly steps: readonly RollingStep[];
  readonly totalMs: number;
  /** Sum over the steps of their longest gaps: an upper bound of the write unavailability. */
  readonly unavailableMs: number;
}

/** The longest time without an acknowledged write between `from` and `to` (monotonic ms). */
export function longestGap(acks: readonly Ack[], from: number, to: number): number {
  let previous = from;
  let longest = 0;
  for (const ack of acks) {
    if (ack.at <= from) continue;
    if (ack.at > to) break;
    longest = Math.max(longest, ack.at - previous);
    previous = ack.at;
  }
  return Math.max(longest, to - previous);
}

/**
 * Waits until `node` follows the topology's primary with its link up (what `drain --wait` waits
 * for), in a heartbeat its database answered after `sinceWallMs` (a report from before a restart
 * proves nothing), and its redis-server says so itself (ROLE: connected).
 */
async function following(
  cluster: LocalCluster,
  node: string,
  sinceWallMs: number,
  timeoutMs: number,
): Promise<void> {
  const client = cluster.node(node).client({ maxRetriesPerRequest: 0, lazyConnect: true });
  client.on("error", () => {});
  try {
    await cluster.waitFor(
      `${node} following the primary`,
      async () => {
        const snapshot = await cluster.snapshot();
        const primary = snapshot.topology?.primary_node_id;
        const heartbeat = snapshot.nodes.find((candidate) => candidate.node_id === node);
        if (
          snapshot.topology?.status !== "online" ||
          heartbeat?.role !== "replica" ||
          heartbeat.primary_node_id !== primary ||
          heartbeat.primary_link !== "up" ||
          heartbeat.db_status !== "up" ||
          heartbeat.last_updated / 1000 <= sinceWallMs
        ) {
          return false;
        }
        if (client.status !== "ready") await client.connect().catch(() => undefined);
        const role = (await client.call("ROLE").catch(() => [])) as unknown[];
        return role[0] === "slave" && role[3] === "connected";
      },
      timeoutMs,
    );
  } finally {
    client.disconnect();
  }
}

/** Runs the rolling restart on `cluster` while `writer` (already started, `waitReplicas: 1`) writes. */
export async function rollingRestart(
  cluster: LocalCluster,
  writer: WriteWorkload,
  options: { readonly log?: (line: string) => void; readonly stepTimeoutMs?: number } = {},
): Promise<RollingResult> {
  const log = options.log ?? (() => {});
  const timeoutMs = options.stepTimeoutMs ?? 60_000;
  const runtime = createControllerRuntime(cluster.env, { log: silentLogger, metrics: discardMetrics });
  try {
    const primary = (await cluster.topology())?.primary_node_id;
    const order = [
      ...cluster.redis.map((node) => node.id).filter((id) => id !== primary),
      ...(primary ? [primary] : []),
    ];
    const started = performance.now();
    const steps: RollingStep[] = [];
    for (const node of order) {
      const from = performance.now();
      const wasPrimary = (await cluster.topology())?.primary_node_id === node;
      const drained = await drainNode(runtime.deps, cluster.shard, node);
      if (drained.outcome !== "drained")
        throw new Error(`drain ${node}: ${drained.outcome}: ${drained.reason}`);
      await following(cluster, node, Date.now() - 1000, timeoutMs);
      const primaryAddress = (await cluster.topology())?.primary_address as string;
      const redis = cluster.node(node);
      const restartedAt = Date.now();
      await redis.stop();
      redis.wipeData();
      await redis.start({ replicaOf: primaryAddress });
      await following(cluster, node, restartedAt, timeoutMs);
      const undrained = await undrainNode(runtime.deps, cluster.shard, node);
      if (undrained.outcome !== "undrained")
        throw new Error(`undrain ${node}: ${undrained.outcome}: ${undrained.reason}`);
      const to = performance.now();
      const step = {
        node,
        wasPrimary,
        durationMs: Math.round(to - from),
        longestGapMs: Math.round(longestGap(writer.acks(), from, to)),
      };
      log(
        `rolling: ${node}${wasPrimary ? " (primary)" : ""} done in ${step.durationMs} ms, longest write gap ${step.longestGapMs} ms`,
      );
      steps.push(step);
    }
    return {
      steps,
      totalMs: Math.round(performance.now() - started),
      unavailableMs: steps.reduce((sum, step) => sum + step.longestGapMs, 0),
    };
  } finally {
    runtime.destroy();
  }
}
