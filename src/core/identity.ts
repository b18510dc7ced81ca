/**
 * Database identity: whether a database that came back as a new process (another `run_id`) may
 * serve, or restarted without its data and must be fenced until it follows the shard's primary
 * (guarantee 5, docs/agent.md#database-identity).
 */

import type { Heartbeat, Role, Topology } from "./model.ts";

/** What the agent read of its database at one cycle. */
export interface DatabaseIdentity {
  readonly runId: string;
  readonly replId: string;
  readonly offset: number;
  readonly role: Role;
  /** Replicas attached with a completed sync. */
  readonly synced: number;
  /**
   * The earlier lineage its data continues (Redis `master_replid2`, up to `second_repl_offset` - 1):
   * a promoted replica's old primary's, or its own from before a restart from its RDB.
   */
  readonly prior?: { readonly replId: string; readonly offset: number } | undefined;
}

export interface RestartContext {
  /** The topology names this node as the primary. */
  readonly named: boolean;
  /** The primary's stored replica set. */
  readonly guardMembers: readonly string[];
  /**
   * What the shard's other nodes hold by their last stored heartbeats (the agent's last shard
   * snapshot), whatever their age or membership (`peerPointOf`).
   */
  readonly others: readonly PeerPoint[];
  /**
   * `previous` was itself a process the agent fenced as restarted without its data, and the node
   * has not followed a primary since: continuing it is no proof of holding the shard's data (it
   * holds at most what that process held). Simulator seed 420283. @default false
   */
  readonly fenced?: boolean;
}

/** What another node of the shard holds by its stored heartbeat, and whether its database answered. */
export interface PeerPoint extends ReplicationPoint {
  /**
   * Its database answered at that report: parked from this node, it probes it and reports it
   * restarted unless it holds this node's data directly (`holdsAllOf`), and the controller
   * counts that vote.
   */
  readonly answering: boolean;
}

export type RestartVerdict =
  | { readonly kind: "same" }
  | {
      readonly kind: "harmless";
      readonly continues: boolean;
      readonly reason: string;
      /**
       * The verdict rests on what the other nodes reported (\`RestartContext.others\`): it
       * continues what they hold, or none of them holds the old process's data. Reports read before
       * the restart, or none read yet, may not show what a replica acknowledged since.
       */
      readonly onReports?: boolean;
    }
  | { readonly kind: "lost-data"; readonly reason: string };

