import type { DatabaseIdentity } from "../core/identity.ts";
import type { Role } from "../core/model.ts";
import type { AgentState } from "./state-dir.ts";

/**
 * What the agent knows of its database's process: who it is (run id, lineage, offset: a new process
 * that does not continue them restarted), whether it restarted without its data while primary
 * (fenced until it follows the shard's primary), and since when it answers in its role. Kept in the
 * state dir by src/agent/db-identity.ts, which owns it; others read it.
 */
export class DatabaseRecord {
  /** The database's identity as last read: a new run_id that does not continue it is a restart. */
  identity: DatabaseIdentity | undefined;
  /** The database restarted without continuing its lineage while it was primary: fenced until it follows. */
  restarted: boolean;
  /**
   * A primary's restart that would continue its lineage by the peers' reports the agent had, but
   * those were read before the restart: the process is held fenced (\`restarted\`) until a snapshot
   * read after \`seenAt\` (AWS-aligned ms), with every member of the replica set reporting since,
   * judges it again (nemesis seed 5101).
   */
  pendingRestart: { readonly previous: DatabaseIdentity; readonly seenAt: number } | undefined;
  /**
   * The previous process's last answer, when the database restarted behind it on the same lineage
   * (the heartbeat's \`restarted_behind\` while the new process holds less; gate
   * \`replica_down_ahead\`, nemesis seed 6803). Not persisted: an agent restarted with it loses it.
   */
  restartedBehind:
    | { readonly repl_id: string; readonly last_txn_id: number; readonly last_updated: number }
    | undefined;
  /** Monotonic ms when `identity` was last written to the state dir. */
  persistedAt = Number.NEGATIVE_INFINITY;
  /**
   * The database's role as last read and since when (AWS-aligned ms of the first read that found
   * it): the heartbeat's `role_since`, by which the controller tells a primary demoted for good
   * (restarted from a config with `replicaof`, an operator's REPLICAOF) from one being promoted.
   */
  roleSeen: { readonly role: Role; readonly since: number } | undefined;
  /** Monotonic ms of the last identity-conflict error line (repeated every 30 s, not every cycle). */
  conflictReportedAt = Number.NEGATIVE_INFINITY;
  /**
   * The state dir held no identity of the database (a first start, or the dir lost with its
   * machine): the process that answers is judged once against this node's own last stored report
   * (\`judgeAgainstOwnReport\`), the only record left of what it held.
   */
  ownReportPending: boolean;

  /**
   * From what the previous agent process knew of the database: a database restarted while this
   * agent was down too is still judged, and a restart it fenced stays fenced.
   */
  constructor(stored: AgentState) {
    const identity = stored.db_identity;
    if (identity !== undefined) {
      this.identity = {
        runId: identity.run_id,
        replId: identity.repl_id,
        offset: identity.offset,
        role: identity.role,
        synced: identity.synced,
        prior:
          identity.prior === undefined
            ? undefined
            : { replId: identity.prior.repl_id, offset: identity.prior.offset },
      };
    }
    this.restarted = stored.db_restarted === true;
    this.ownReportPending = identity === undefined;
  }
}
