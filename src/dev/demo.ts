import { discardMetrics, logEventPublisher, silentLogger } from "../adapters/observability.ts";
import { colors as pc } from "../cli/colors.ts";
import { ReportRequests } from "../cli/commands/report-requests.ts";
import { formatDuration, renderShardStatus, shardStatus } from "../cli/status-view.ts";
import { type FailoverConfigInput, parseFailoverConfig } from "../core/config.ts";
import type { Topology } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import { LocalCluster } from "./local-cluster.ts";
import { WriteWorkload } from "./workload/writer.ts";

export interface DemoOptions {
  readonly nodes: number;
  readonly config: FailoverConfigInput;
  /** Seconds of steady writes before the kill. */
  readonly warmupMs: number;
  /** Human output (live view, phases); never the JSON summary. */
  readonly out: (text: string) => void;
  /** Redraw a live frame in place (a terminal) instead of printing status blocks. */
  readonly live: boolean;
  readonly signal?: AbortSignal;
}

export interface DemoSummary {
  readonly shard: string;
  readonly failure_timeout_ms: number;
  readonly killed_node: string;
  readonly kill_time: string;
  /** ms from the kill until the controller began the failover (topology left `online`). */
  readonly detection_ms: number | undefined;
  readonly promoted: { readonly node_id: string; readonly last_txn_id: number | undefined } | undefined;
  readonly others: ReadonlyArray<{
    readonly node_id: string;
    readonly last_txn_id: number;
    readonly eligible: boolean;
  }>;
  readonly epoch: number | undefined;
  readonly phase_timings_ms: Readonly<Record<string, number>>;
  /** ms from the kill to the first write a new primary acknowledged. */
  readonly time_to_first_ack_ms: number | undefined;
  readonly writes_acknowledged: number;
  readonly writes_lost: number;
  readonly old_primary_rejoined_as_replica: boolean;
}

const FRAME_MS = 250;

/**
 * The live failover demo: a 3-node shard with its agents and a controller on the local stack, a
 * writer writing all along, SIGKILL of the primary, the failover phase by phase, the old primary
 * restarted and rejoining as a replica, and acknowledged writes checked against the new primary.
 */
