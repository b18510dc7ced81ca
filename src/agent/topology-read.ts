import { topologyToWatch } from "../core/agent-cycle.ts";
import { reportWindowMs } from "../core/freshness.ts";
import { parkOutgrown, peerPointOf } from "../core/identity.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import { nodeIdsByAddress } from "../core/write-guard.ts";
import type { AgentContext } from "./context.ts";
import { judgeAgainstOwnReport, rejudgeRestart } from "./db-identity.ts";
import { assessTopology, staysParked, type TopologyVerdict, topologyPrimary } from "./fencing.ts";
import { becomeReplicaOf, readTarget } from "./node-control.ts";
import { isParked } from "./primary-probe.ts";
import { type ReplicationInfo, replicatingFrom } from "./redis-info.ts";
import { withStoreTimeout } from "./scheduling.ts";

/**
 * The shard as the heartbeat cycle reads it: one snapshot (topology, heartbeats, replica sets),
 * the verdict of the topology on this node, and aligning the database with it.
 */

/**
 * The topology names this node primary but its database answers as a replica (restarted from a
 * config file with \`replicaof\`, an operator's REPLICAOF): no node takes the shard's writes. The
 * agent does not promote it back itself: a database restarted empty would then feed nothing to
 * its replicas in a full sync, and only the controller can tell which node holds every
 * acknowledged write. Its heartbeat says \`role: replica\` since \`role_since\`; past the failure
 * timeout the controller fails over to the replica holding the most (gate \`primary_demoted_grace\`).
 */
export function reportNamedReplica(ctx: AgentContext, snapshot: ShardSnapshot, info: ReplicationInfo): void {
  const named = snapshot.topology ? topologyPrimary(snapshot.topology)?.node_id === ctx.nodeId : false;
  const namedButReplica = named && info.role === "replica";
  if (namedButReplica && !ctx.namedButReplica) {
    ctx.logger.error(
      "the topology names this node primary but its database is a replica: no node takes writes",
      {
        ...ctx.epochContext,
        replicatingFrom: replicatingFrom(info),
        link: info.primary?.link,
        action: "the controller fails over once this lasts the failure timeout",
      },
    );
  }
  ctx.namedButReplica = namedButReplica;
}

export async function readSnapshot(ctx: AgentContext): Promise<ShardSnapshot | undefined> {
  // AWS-aligned ms before the read: a snapshot tells nothing of reports written after this.
  const readFrom = ctx.deps.clock.now();
  try {
    const snapshot = await withStoreTimeout(
      ctx.deps.heartbeats.snapshot(ctx.shard),
      ctx.storeTimeoutMs,
      `snapshot of shard ${ctx.shard}`,
    );
    ctx.store.answered();
    ctx.topologyRead = true;
    ctx.lastTopology = snapshot.topology;
    // Freshest heartbeat per address and per node id; stale ones only for members and the primary.
    const known = nodeIdsByAddress(
      snapshot.nodes.map((node) => ({ ...node, written_us: node.agent_updated ?? node.last_updated })),
      ctx.deps.clock.now(),
      reportWindowMs(ctx.options.replicaKeepaliveMs, ctx.options),
      // Stale ones too for the old primary of an offline shard: a replica that still follows it
      // names it (a deposing promotion needs that, src/core/depose.ts).
      (claim) =>
        ctx.guardMembers.includes(claim.node_id) ||
        claim.node_id === ctx.nodeId ||
        claim.node_id === snapshot.topology?.lineage?.node_id,
    );
    ctx.knownNodes.clear();
    for (const [address, id] of known) ctx.knownNodes.set(address, id);
    // Every other node's heartbeat, however stale: one may hold the data of a database that
    // restarts without it (`judgeRestart`, sim seed 7011).
    const others = snapshot.nodes.filter((node) => node.node_id !== ctx.nodeId);
    ctx.othersHold = others.map(peerPointOf);
    ctx.othersRead = {
      from: readFrom,
      writtenMs: new Map(
        others.map((node) => [node.node_id, (node.agent_updated ?? node.last_updated) / 1000]),
      ),
    };
    judgeAgainstOwnReport(ctx, snapshot);
    rejudgeRestart(ctx);
    const primary = snapshot.topology ? topologyPrimary(snapshot.topology) : undefined;
    if (primary) ctx.knownNodes.set(primary.address, primary.node_id);
    // A read that names another primary, or none, withdraws a confirmation at once, also when the
    // database does not answer this cycle (the verdict that sets it needs both). Nemesis seed
    // 6602 (guarantee 2): node-3's database was hung while its agent read a topology naming its
    // successor; the confirmation of its old epoch stood, and when the database woke with the
    // agent cut off from the store, the agent set its old guard over the fence its successor had
    // set there. An agentless replica then satisfied that guard: writes beside the new primary.
    if (primary?.node_id !== ctx.nodeId && ctx.confirmed === true) {
      ctx.confirmed = false;
      ctx.unconfirmedReason =
        primary === undefined
          ? `the topology at epoch ${snapshot.topology?.epoch ?? "none"} names no primary`
          : `the topology at epoch ${snapshot.topology?.epoch} names ${primary.node_id} primary`;
    }
    return snapshot;
  } catch (error) {
    ctx.store.failed("snapshot", error, ctx.deps.clock.now());
    return undefined;
  }
}

