/**
 * What a node's HTTP role checks answer (`GET /primary`, `/replica`, `/health`), as Patroni's REST
 * API names them, so that HAProxy `option httpchk` and load balancers' target groups route clients
 * to the one node that takes writes. Pure: the agent gathers the facts, this decides.
 *
 * `/primary` is 200 exactly while the node accepts writes as the shard's primary: its database is
 * a master, the topology it last read names it at the current epoch, and no write fence is up (the
 * fence a cut-off or deposed primary raises, the window a freshly promoted node waits out). The
 * check turns 503 in the same step that raises the fence, so a client routed by it reaches a
 * node that refuses writes for at most the checker's interval — and that node refuses them.
 */

export type CheckName = "primary" | "replica" | "health";

export interface RoleFacts {
  /** The database answered its last INFO. */
  readonly dbUp: boolean;
  /** The database's role as last read. */
  readonly role: "primary" | "replica" | undefined;
  /** The topology the agent last read names this node primary at the epoch it holds. */
  readonly confirmedPrimary: boolean | undefined;
  /** Why the topology does not confirm it, when it does not. */
  readonly unconfirmedReason?: string | undefined;
  /** A write fence is up (the agent's fence, or the promotion window); the reason. */
  readonly fencedBecause: string | undefined;
  /** The address of the primary the topology names (host:port), if any. */
  readonly topologyPrimary: string | undefined;
  /** A replica's link: the primary it follows (host:port), link state, seconds since its last I/O. */
  readonly link:
    | {
        readonly primary: string;
        readonly up: boolean;
        readonly lastIoSecondsAgo: number | undefined;
        readonly syncing: boolean;
      }
    | undefined;
  /** Seconds of silence from the primary after which a replica is not served (the failure timeout). */
  readonly maxIoSilenceSeconds: number;
}

export interface CheckAnswer {
  readonly ok: boolean;
  /** One sentence: why it is (not) what the check asks for. */
  readonly reason: string;
}

export function checkPrimary(facts: RoleFacts): CheckAnswer {
  if (!facts.dbUp) return { ok: false, reason: "the database does not answer" };
  if (facts.role !== "primary")
    return { ok: false, reason: `the database is a ${facts.role ?? "node of unknown role"}` };
  if (facts.confirmedPrimary !== true) {
    return {
      ok: false,
      reason: `the topology does not name this node primary${facts.unconfirmedReason ? ` (${facts.unconfirmedReason})` : facts.confirmedPrimary === undefined ? " (not read yet)" : ""}`,
    };
  }
  if (facts.fencedBecause !== undefined)
    return { ok: false, reason: `writes fenced: ${facts.fencedBecause}` };
  return { ok: true, reason: "primary, confirmed by the topology, accepting writes" };
}

export function checkReplica(facts: RoleFacts): CheckAnswer {
  if (!facts.dbUp) return { ok: false, reason: "the database does not answer" };
  if (facts.role !== "replica" || facts.link === undefined) {
    return { ok: false, reason: `the database is a ${facts.role ?? "node of unknown role"}` };
  }
  const { link } = facts;
  if (facts.topologyPrimary === undefined) return { ok: false, reason: "the topology names no primary" };
  if (link.primary !== facts.topologyPrimary) {
    return {
      ok: false,
      reason: `follows ${link.primary}, not the topology's primary ${facts.topologyPrimary}`,
    };
  }
  if (!link.up || link.syncing)
    return { ok: false, reason: `link to ${link.primary} ${link.syncing ? "syncing" : "down"}` };
  if (link.lastIoSecondsAgo === undefined || link.lastIoSecondsAgo > facts.maxIoSilenceSeconds) {
    return {
      ok: false,
      reason: `nothing from ${link.primary} for ${link.lastIoSecondsAgo ?? "?"} s (more than ${facts.maxIoSilenceSeconds} s)`,
    };
  }
  return { ok: true, reason: `replica of ${link.primary}, link up` };
}

export function checkHealth(facts: RoleFacts): CheckAnswer {
  return facts.dbUp
    ? { ok: true, reason: "the database answers" }
    : { ok: false, reason: "the database does not answer" };
}

export function runCheck(name: CheckName, facts: RoleFacts): CheckAnswer {
  switch (name) {
    case "primary":
      return checkPrimary(facts);
    case "replica":
      return checkReplica(facts);
    case "health":
      return checkHealth(facts);
  }
}