export async function runDemo(options: DemoOptions): Promise<DemoSummary> {
  const events: string[] = [];
  const t0 = performance.now();
  const event = (line: string) => {
    const stamped = `${pc.dim(`[${((performance.now() - t0) / 1000).toFixed(2).padStart(6)} s]`)} ${line}`;
    events.push(stamped);
    if (!options.live) options.out(`${stamped}\n`);
  };
  event("starting the local stack, 3 redis-server nodes, their agents and the controller");
  const cluster = await LocalCluster.start({
    nodes: options.nodes,
    config: options.config,
    onProgress: event,
    // A first run on a busy machine: processes may take tens of seconds to start.
    readyTimeoutMs: 120_000,
  });
  const config = parseFailoverConfig(options.config);
  const { failureTimeoutMs } = config;
  const writer = new WriteWorkload({ resolvePrimary: () => cluster.primaryAddress() });
  // Quiet replicas write every 20 s; the demo asks them to report, as `status --fresh` does, so
  // that every table shows their current offsets and real lag.
  const reports = new ReportRequests({
    store: cluster.aws.store,
    bus: cluster.aws.bus,
    clock: cluster.aws.clock,
    config,
    log: silentLogger,
    metrics: discardMetrics,
    events: logEventPublisher(silentLogger),
  });
  const statusOf = (snapshot: ShardSnapshot) =>
    shardStatus(snapshot, cluster.aws.clock.now(), config, {
      reportsAskedAt: reports.askedAt(cluster.shard),
    });
  let frame: NodeJS.Timeout | undefined;
  const draw = (snapshot: ShardSnapshot) => {
    const stats = writer.stats();
    const view = renderShardStatus(statusOf(snapshot), { controllerLine: true });
    const writes = `writer: ${stats.acked} acknowledged, ${stats.failedWrites} failed, writing to ${stats.address ?? "-"}`;
    options.out(`\x1b[H\x1b[J${view}\n\n${writes}\n\n${events.slice(-14).join("\n")}\n`);
  };
  // Only a terminal gets the live frame; without one, status blocks are printed at the key moments.
  // A failed read only skips a frame; the next one, 250 ms later, reads again.
  const redraw = () =>
    cluster
      .snapshot()
      .then(async (snapshot) => {
        await reports.ask(snapshot);
        draw(snapshot);
      })
      .catch(() => {});
  if (options.live) frame = setInterval(redraw, FRAME_MS);
  const printStatus = async () => {
    const now = await reports.fresh(cluster.shard, await cluster.snapshot());
    options.out(`${renderShardStatus(statusOf(now), { controllerLine: true })}\n`);
  };
  try {
    writer.start();
    event(`shard ${cluster.shard} online; primary ${cluster.redis[0]?.id}; writer writing`);
    await sleepUnless(options.warmupMs, options.signal);
    if (!options.live) await printStatus();

    const victim = cluster.redis[0];
    if (!victim) throw new Error("no primary node");
    const before = await cluster.topology();
    const killedAtWall = Date.now();
    const killedAt = performance.now();
    victim.signal("SIGKILL");
    event(pc.red(`SIGKILL redis-server of ${victim.id} (primary, ${victim.address})`));

    const phases = followPhases(cluster, before?.epoch ?? 0, killedAt, event);
    const ack = await writer.waitForAckAfter(killedAt, victim.address, 60_000);
    const timeToFirstAck = ack ? ack.at - killedAt : undefined;
    if (ack) {
      event(
        pc.green(
          `first write acknowledged by the new primary ${ack.address} ${formatDuration(ack.at - killedAt)} after the kill`,
        ),
      );
    }
    const after = await phases;
    if (!options.live) await printStatus();

    event(`restarting ${victim.id}'s redis-server (it comes back empty and believing it is a primary)`);
    await victim.start();
    const rejoined = await cluster
      .waitFor(
        `${victim.id} to rejoin as a replica`,
        async () => {
          const node = cluster.heartbeatOf(await cluster.snapshot(), victim.id);
          return (
            node?.role === "replica" &&
            node.primary_link === "up" &&
            node.primary_node_id === after?.primary_node_id
          );
        },
        30_000,
      )
      .then(() => true)
      .catch((error: unknown) => {
        event(pc.red(String(error)));
        return false;
      });
    if (rejoined) event(pc.green(`${victim.id} rejoined as a replica of ${after?.primary_node_id}`));
    await sleepUnless(1000, options.signal);
    await writer.stop();

    const history = (await cluster.aws.store.history.list(cluster.shard, 1))[0];
    const finalPrimary = cluster.redis.find((node) => node.id === after?.primary_node_id);
    let lost = 0;
    if (finalPrimary) {
      const client = finalPrimary.client();
      try {
        lost = (await writer.verify(client)).lost.length;
      } finally {
        client.disconnect();
      }
    }
    const stats = writer.stats();
    event(`writes acknowledged: ${stats.acked}; acknowledged writes lost: ${lost}`);
    if (options.live) await redraw();
    const promotedCandidate = history?.candidates.find(
      (candidate) => candidate.node_id === history.new_primary_node_id,
    );
    return {
      shard: cluster.shard,
      failure_timeout_ms: failureTimeoutMs,
      killed_node: victim.id,
      kill_time: new Date(killedAtWall).toISOString(),
      detection_ms: after?.failover_started_at
        ? Math.max(0, after.failover_started_at - killedAtWall)
        : undefined,
      promoted: history?.new_primary_node_id
        ? { node_id: history.new_primary_node_id, last_txn_id: promotedCandidate?.last_txn_id }
        : undefined,
      others: (history?.candidates ?? [])
        .filter((candidate) => candidate.node_id !== history?.new_primary_node_id)
        .map((candidate) => ({
          node_id: candidate.node_id,
          last_txn_id: candidate.last_txn_id,
          eligible: candidate.eligible,
        })),
      epoch: after?.epoch,
      phase_timings_ms: history?.phase_timings ?? {},
      time_to_first_ack_ms: timeToFirstAck === undefined ? undefined : Math.round(timeToFirstAck),
      writes_acknowledged: stats.acked,
      writes_lost: lost,
      old_primary_rejoined_as_replica: rejoined,
    };
  } finally {
    if (frame) clearInterval(frame);
    await writer.stop();
    event("stopping everything the demo started");
    await cluster.stop();
  }
}

/**
 * Logs each status/phase change of the topology until the shard is online at a higher epoch;
 * resolves with that topology and when the failover began (AWS-aligned ms).
 */
async function followPhases(
  cluster: LocalCluster,
  fromEpoch: number,
  killedAt: number,
  event: (line: string) => void,
): Promise<(Topology & { failover_started_at?: number }) | undefined> {
  let last = "";
  let startedAt: number | undefined;
  let result: Topology | undefined;
  await cluster.waitFor(
    "the failover to complete",
    async () => {
      const topology = await cluster.topology();
      if (!topology) return false;
      const state = `${topology.status}${topology.phase ? `/${topology.phase}` : ""}`;
      if (state !== last) {
        last = state;
        const target = topology.failover ? ` -> ${topology.failover.new_primary_node_id}` : "";
        event(
          `${pc.yellow(state)}${target} (epoch ${topology.epoch}, +${formatDuration(performance.now() - killedAt)})`,
        );
      }
      startedAt ??= topology.failover?.started_at;
      if (topology.status === "online" && topology.epoch > fromEpoch) {
        result = topology;
        return true;
      }
      return false;
    },
    120_000,
  );
  return result ? { ...result, failover_started_at: startedAt } : undefined;
}

function sleepUnless(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    });
  });
}