export function verdictFor(
  ctx: AgentContext,
  snapshot: ShardSnapshot,
  info: ReplicationInfo,
): TopologyVerdict {
  const broken = snapshot.malformed.find((item) => item.sk === "TOPOLOGY");
  if (broken !== undefined) {
    // Fail closed: a topology that cannot be read confirms nobody (it is not "no topology yet").
    return {
      kind: "keep",
      primaryConfirmed: false,
      reason: `the topology item is malformed (${broken.field}: ${broken.reason})`,
    };
  }
  const named = snapshot.topology ? topologyPrimary(snapshot.topology) : undefined;
  if (named !== undefined && named.address === ctx.address && named.node_id !== ctx.nodeId) {
    // Never follow itself: another node id owns this address (a lost state dir, a copied config).
    return { kind: "keep", primaryConfirmed: false, reason: "identity conflict", conflict: named.node_id };
  }
  const followed = replicatingFrom(info);
  const verdict = assessTopology(snapshot.topology, {
    nodeId: ctx.nodeId,
    role: info.role,
    replicatingFrom: followed,
    followsShardNode: snapshot.nodes.some((node) => node.node_address === followed),
    highestEpoch: ctx.highestEpoch,
    promotedEpoch: ctx.state.state.promoted_epoch,
    parked: isParked(info) ? { from: ctx.probe.address ?? ctx.probe.parkedFrom } : undefined,
  });
  // A parked replica, or one this agent parked whose process restarted as a master holding data
  // (from its RDB; one restarted empty has nothing a sync could destroy): either way its data
  // waits for a primary known to hold it, or for a new decision.
  const parkedFrom = isParked(info)
    ? (ctx.probe.address ?? ctx.probe.parkedFrom)
    : info.role === "primary" && info.offset > 0
      ? ctx.probe.parkedFrom
      : undefined;
  if (
    parkedFrom !== undefined &&
    staysParked(verdict, {
      from: parkedFrom,
      atEpoch: ctx.probe.parkedAtEpoch,
      lacksData: ctx.probe.lacksMyData,
      status: snapshot.topology?.status,
    })
  ) {
    return {
      kind: "keep",
      primaryConfirmed: false,
      reason:
        verdict.kind === "demote"
          ? `parked from ${verdict.target.node_id} before the database restarted as a primary: fenced until a primary known to hold its data or a new decision`
          : `parked from ${verdict.target.node_id}`,
    };
  }
  return verdict;
}

/** Agents whose read of the primary a restarted parked database was parked from is in flight. */
const parkReads = new WeakSet<AgentContext>();

