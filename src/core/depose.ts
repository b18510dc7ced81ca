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
 * the old primaries an offline shard keeps (\`topology.deposed\`, brought online on this node),
 * each once; never itself or a parked replica's address.
 */
export function deposedAddresses(input: DeposeInput): string[] {
  const { topology } = input;
  const named =
    topology?.primary_node_id !== undefined && topology.primary_node_id !== input.selfId
      ? topology.primary_address
      : undefined;
  const offlineOld = (topology?.deposed ?? [])
    .filter((old) => old.node_id !== input.selfId)
    .map((old) => old.address);
  const addresses: string[] = [];
  for (const address of [named, input.followed, ...offlineOld]) {
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

/**
 * The old primaries an offline topology keeps (\`topology.deposed\`) when the shard goes offline
 * from \`topology\`: those it kept already, the primary it names, and a failover's target that may
 * have applied its PROMOTE; each node once, the latest address kept. Nemesis seed 6303 (guarantee
 * 2): primary node-22r's agent was dead when its only member restarted empty; the shard went
 * offline, naming no primary, and a recover brought it online on that member. Nothing fenced
 * node-22r (the successor fenced only the primary the topology named, none), so when an agentless
 * replica attached to it, its guard counted that replica and it took writes beside the new
 * primary for 135 s. Now the offline topology remembers it, and the node brought online fences it
 * before it opens (\`deposedAddresses\`).
 */
export function deposedWhenOffline(topology: Topology | undefined): Topology["deposed"] {
  if (topology === undefined) return undefined;
  const entries = [...(topology.deposed ?? [])];
  const add = (node_id: string | undefined, address: string | undefined) => {
    if (node_id === undefined || address === undefined) return;
    const index = entries.findIndex((entry) => entry.node_id === node_id);
    if (index >= 0) entries.splice(index, 1);
    entries.push({ node_id, address });
  };
  add(topology.primary_node_id, topology.primary_address);
  const failover = topology.failover;
  if (failover !== undefined && topology.phase !== undefined && PROMOTED_PHASES.has(topology.phase))
    add(failover.new_primary_node_id, failover.new_primary_address);
  // At most the schema's bound, the latest kept.
  const kept = entries.slice(-16);
  return kept.length === 0 ? undefined : kept;
}
