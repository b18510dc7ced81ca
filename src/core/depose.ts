import { type FreshnessTimings, isFresh } from "./freshness.ts";
import type { Heartbeat, Topology } from "./model.ts";

/**
 * A node being promoted fences the old primary's database itself (guarantee 2). Redis's guard on
 * the old primary (`min-replicas-to-write`) counts every replica that acknowledges, member of its
 * replica set or not, and only its agent keeps that count in step with the set. With that agent
 * dead, a replica that re-attaches to the old primary (one that was hung and resumes on its old
 * link, before its own agent repoints it) lets it take writes again: `WAIT 1` acknowledges them
 * and they are lost when that replica follows the new primary (nemesis seed 3401: 4 two-writable
 * samples, 6 replica-acknowledged writes lost). The promoted node replicated from the old primary
 * and can reach it: it sets the fence there before opening its own writes. Best effort within a
 * bound: a dead or unreachable old primary takes nothing from the promotion, whose own fence
 * window (PROMOTION_FENCE_WINDOW_MS) still holds as before.
 */

/** How long the promoted node tries to reach each database it fences, ms. */
export const DEPOSE_TIMEOUT_MS = 1_000;

export interface DeposeInput {
  /** The promoted node's own address (never fenced). */
  readonly selfAddress: string;
  readonly selfId: string;
  /** The topology the PROMOTE was screened against. */
  readonly topology: Topology | undefined;
  /** host:port the node replicated from just before the promotion (INFO), if a replica. */
  readonly followed: string | undefined;
  /** Addresses that stand for no database (a parked replica's). */
  readonly ignore: readonly string[];
}

/**
 * The databases to fence before this node opens as primary: the primary the topology names while
 * the failover runs (the old one, whatever this node followed), the node it replicated from, and
 * the old primaries the topology keeps unfenced (\`topology.deposed\`, \`deposedAfter\`: earlier
 * primaries, online or offline since), each once; never itself or a parked replica's address.
 */
export function deposedAddresses(input: DeposeInput): string[] {
  const { topology } = input;
  const named =
    topology?.primary_node_id !== undefined && topology.primary_node_id !== input.selfId
      ? topology.primary_address
      : undefined;
  const keptOld = (topology?.deposed ?? [])
    .filter((old) => old.node_id !== input.selfId)
    .map((old) => old.address);
  const addresses: string[] = [];
  for (const address of [named, input.followed, ...keptOld]) {
    if (address === undefined || address === input.selfAddress || input.ignore.includes(address)) continue;
    if (!addresses.includes(address)) addresses.push(address);
  }
  return addresses;
}

/**
 * A deposing promotion: the one candidate left is outside the old primary's replica set, and the
 * old primary's agent is not heard, so promoting it would detach no replica the old primary's
 * guard waits for (gate \`unfenced_old_primary\`). It may still go ahead when the candidate can fence
 * the old primary itself: its last report, fresh, says its database replicates from that primary
 * with the link up and its probe reached it (\`ok\`, or \`fenced\`: refusing writes already). Its
 * agent then sets the fence there, catches up with the old primary's final offset and only then
 * detaches; if any step fails it does not promote (src/agent/depose.ts \`deposeFirst\`).
 */
export function canDepose(
  candidate: Heartbeat,
  old: Heartbeat,
  timings: FreshnessTimings,
  now: number,
): boolean {
  return (
    candidate.node_id !== old.node_id &&
    candidate.db_status === "up" &&
    isFresh(candidate, timings, now) &&
    candidate.primary_node_id === old.node_id &&
    candidate.primary_link === "up" &&
    (candidate.primary_probe === "ok" || candidate.primary_probe === "fenced")
  );
}

/** How long a deposing promotion waits for the candidate to reach the fenced old primary's offset, ms. */
export const DEPOSE_CATCH_UP_MS = 2_000;

/** Phases after which a failover's target may have applied its PROMOTE. */
const PROMOTED_PHASES: ReadonlySet<string> = new Set(["promote", "confirm", "repoint", "cleanup"]);

/** The schema's bound on \`topology.deposed\` (src/core/model.ts): the latest are kept. */
export const MAX_DEPOSED = 16;

type DeposedEntry = NonNullable<Topology["deposed"]>[number];

/** `entries` with `node_id` at the end (once, its latest address and epoch), at most MAX_DEPOSED. */
function withDeposed(
  entries: readonly DeposedEntry[],
  node_id: string | undefined,
  address: string | undefined,
  epoch: number,
): DeposedEntry[] {
  if (node_id === undefined || address === undefined) return [...entries];
  return [...entries.filter((entry) => entry.node_id !== node_id), { node_id, address, epoch }].slice(
    -MAX_DEPOSED,
  );
}