/**
 * A database this agent parked that restarted as a master holding data (from its RDB, the park not
 * in its config) stays fenced while the topology names the primary it was parked from at the park's
 * epoch (\`staysParked\`), and no probe watches a master's primary. Reads that primary here (in the
 * background: a hung one must not hold up the heartbeat) and judges it by the probe's rule: once it
 * holds this database's data, or took over from it by a recorded promotion (\`parkOutgrown\`), the
 * park is over, and the next cycle's verdict steps the database down to it (\`judgeFollow\` checks
 * the target once more). Simulator seed 310493 (liveness, (d)): n1, parked from n2 at epoch 1 (its
 * link lagging), restarted from an RDB holding 10 writes of its own past n2's recorded promotion
 * point; a fenced master for the last 84 s, the shard one replica short.
 */
export function judgeRestartedPark(ctx: AgentContext, snapshot: ShardSnapshot, info: ReplicationInfo): void {
  const from = ctx.probe.parkedFrom;
  if (from === undefined || info.role !== "primary" || info.offset <= 0 || parkReads.has(ctx)) return;
  const named = snapshot.topology ? topologyPrimary(snapshot.topology) : undefined;
  if (named?.address !== from) return;
  const links = snapshot.topology?.ancestry ?? [];
  const mine = ctx.probe.withPrior(info);
  parkReads.add(ctx);
  void readTarget(ctx, from)
    .then((primary) => {
      if (primary === undefined || ctx.probe.parkedFrom !== from || !parkOutgrown(primary, mine, links))
        return;
      ctx.probe.parkedFrom = undefined;
      ctx.probe.lacksMyData = false;
      ctx.logger.warn(
        "parked database restarted as a primary: the primary it was parked from holds its data; the park is over",
        {
          ...ctx.epochContext,
          primary: named.node_id,
          primaryAddress: from,
          replId: mine.replId,
          offset: mine.offset,
          primaryReplId: primary.replId,
          primaryOffset: primary.offset,
        },
      );
      ctx.wakeHeartbeat();
    })
    .finally(() => parkReads.delete(ctx));
}

/**
 * Demotes, repoints or lifts the write fence as the topology requires. Returns fresh INFO and
 * the role generation it belongs to.
 */
export async function reconcile(
  ctx: AgentContext,
  snapshot: ShardSnapshot,
): Promise<{ info: ReplicationInfo; generation: number }> {
  return ctx.roleLock.run(async () => {
    // Re-read under the lock: a command may have changed the role since the cycle began.
    const info = await ctx.db.replicationInfo();
    const verdict = verdictFor(ctx, snapshot, info);
    if (verdict.kind === "keep") return { info, generation: ctx.roleGeneration };
    ctx.logger.warn(
      verdict.kind === "demote"
        ? "stepping down: not the topology's primary"
        : "following the topology's primary",
      {
        ...ctx.epochContext,
        reason: verdict.reason,
        primary: verdict.target.node_id,
        primaryAddress: verdict.target.address,
        topologyEpoch: verdict.epoch,
      },
    );
    const next = await becomeReplicaOf(ctx, verdict.target, {
      epoch: verdict.epoch,
      topology: snapshot.topology,
    });
    ctx.state.update({ highest_epoch: Math.max(ctx.highestEpoch, verdict.epoch), promoted_epoch: undefined });
    return { info: next.info, generation: ctx.roleGeneration };
  });
}

/** A replica's topology read shows something to watch (`topologyToWatch`, src/core/agent-cycle.ts). */
export function replicaToWatch(ctx: AgentContext, snapshot: ShardSnapshot, info: ReplicationInfo): boolean {
  if (info.role !== "replica") return false;
  const named = snapshot.topology ? topologyPrimary(snapshot.topology) : undefined;
  return topologyToWatch(
    {
      topology: snapshot.topology,
      named,
      following: replicatingFrom(info),
      heartbeat:
        named === undefined ? undefined : snapshot.nodes.find((node) => node.node_id === named.node_id),
    },
    ctx.options,
    ctx.deps.clock.now(),
  );
}
