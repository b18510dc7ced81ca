/**
 * Database identity: whether a database that came back as a new process (another `run_id`) may
 * serve, or restarted without its data and must be fenced until it follows the shard's primary
 * (guarantee 5, docs/agent.md#database-identity).
 */

import type { Role } from "./model.ts";

/** What the agent read of its database at one cycle. */
export interface DatabaseIdentity {
  readonly runId: string;
  readonly replId: string;
  readonly offset: number;
  readonly role: Role;
  /** Replicas attached with a completed sync. */
  readonly synced: number;
}

export interface RestartContext {
  /** The topology names this node as the primary. */
  readonly named: boolean;
  /** The primary's stored replica set. */
  readonly guardMembers: readonly string[];
}

export type RestartVerdict =
  | { readonly kind: "same" }
  | { readonly kind: "harmless"; readonly continues: boolean; readonly reason: string }
  | { readonly kind: "lost-data"; readonly reason: string };

/** Judges a database read `current` after `previous` (the last read before it). */
export function judgeRestart(
  previous: DatabaseIdentity | undefined,
  current: DatabaseIdentity,
  context: RestartContext,
): RestartVerdict {
  if (previous === undefined || previous.runId === current.runId) return { kind: "same" };
  const continues = current.replId === previous.replId && current.offset >= previous.offset;
  const harmless = (reason: string): RestartVerdict => ({ kind: "harmless", continues, reason });
  if (continues) return harmless("it continues its replication lineage");
  // A database that already follows a primary serves nobody's writes: its sync replaces its data.
  // Harmless to the data, not to availability when the topology names it primary: nobody takes
  // writes then, and the controller replaces it once that lasts the failure timeout (its heartbeat's
  // \`role_since\`, gate \`primary_demoted_grace\`).
  if (current.role !== "primary")
    return harmless(
      context.named
        ? "it came back as a replica while the topology names it primary: it takes no writes until the controller replaces it"
        : "it came back as a replica",
    );
  if (previous.role !== "primary" && !context.named) return harmless("it was not the shard's primary");
  // Without a replica holding the data, fencing would only stop writes. Members of the replica
  // set hold it, and so do the replicas attached to the old process when it was last read, members
  // or not (not yet stored on a new shard; or gone from the set while hung, still holding every
  // write they acknowledged): serving the empty dataset would feed it to them in a full sync.
  // Fenced, the node is failed over (to a member), or the shard goes offline and comes back on the
  // replica with the lineage (the offline path does not ask for membership).
  const othersHoldData = context.guardMembers.length > 0 || previous.synced > 0;
  if (!othersHoldData) return harmless("no other node holds its data");
  return {
    kind: "lost-data",
    reason: "the database restarted without continuing its replication lineage (its data may be gone)",
  };
}

/** Where a database stands in replication: its lineage and offset, and the earlier one it continues. */
export interface ReplicationPoint {
  readonly replId: string;
  readonly offset: number;
  /** Redis `master_replid2` and `second_repl_offset` - 1, when there is one. */
  readonly prior?: { readonly replId: string; readonly offset: number } | undefined;
}

/**
 * `holder` holds every write `data` holds: on `data`'s lineage at least as far, directly or as
 * the lineage it continues (a promoted node, a primary restarted from its RDB: Redis keeps the old
 * id as `master_replid2`). `data`'s own earlier lineage counts only while it took nothing since
 * (its offset is still where the old lineage ended). A full sync from such a holder loses nothing.
 * An empty database (a known lineage at offset 0, no earlier one) holds no write: every holder
 * holds all of it (nemesis seed 3110: an empty replica's "restarted" report against the primary
 * with the data made its own empty lineage the shard's, and it was brought online).
 */
export function holdsAllOf(holder: ReplicationPoint, data: ReplicationPoint): boolean {
  if (data.replId !== "" && data.offset === 0 && data.prior === undefined) return true;
  const holds = (replId: string, offset: number): boolean =>
    replId !== "" &&
    ((holder.replId === replId && holder.offset >= offset) ||
      (holder.prior !== undefined && holder.prior.replId === replId && holder.prior.offset >= offset));
  if (holds(data.replId, data.offset)) return true;
  return (
    data.prior !== undefined &&
    data.offset <= data.prior.offset &&
    holds(data.prior.replId, data.prior.offset)
  );
}