/** A failover's target that may have applied its PROMOTE (\`failover\` in a promoting phase). */
function promotedTarget(topology: Topology): { node_id: string; address: string } | undefined {
  const failover = topology.failover;
  if (failover === undefined || topology.phase === undefined || !PROMOTED_PHASES.has(topology.phase))
    return undefined;
  return { node_id: failover.new_primary_node_id, address: failover.new_primary_address };
}

/**
 * An entry's own agent says its database stood down: the node's report, from a database that
 * answers at the entry's address, says replica, and its agent obeyed a topology at least as new as
 * the one that deposed it (\`epoch\`; an entry without one: \`atLeast\`, the epoch of the topology
 * that keeps it). Only an agent that followed the newer topology demotes its database; a replica
 * takes no writes, and its agent keeps its guard from then on. A dead agent's last report (primary
 * at the older epoch) never says so: nemesis seed 6811's node-2.
 */
export function stoodDown(entry: DeposedEntry, reports: readonly Heartbeat[], atLeast: number): boolean {
  const report = reports.find((node) => node.node_id === entry.node_id);
  return (
    report !== undefined &&
    report.db_status === "up" &&
    report.role === "replica" &&
    report.node_address === entry.address &&
    report.epoch >= (entry.epoch ?? atLeast)
  );
}

/**
 * The old primaries a topology keeps (\`topology.deposed\`): every primary the shard replaced whose
 * database nobody is known to have fenced, online and offline alike. Each promotion's target
 * fences each of them before it opens (\`deposedAddresses\`), so one that was hung or cut off
 * through its own successor's epoch is still fenced by every later one (nemesis seed 6811: node-2,
 * primary at epoch 26, agent killed and redis hung; node-22r, promoted at 27, could not reach it,
 * epoch 28 came before node-2 woke, and nothing fenced it again: a replica restarted with
 * \`replicaof node-2\` acknowledged 32 writes there that were lost). An entry is
 * - added at each change of the shard's primary, with the epoch of the topology written then: the
 *   primary \`topology\` names (replaced), and a failover's target that may have applied its
 *   PROMOTE (replaced by a replan or by going offline);
 * - dropped when the node is the shard's primary again (\`primary\`, by id or address), or when its
 *   own agent says its database stood down (\`stoodDown\`, from \`reports\`);
 * - at most MAX_DEPOSED, the latest kept.
 * \`epoch\` is the epoch of the topology being written; undefined when nothing is kept.
 */
export function deposedAfter(input: {
  readonly topology: Topology | undefined;
  readonly epoch: number;
  /** The primary the written topology names or promotes (a plan's target): never kept. */
  readonly primary?: { readonly node_id: string; readonly address: string } | undefined;
  /** Whether the primary \`topology\` names is replaced (a change completes or the shard goes offline). */
  readonly replacesNamed: boolean;
  /** The nodes' reports, when read (the decision's snapshot); none: nothing is dropped for them. */
  readonly reports?: readonly Heartbeat[] | undefined;
}): Topology["deposed"] {
  const { topology, epoch, primary } = input;
  if (topology === undefined) return undefined;
  let entries: DeposedEntry[] = [...(topology.deposed ?? [])];
  if (input.replacesNamed)
    entries = withDeposed(entries, topology.primary_node_id, topology.primary_address, epoch);
  const target = promotedTarget(topology);
  if (target !== undefined) entries = withDeposed(entries, target.node_id, target.address, epoch);
  const reports = input.reports ?? [];
  const kept = entries.filter(
    (entry) =>
      entry.node_id !== primary?.node_id &&
      entry.address !== primary?.address &&
      !stoodDown(entry, reports, topology.epoch),
  );
  return kept.length === 0 ? undefined : kept;
}

/**
 * The old primaries an offline topology keeps when the shard goes offline from \`topology\` at
 * \`epoch\` (\`deposedAfter\`: those it kept, the primary it names, and a failover's target that may
 * have applied its PROMOTE). Nemesis seed 6303 (guarantee 2): primary node-22r's agent was dead
 * when its only member restarted empty; the shard went offline, naming no primary, and a recover
 * brought it online on that member. Nothing fenced node-22r (the successor fenced only the primary
 * the topology named, none), so when an agentless replica attached to it, its guard counted that
 * replica and it took writes beside the new primary for 135 s. Now the offline topology remembers
 * it, and the node brought online fences it before it opens (\`deposedAddresses\`).
 */
export function deposedWhenOffline(topology: Topology | undefined, epoch: number): Topology["deposed"] {
  return deposedAfter({ topology, epoch, replacesNamed: true });
}