/** Judges a database read `current` after `previous` (the last read before it). */
export function judgeRestart(
  previous: DatabaseIdentity | undefined,
  current: DatabaseIdentity,
  context: RestartContext,
): RestartVerdict {
  if (previous === undefined || previous.runId === current.runId) return { kind: "same" };
  // The same lineage at least as far as the last read; for the primary the topology names, also
  // the old one continued from at least as far under a new id (Redis 7 restarting a master from
  // its RDB takes a new replid and keeps the RDB's as `master_replid2`: sim seeds 7002, 7006, 7013,
  // offline to the end with every node holding every write). A deposed primary steps down either
  // way; fenced and reported restarted, it stays out of the controller's votes as before. And every
  // write another node sharing its data reports holding. The last read may be a cycle older than
  // the death: an RDB saved between the two lacks writes a replica may have acknowledged and
  // reported since (sim seed 8049: RDB at 106,032, last read 105,312, the parked replicas at
  // 106,080). A node whose database answers must find its data held as its own probe judges
  // (`holdsAllOf`, one earlier lineage deep): on the lineage the old process was promoted from, it
  // would report the new process restarted, and the controller replace it by a node without the
  // writes it took since (seed 9034 of a restart-heavy schedule: 553 lost). For a node whose
  // database is down, holding it through the old process is enough (seed 7013: the old primary
  // down on the lineage its successor was promoted from).
  const lineageHeld = context.named
    ? holdsEveryWrite(current, previous)
    : current.replId === previous.replId && current.offset >= previous.offset;
  // A process fenced as restarted without its data is continued by nothing: a new process on its
  // lineage (an RDB it saved, a restart from its own empty dataset) holds at most what it held,
  // which is what the fence was for. Only following the shard's primary lifts it (guarantee 5).
  // Simulator seed 420283 (2,281 acknowledged writes lost): n2's primary process restarted from an
  // old RDB, then empty, both fenced; its supervisor then restarted it from the empty process's RDB
  // (Redis 7 keeps the RDB's id as `master_replid2`, offset 0), judged "it continues" the empty
  // process, and the agent opened it while n3, parked, held every acknowledged write.
  // A master's replication id names one master lifetime: Redis gives a master a new id whenever it
  // starts (empty or from its RDB) and on every promotion. A primary answering on the id its last
  // read was a primary on, at least as far, is that lifetime, whatever its run id says (an agent
  // restarted without its state judges against its node's stored report, with no run id): it lost
  // nothing, and a peer ahead on that id got those writes from it after the read (a replica's
  // report written after the agent's INFO read; PINGs alone move the offset). Nemesis seed 7336
  // (guarantees 5 then 1, ~236 acknowledged writes lost): node-169a's agent, restarted with a
  // wiped state dir, fenced its primary, 21 KB ahead of its report on the same id, as "restarted
  // without its data"; node-3 was promoted at the report's offset and both replicas resynced.
  const sameLifetime =
    previous.role === "primary" &&
    current.role === "primary" &&
    previous.replId !== "" &&
    current.replId === previous.replId &&
    current.offset >= previous.offset;
  const continues =
    context.fenced !== true &&
    lineageHeld &&
    (sameLifetime ||
      context.others.every(
        (other) =>
          !holdsSomeOf(other, previous) ||
          holdsAllOf(current, other) ||
          (!other.answering && holdsAllOf(previous, other)),
      ));
  const harmless = (reason: string): RestartVerdict => ({ kind: "harmless", continues, reason });
  if (continues)
    return { kind: "harmless", continues, reason: "it continues its replication lineage", onReports: true };
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
  // Without another node holding the data, fencing would only stop writes. Members of the replica
  // set hold it, and so do the replicas attached to the old process when it was last read, members
  // or not (not yet stored on a new shard; or gone from the set while hung, still holding every
  // write they acknowledged), and any node whose stored heartbeat is on the old process's lineage
  // or the one it continued, however old the heartbeat, member or not (sim seed 7011: a primary
  // promoted with an empty set restarted empty while a parked replica held every write): serving
  // the empty dataset would feed it to them in a full sync. Fenced, the node is failed over (to a
  // member), or the shard goes offline and comes back on the node with the lineage (the offline
  // path does not ask for membership).
  const othersHoldData =
    context.guardMembers.length > 0 ||
    previous.synced > 0 ||
    context.others.some((other) => holdsSomeOf(other, previous));
  if (!othersHoldData)
    return { kind: "harmless", continues, reason: "no other node holds its data", onReports: true };
  return {
    kind: "lost-data",
    reason:
      context.fenced === true && lineageHeld
        ? "the database restarted again before following the shard's primary: it continues only a process that had restarted without its data"
        : "the database restarted without continuing its replication lineage (its data may be gone)",
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
  return holdsEveryWrite(holder, data);
}

/**
 * A fact of the shard's lineage history: the lineage \`by\` continues \`repl_id\` up to offset
 * \`until\` (a node promoted at that offset: Redis's \`master_replid2\` and \`second_repl_offset\` - 1
 * in its first report as primary). The controller records one per change of primary
 * (\`topology.ancestry\`); Redis itself shows one earlier lineage only.
 */
export interface LineageLink {
  readonly repl_id: string;
  readonly until: number;
  readonly by: string;
}

/** The most links \`topology.ancestry\` keeps: the oldest go first. */
export const MAX_LINEAGE_LINKS = 32;

/** \`links\` with \`link\` appended (once: a link already there is not repeated), the oldest dropped past the bound. */
export function appendLink(links: readonly LineageLink[], link: LineageLink): LineageLink[] | undefined {
  if (link.repl_id === "" || link.by === "" || link.repl_id === link.by) return undefined;
  if (
    links.some(
      (known) => known.repl_id === link.repl_id && known.by === link.by && known.until === link.until,
    )
  )
    return undefined;
  return [...links, link].slice(-MAX_LINEAGE_LINKS);
}

/**
 * \`links\` with a promotion's own link (\`promoted\`: the new primary's lineage continues its
 * \`prior_lineage\` up to that offset), preceded by the target's link at the decision
 * (\`failover.target_link\`) when the promoted database continues that lineage; undefined when
 * there is nothing new to record. Shared by the completion of a change
 * (src/controller/transitions.ts \`ancestryAfter\`) and the offline mark of a continuation whose
 * target died after its PROMOTE (src/core/decide/retarget.ts \`promotedAncestry\`).
 */
export function promotionAncestry(
  links: readonly LineageLink[],
  targetLink: LineageLink | undefined,
  promoted: LineageLink,
): LineageLink[] | undefined {
  const withTarget =
    targetLink !== undefined && targetLink.by === promoted.repl_id
      ? appendLink(links, targetLink)
      : undefined;
  return appendLink(withTarget ?? links, promoted) ?? withTarget;
}

/**
 * The lineage link a heartbeat shows (its \`repl_id\` continues its \`prior_lineage\` up to that
 * offset), when its database answers: a restarted holder's \`repl_id\` is the dead process's.
 */
export function reportedLink(heartbeat: Heartbeat | undefined): LineageLink | undefined {
  const prior = heartbeat?.prior_lineage;
  if (heartbeat === undefined || prior === undefined || heartbeat.db_status !== "up") return undefined;
  if (prior.repl_id === "" || heartbeat.repl_id === "" || prior.repl_id === heartbeat.repl_id)
    return undefined;
  return { repl_id: prior.repl_id, until: prior.last_txn_id, by: heartbeat.repl_id };
}

/**
 * The link by which \`continued\` (the lineage a promoted database continues: its \`prior_lineage\`)
 * continues the plan's lineage \`planLineage\`, as any answering database's report shows it
 * (\`reportedLink\`; the highest offset shown: a replica that continued partially onto an id may
 * show a lower one), or undefined. Every process on one replication id shows the same earlier
 * lineage, so the link is a fact of Redis whoever reports it. A retarget's new target that was
 * pointed at the earlier target continues onto the id the earlier target's late PROMOTE gave it, so
 * its own promotion continues that id, not the plan's: the link from the plan's lineage is in the
 * earlier target's report (or its replicas'), not the new target's (its \`target_link\` at the
 * replan named nothing).
 * Without it a database on the plan's lineage, parked, finds the final primary neither holding its
 * data nor superseding it and stays parked for good (simulator seed 325407).
 */
export function bridgingLink(
  reports: readonly Heartbeat[],
  planLineage: string | undefined,
  continued: string,
): LineageLink | undefined {
  if (planLineage === undefined || planLineage === "" || planLineage === continued) return undefined;
  let best: LineageLink | undefined;
  for (const report of reports) {
    const link = reportedLink(report);
    if (link === undefined || link.repl_id !== planLineage || link.by !== continued) continue;
    if (best === undefined || link.until > best.until) best = link;
  }
  return best;
}

/**
 * \`holdsAllOf\` through the shard's recorded lineage history: \`data\`'s writes, on a lineage
 * older than any \`holder\` shows (a database restarted from an RDB saved before a later promotion:
 * simulator seed 52256, a replica parked for good), are held by \`holder\` when a chain of links
 * leads from that lineage, each at or past the offset reached, to a lineage \`holder\` holds that far.
 */
export function holdsThroughLinks(
  holder: ReplicationPoint,
  data: ReplicationPoint,
  links: readonly LineageLink[],
): boolean {
  if (holdsAllOf(holder, data)) return true;
  let points: Array<{ replId: string; offset: number }> = [{ replId: data.replId, offset: data.offset }];
  if (data.prior !== undefined && data.offset <= data.prior.offset) points.push({ ...data.prior });
  const seen = new Set<string>();
  // Each step follows one link; a chain never needs more steps than there are links.
  for (let step = 0; step < links.length && points.length > 0; step++) {
    points = points.flatMap((point) =>
      links
        .filter((link) => link.repl_id === point.replId && link.until >= point.offset && link.repl_id !== "")
        .filter((link) => !seen.has(`${link.by}:${link.until}`) && seen.add(`${link.by}:${link.until}`))
        .map((link) => ({ replId: link.by, offset: link.until })),
    );
    if (points.some((point) => holdsEveryWrite(holder, { replId: point.replId, offset: point.offset })))
      return true;
  }
  return false;
}

/**
 * How far a database at \`point\` holds \`lineage\` (a replication id and the highest offset known of
 * it) through the shard's lineage history \`links\`, when its own replication id is not that one;
 * undefined when no chain joins them. Only the shard's main line counts: from a lineage, each step
 * takes the latest link that continues it, recorded after the step before (a branch given up later,
 * a promotion that did not last, is not the shard's history).
 * - \`point\` on a later lineage of that line: its own offset when every link on the way is at or
 *   past \`lineage\`'s offset (offsets run on across a promotion: it holds all of \`lineage\` and what
 *   came after), else the least link's offset (the writes of \`lineage\` past it are not in its data).
 *   Nemesis seed 5805: the replica that alone held 330 acknowledged writes had full-synced from a
 *   primary promoted after the lineage the offline mark kept; judged foreign, it resynced from a
 *   stale node.
 * - with \`ancestors\`, \`point\` on an earlier lineage from which the line leads to \`lineage\` (a
 *   database restarted from an RDB older than a later promotion): the lesser of its offset and the
 *   least link's offset on the way, the part of \`lineage\`'s history its data holds (ranked and
 *   bounded by the lag like any candidate: the last resort's caller).
 */
export function heldThroughLinks(
  point: { readonly replId: string; readonly offset: number },
  lineage: { readonly replId: string; readonly offset: number },
  links: readonly LineageLink[],
  ancestors = false,
): number | undefined {
  if (point.replId === "" || lineage.replId === "" || point.replId === lineage.replId) return undefined;
  const later = alongMainLine(lineage.replId, point.replId, links);
  if (later !== undefined) return lineage.offset <= later ? point.offset : Math.min(later, point.offset);
  if (!ancestors) return undefined;
  const earlier = alongMainLine(point.replId, lineage.replId, links);
  return earlier === undefined ? undefined : Math.min(earlier, point.offset);
}

/**
 * A full sync of \`replica\` from \`source\` would replace writes the shard never gave up: \`source\`
 * does not hold them (\`holdsThroughLinks\`), and it is not on a later lineage of the shard's main
 * line from the replica's (or the replica's earlier) lineage. A source on such a later lineage
 * took over from it by a recorded promotion: what the replica holds past that point is a branch the
 * shard left (the tail a dead primary took unacknowledged), and following the source drops it as
 * any failover does. A replica holding nothing is never at risk. Simulator seed 7032: a replica
 * restarted from its RDB with its config's \`replicaof\` of a node on an unrecorded lineage.
 */
export function syncWouldDestroy(
  source: ReplicationPoint,
  replica: ReplicationPoint,
  links: readonly LineageLink[],
): boolean {
  if (replica.offset <= 0 || holdsThroughLinks(source, replica, links)) return false;
  const sourceLineages = [source.replId, source.prior?.replId].filter((id): id is string => id !== undefined);
  const replicaLineages = [replica, replica.prior].filter((point) => point !== undefined);
  const later = sourceLineages.some((replId) =>
    replicaLineages.some(
      (lineage) => heldThroughLinks({ replId, offset: source.offset }, lineage, links) !== undefined,
    ),
  );
  return !later;
}

/**
 * The replication ids the shard's record names as its data's (\`recordedLineages\`): both ends of
 * every link of its lineage history (\`topology.ancestry\`), the lineage an offline shard keeps
 * (\`topology.lineage\`, which \`shardguard recover\` sets to the node it names), and the lineage
 * and target link of a change under way (\`topology.failover\`). A process restarted empty takes
 * a fresh id that none of these names and continues none; a node the controller chose is on an id
 * they name, or continues one (promoted: its new id continues the one it was chosen on).
 */
export function recordedLineages(topology: Topology | undefined): ReadonlySet<string> {
  const ids = new Set<string>();
  for (const link of topology?.ancestry ?? []) ids.add(link.repl_id).add(link.by);
  const failover = topology?.failover;
  for (const id of [
    topology?.lineage?.repl_id,
    failover?.lineage?.repl_id,
    failover?.target_link?.repl_id,
    failover?.target_link?.by,
  ])
    if (id !== undefined) ids.add(id);
  ids.delete("");
  return ids;
}

/** Whether the agent points its database at a primary the topology or a command names (\`judgeFollow\`). */
export type FollowVerdict =
  | { readonly kind: "follow" }
  /** Not yet: the target did not answer its INFO; the database is parked from it, its probe watching it. */
  | { readonly kind: "unanswered"; readonly reason: string }
  /** Never this process: the database is parked instead, as the probe parks it. */
  | { readonly kind: "refuse"; readonly reason: string };

/**
 * Guarantee 1: whether the agent may issue \`REPLICAOF\` of \`target\` (its INFO read just before,
 * undefined when it did not answer) to its own database holding \`mine\` (a replica, parked or
 * not, or a primary stepping down), on a decision the topology or a controller's command names.
 * The decision was right when made, but the process answering at that address may have restarted
 * empty since: simulator seed 7039 (n3, promoted at epoch 6, restarted empty; fenced by its agent
 * it refused clients but stayed a master; parked n2 and the woken old primary n1 both full-synced
 * from it, 2,867 replica-acknowledged writes lost) and queued-replicaof-empty.test.ts (a parked
 * replica's queued \`REPLICAOF\` applied after its target restarted empty: 1,000 of 1,000).
 *
 * Refused (\`refuse\`), all four together, the signature of an accidental empty restart:
 * - the full sync would destroy writes the shard never gave up (\`syncWouldDestroy\`: the target
 *   neither holds them nor took over from them by a recorded promotion);
 * - the target shares none of this database's data (\`holdsSomeOf\`): a target on its lineage, or
 *   on the one it continues, is a branch of the shard's line the controller ranked (the last
 *   resort's node restarted from its RDB holds the lineage as its earlier one), and a process
 *   restarted from an older RDB is its own agent's and the controller's to judge;
 * - the target stands behind it: offsets run on across promotions, and a process restarted empty
 *   starts at 0 (hunt seeds 7001, 7002: a target far ahead on a lineage the bounded history no
 *   longer joins is where the shard moved on);
 * - the target's replication id, and the one its data continues, are none the shard's record
 *   names (\`recordedLineages\`): a deliberate choice of a node holding less (the last resort on an
 *   earlier lineage of the main line, \`shardguard recover\` on another lineage) is stored before
 *   any node is told to follow it, and must still be followed (guarantee 3). Promoted, the chosen
 *   replica takes a new id that continues the recorded one (Redis's \`master_replid2\`); the
 *   shard's history records the new id only when the change completes, after the repoint.
 * A target that did not answer is not followed (\`unanswered\`) by a database holding data: Redis
 * could not sync from it either, and pointed at it unjudged the replica would full-sync from
 * whatever process answers there first, the agent's probe judging only processes it never pointed.
 * The database is parked from it instead, as the probe parks a replica whose primary is silent,
 * and followed by the probe once the process there holds its data. A database holding nothing has
 * nothing to lose and always follows.
 */
export function judgeFollow(
  target: ReplicationPoint | undefined,
  mine: ReplicationPoint,
  links: readonly LineageLink[],
  recorded: ReadonlySet<string>,
): FollowVerdict {
  if (mine.offset <= 0) return { kind: "follow" };
  if (target === undefined)
    return { kind: "unanswered", reason: "the target's database did not answer INFO" };
  if (
    !syncWouldDestroy(target, mine, links) ||
    holdsSomeOf(target, mine) ||
    target.offset >= mine.offset ||
    recorded.has(target.replId) ||
    (target.prior !== undefined && recorded.has(target.prior.replId))
  )
    return { kind: "follow" };
  return {
    kind: "refuse",
    reason:
      `the target (replication id ${target.replId} at ${target.offset}` +
      `${target.prior === undefined ? "" : `, continuing ${target.prior.replId} to ${target.prior.offset}`}) ` +
      `holds none of this database's data (${mine.replId} at ${mine.offset}` +
      `${mine.prior === undefined ? "" : `, continuing ${mine.prior.replId} to ${mine.prior.offset}`}), ` +
      "stands behind it on a lineage the shard's record does not name: a full sync would destroy it",
  };
}

/**
 * A park is over: the primary it was parked from holds the parked database's data again, through
 * the shard's recorded history (\`holdsThroughLinks\`), or took over from it by a recorded promotion
 * (\`supersededBy\`: what the database holds past that point is a deposed primary's tail). Only a
 * primary counts (a replica serves no sync while its own link is down). The probe's rule for a
 * parked replica (src/agent/primary-probe.ts), and the agent's for a parked database that
 * restarted as a master from its RDB, which no probe watches (src/agent/topology-read.ts).
 */
export function parkOutgrown(
  primary: ReplicationPoint & { readonly role: string },
  mine: ReplicationPoint,
  links: readonly LineageLink[],
): boolean {
  return (
    primary.role === "primary" &&
    (holdsThroughLinks(primary, mine, links) || supersededBy(primary, mine, links))
  );
}

/**
 * \`source\`'s own lineage took over from \`replica\`'s by a recorded promotion (a later lineage of
 * the shard's main line, \`topology.ancestry\`): whatever the replica holds of its lineage past that
 * point is the tail of a primary the shard left (taken while its successor was chosen, never
 * acknowledged by the replica the controller promoted), and following the source drops it as the
 * failover's step-down does. Narrower than \`syncWouldDestroy\`'s \`later\`: only the source's
 * current lineage counts (not its \`prior\`: a process restarted from an older RDB of that lineage
 * takes a new id, and the links name none), and only the replica's own lineage (or the one it
 * continues while it took nothing since). Simulator seeds 281090, 280962, 281137: a deposed
 * primary, woken from a hang with a tail its successor lacks, stepped down to it, was parked by a
 * partition before its first sync, and stayed parked at that epoch to the end.
 */
export function supersededBy(
  source: ReplicationPoint,
  replica: ReplicationPoint,
  links: readonly LineageLink[],
): boolean {
  if (source.replId === "" || replica.replId === "") return false;
  const lineages: ReplicationPoint[] = [{ replId: replica.replId, offset: replica.offset }];
  if (replica.prior !== undefined && replica.offset <= replica.prior.offset)
    lineages.push({ ...replica.prior });
  return lineages.some(
    (lineage) =>
      heldThroughLinks({ replId: source.replId, offset: source.offset }, lineage, links) !== undefined,
  );
}

/** The least \`until\` on the main line from lineage \`from\` to lineage \`to\`; undefined when the line does not reach it. */
function alongMainLine(from: string, to: string, links: readonly LineageLink[]): number | undefined {
  let at = from;
  let least = Number.POSITIVE_INFINITY;
  let after = -1;
  // Each step takes a link recorded after the one before: the line ends within links.length steps.
  while (after < links.length - 1) {
    let index = -1;
    for (let i = links.length - 1; i > after; i--) {
      if (links[i]?.repl_id === at) {
        index = i;
        break;
      }
    }
    const link = links[index];
    if (link === undefined) return undefined;
    least = Math.min(least, link.until);
    if (link.by === to) return least;
    at = link.by;
    after = index;
  }
  return undefined;
}

/**
 * \`holdsAllOf\` without its empty-database rule: `holder` continues `data`'s lineage (or the one
 * `data` continues, while it took nothing since) at least as far. A restarted database continues
 * the old process only so: an offset of 0 is no proof of an empty dataset (a Redis primary
 * counts no offset before its first replica attached).
 */
function holdsEveryWrite(holder: ReplicationPoint, data: ReplicationPoint): boolean {
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

/**
 * `other` may hold some of `data`'s writes: it is past the start of `data`'s lineage or of the
 * one `data` continues, on it directly or as its own earlier lineage.
 */
export function holdsSomeOf(other: ReplicationPoint, data: ReplicationPoint): boolean {
  const lineages = [data.replId, data.prior?.replId].filter((id) => id !== undefined && id !== "");
  const on = (replId: string, offset: number): boolean => offset > 0 && lineages.includes(replId);
  return (
    on(other.replId, other.offset) ||
    (other.prior !== undefined && on(other.prior.replId, other.prior.offset))
  );
}

/**
 * The earlier lineage a replica's data continues by its primary's report rather than its own: a
 * replica that full-synced from a primary whose replication id continues an earlier lineage (a
 * promoted node, a primary restarted from its RDB under a new id) takes that id and, as every full
 * sync does, an empty \`master_replid2\`. Its data is the primary's id up to its own offset, and
 * that id continues \`prior\` up to \`prior.offset\`: so does the replica's, while it stays on
 * \`on\`. Without it a parked replica finds a later primary holding all of its data neither
 * continuing nor superseding it and stays parked for good (simulator seeds 343143, 372957), and the
 * controller takes it for foreign to the shard's lineage (seed 7046).
 */
export interface RememberedPrior {
  /** The replication id the replica's data and its primary's share. */
  readonly on: string;
  /** What that id continues: the primary's \`master_replid2\` and \`second_repl_offset\` - 1. */
  readonly prior: { readonly replId: string; readonly offset: number };
}

/**
 * What a replica remembers of the earlier lineage its data continues after one probe of its
 * primary: the primary's own earlier lineage when the replica is \`linked\` (its link up, not
 * parked) on the primary's current replication id, else what it remembered while it is still on
 * that id; nothing once it left it. Every process on one replication id shows the same earlier
 * lineage or none (an id continues one lineage, from the offset it started at; a replica that
 * continued partially onto it may show a lower offset of it): the highest offset shown is kept.
 */
export function rememberPrior(
  remembered: RememberedPrior | undefined,
  mine: ReplicationPoint,
  primary: ReplicationPoint,
  linked: boolean,
): RememberedPrior | undefined {
  if (mine.replId === "") return undefined;
  const kept = remembered?.on === mine.replId ? remembered : undefined;
  const shown = primary.prior;
  if (
    !linked ||
    primary.replId !== mine.replId ||
    shown === undefined ||
    shown.replId === "" ||
    shown.replId === mine.replId
  )
    return kept;
  if (kept !== undefined && kept.prior.replId === shown.replId && kept.prior.offset >= shown.offset)
    return kept;
  return { on: mine.replId, prior: { replId: shown.replId, offset: shown.offset } };
}

/**
 * \`point\` with the earlier lineage its data continues: its own (Redis's \`master_replid2\`), else
 * the one \`remembered\` while it is on that id, no further than its own offset (an id starts where
 * its earlier lineage ends: a database on it holds at least that much).
 */
export function withRememberedPrior<T extends ReplicationPoint>(
  point: T,
  remembered: RememberedPrior | undefined,
): T {
  if (point.prior !== undefined || remembered === undefined) return point;
  if (point.replId === "" || remembered.on !== point.replId) return point;
  return {
    ...point,
    prior: { replId: remembered.prior.replId, offset: Math.min(remembered.prior.offset, point.offset) },
  };
}

/** A heartbeat's replication point as it reports it (`repl_id`, `last_txn_id`, `prior_lineage`). */
export function reportedPointOf(node: Heartbeat): ReplicationPoint {
  const prior = node.prior_lineage;
  return {
    replId: node.repl_id,
    offset: node.last_txn_id,
    prior: prior === undefined ? undefined : { replId: prior.repl_id, offset: prior.last_txn_id },
  };
}

/**
 * What a stored heartbeat says its node's database holds. A database its agent keeps fenced
 * after a restart (`db_status: down`, a `restarted` crash report) holds only the earlier lineage
 * its new process continues (its RDB's), if any: the heartbeat's `repl_id` and `last_txn_id` are
 * the dead process's.
 */
export function peerPointOf(node: Heartbeat): PeerPoint {
  const answering = node.db_status === "up";
  const reported = reportedPointOf(node);
  if (answering || node.db_crash?.state !== "restarted") return { ...reported, answering };
  return reported.prior === undefined
    ? { replId: "", offset: 0, answering }
    : { ...reported.prior, answering };
}
