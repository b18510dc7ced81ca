import { agentWrittenAt } from "../freshness.ts";
import type { Heartbeat } from "../model.ts";
import type { Decision, NoActionCode } from "./decision.ts";
import {
  agentAgeMs,
  describeAgentAge,
  describeHeartbeatAge,
  guardMembers,
  type NodeView,
  type ShardView,
} from "./view.ts";

/**
 * A wait or refusal rule of the decision. A decision walks its status's ordered gate list; the
 * first gate whose test returns a reason is the answer (no action, with that code and reason).
 * docs/safety.md lists every gate by name with the guarantee it protects and the test that
 * shows why it exists; a unit test keeps the two lists equal.
 */
export interface Gate<V> {
  /** Unique across all lists; the gate's row in docs/safety.md. */
  readonly name: string;
  readonly code: NoActionCode;
  /** The guarantees of /work/shared/DESIGN.md ("Guarantees") the gate protects, by number. */
  readonly invariant: readonly Guarantee[];
  /** Whether the primary's heartbeat counts as stale when this gate stops the decision. */
  readonly primaryStale: boolean | ((view: V) => boolean);
  readonly test: (view: V) => string | undefined;
  /** The nodes asked to report (`awaiting_reports` only). */
  readonly awaiting?: (view: V) => readonly string[];
}

/** 1 acknowledged writes survive, 2 one writable primary, 3 availability, 4 no stale plan, 5 identity, 6 least privilege. */
export type Guarantee = 1 | 2 | 3 | 4 | 5 | 6;

/** The first gate that fires, as a decision; undefined when every gate lets the decision through. */
export function firstGate<V>(gates: readonly Gate<V>[], view: V): Decision | undefined {
  for (const gate of gates) {
    const reason = gate.test(view);
    if (reason === undefined) continue;
    const primaryStale =
      typeof gate.primaryStale === "function" ? gate.primaryStale(view) : gate.primaryStale;
    return gate.awaiting === undefined
      ? { kind: "none", code: gate.code, primaryStale, reason }
      : { kind: "none", code: gate.code, primaryStale, awaiting: gate.awaiting(view), reason };
  }
  return undefined;
}

/**
 * Failure timeouts a stale replica further ahead than the best candidate is waited for before a
 * failover goes ahead without it (its acknowledged writes would be lost; gate `replica_ahead`).
 */
export const REPLICA_AHEAD_GRACE = 3;

/**
 * The value the graces above had as one constant; kept for callers that name it (the
 * decision's tests). A change to one grace is a change of the gate that uses it.
 */
export const AHEAD_GRACE = REPLICA_AHEAD_GRACE;

/**
 * Failure timeouts an offline shard waits before it promotes a node that holds its lineage only
 * as its earlier one (`prior_lineage`: a database restarted from its RDB): 90 s at the default
 * 3 s timeout, longer than Redis's 60 s `repl-timeout`. Sooner, a hung primary or a replica cut
 * off could still come back with writes the snapshot lacks (gate `no_eligible_node`).
 */
export const LAST_COPY_GRACE = 30;

/**
 * Failure timeouts a hung node of the lineage with more than the last resort (its database down
 * without a confirmed crash) is waited for after its agent's last report (gate `hung_holder`).
 */
export const HUNG_HOLDER_GRACE = LAST_COPY_GRACE;

/** The gates every status passes first. */
export const ENTRY_GATES: readonly Gate<ShardView>[] = [
  {
    name: "topology_malformed",
    code: "inconsistent_topology",
    // Fail closed: an unreadable topology is not "no topology yet", which would adopt a primary.
    invariant: [2, 4],
    primaryStale: false,
    test: ({ snapshot }) => {
      const broken = snapshot.malformed.find((item) => item.sk === "TOPOLOGY");
      return broken === undefined
        ? undefined
        : `the topology item is malformed (${broken.field}: ${broken.reason}); no automatic action until an operator repairs it`;
    },
  },
  {
    name: "legacy_layout",
    code: "legacy_layout",
    // The topology sits where agents can write it; acting on it would obey a forgery.
    invariant: [6],
    primaryStale: false,
    test: ({ snapshot }) =>
      snapshot.legacyTopology
        ? `laid out by an older installation (topology, heartbeats or replica sets in SHARD#${snapshot.shard}, where every node's credentials write); no automatic action, no failover, until an operator upgrades every agent of the shard and runs \`shardguard migrate-layout --shard ${snapshot.shard}\` with administrator or controller-role credentials (docs/deploy.md#upgrading-to-node-partitions)`
        : undefined,
  },
  {
    name: "paused",
    code: "paused",
    // The operator's maintenance mode: no automatic change of primary while it holds.
    invariant: [2],
    primaryStale: false,
    test: ({ topology }) =>
      topology?.status === "paused"
        ? `shard paused${topology.paused_reason ? `: ${topology.paused_reason}` : ""}`
        : undefined,
  },
];

/** The cool-down after a change of primary, for a shard online or offline. */
export function cooldownReason(view: ShardView, primaryStale: boolean): string | undefined {
  const until = view.topology?.cooldown_until;
  if (until === undefined || view.now >= until) return undefined;
  return (
    `in cool-down for ${until - view.now} ms more after the last change of primary` +
    (primaryStale ? "; the primary's heartbeat is stale but no automatic action is taken" : "")
  );
}

/** The ids of quiet nodes the controller asks to report, sorted. */
export function quietIds(quiet: readonly Heartbeat[]): string[] {
  return quiet.map((node) => node.node_id).sort();
}

/** Why a decision waits for quiet nodes' reports (`awaiting_reports`). */
export function awaitingReason(quiet: readonly Heartbeat[], context: string, now: number): string {
  return `${context}; waiting for ${quietIds(quiet).join(", ")} to report: quiet within their keepalive, or heard on an old database answer (${quiet
    .map(
      (node) =>
        `${node.node_id} heard ${describeAgentAge(node, now)}, database answered ${describeHeartbeatAge(node, now, "ago")}, keepalive ${node.keepalive_ms ?? 0} ms`,
    )
    .sort()
    .join("; ")}), too old to vote or be ranked on`;
}

/** A member of the old primary's stored replica set whose agent's report is neither fresh nor current. */
export interface UnheardMember {
  readonly node_id: string;
  /** Its last stored heartbeat; undefined when none is stored. */
  readonly heartbeat: Heartbeat | undefined;
}

/**
 * The members of \`primaryId\`'s stored replica set under the write guard (\`guardMembers\`; every
 * set the agent writes is versioned, one written before the guard is not counted) other than \`exclude\`
 * whose agent is unheard: no heartbeat, or one whose last report is past its keepalive plus the
 * failure timeout (a member quiet within its keepalive is gate \`quiet_replicas\`'s). Its database
 * may still replicate and acknowledge writes (an agent killed by the OOM killer, an AZ split that
 * cut it from the store but not from the primary): what it holds is unknown, and may be writes
 * no other node has. Gates \`member_unheard\` and \`member_unheard_offline\`.
 */
export function unheardMembers(
  view: ShardView,
  primaryId: string | undefined,
  exclude: string,
): UnheardMember[] {
  const members = guardMembers(view.snapshot, primaryId) ?? [];
  return members
    .filter((id) => id !== primaryId && id !== exclude)
    .map((id) => ({ id, node: view.nodes.find((node) => node.heartbeat.node_id === id) }))
    .filter(({ node }) => node === undefined || !node.current)
    .map(({ id, node }) => ({ node_id: id, heartbeat: node?.heartbeat }))
    .sort((a, b) => a.node_id.localeCompare(b.node_id));
}

/**
 * The replicas outside \`primaryId\`'s stored replica set under the guard (\`guardMembers\`; none
 * without one; members are \`unheardMembers\`'s) other than \`exclude\` whose agent is unheard (its last report past its
 * keepalive plus the failure timeout) and whose last report, written after the old primary's
 * agent's last one (any, when the primary left no heartbeat; compared as written, with no clock
 * allowance: an allowance held failovers whose follower had been dropped by that very report), followed
 * \`primaryId\` with its link up. The primary's agent demands every replica it sees acknowledging
 * (a named one joins the set, an unnamed one is an outsider) and records it in its next report;
 * a replica that followed it after that agent's last report may have resumed acknowledging while
 * nobody could record it (a member dropped for a moment, then the primary's agent killed: Redis
 * counts it in \`WAIT\` and in \`min-replicas-to-write\` all the same). Nemesis seed 4401 lost 139
 * acknowledged writes so. Gates \`follower_unheard\`, \`follower_unheard_offline\`,
 * \`follower_unheard_retarget\`.
 */
export function unheardFollowers(
  view: ShardView,
  primaryId: string | undefined,
  primary: Heartbeat | undefined,
  exclude: string,
): Heartbeat[] {
  return followersAfter(view, primaryId, primary, exclude)
    .filter(({ current }) => !current)
    .map(({ heartbeat }) => heartbeat);
}

/**
 * \`unheardFollowers\` and, besides, such followers whose agent is still heard, when they may be
 * what keeps the old primary writable: a report with the link up is no final offset (the replica
 * acknowledges on after it; a fresh-clone CI run promoted the member 0.9 s after such a report, past
 * a follower that had acknowledged 700 ms of writes the member lacked). The old primary's guard
 * asks at least as many acknowledgements as its set has members; the members its own fresh report
 * shows cut off from it (link down, another primary, database down) acknowledge none once they lag
 * past \`min-replicas-max-lag\`, so heard followers fewer than those cannot meet the guard for long
 * and are no reason to hold, unless a fresh one's probe found the primary taking writes: that shows
 * the guard met (within the lag window the cut members still count as good). Any unheard follower
 * holds, as before. The hold ends with a report of the link down or another primary, the old
 * primary's agent reporting, or the refusing-primary proof. Gates \`follower_unheard\`,
 * \`follower_unheard_retarget\`, and \`follower_unheard_offline\` for a member's promotion (a
 * deposing one catches up with the fenced old primary's final offset: unheard followers only).
 */
export function linkedFollowers(
  view: ShardView,
  primaryId: string | undefined,
  primary: Heartbeat | undefined,
  exclude: string,
): Heartbeat[] {
  const after = followersAfter(view, primaryId, primary, exclude);
  const all = after.map(({ heartbeat }) => heartbeat);
  if (all.length === 0 || after.some(({ current }) => !current)) return all;
  // A fresh follower whose probe found the primary taking writes shows its guard met, whatever the
  // count: Redis counts members cut off from it as good replicas for \`min-replicas-max-lag\` after
  // their last acknowledgement, so one linked replica alone meets \`WAIT 1\` meanwhile (nemesis
  // seed 7342, for a member: gate \`member_linked\`).
  if (
    !primaryHeardAsReplica(view, primaryId) &&
    after.some(({ heartbeat, fresh }) => fresh && heartbeat.primary_probe === "ok")
  )
    return all;
  const members = guardMembers(view.snapshot, primaryId) ?? [];
  const cut = view.nodes.filter(
    ({ heartbeat: node, heard }) =>
      heard &&
      members.includes(node.node_id) &&
      (node.db_status !== "up" || node.primary_node_id !== primaryId || node.primary_link !== "up"),
  );
  return all.length >= cut.length ? all : [];
}

/**
 * The members of \`primaryId\`'s stored replica set under the guard (\`guardMembers\`) other than
 * \`exclude\` whose fresh report follows it with the link up and whose probe found it taking writes
 * (\`primary_probe\` \`ok\`): a report with the link up is no final offset. The member acknowledges
 * on after it, and Redis counts members cut off from the primary as good replicas for
 * \`min-replicas-max-lag\` after their last acknowledgement, so one linked member alone meets \`WAIT 1\`
 * meanwhile. Nemesis seed 7342: node-114r, cut from the store and from node-2 and node-239r, took
 * 77 writes only node-261b acknowledged; node-239r was promoted on "2 of 3 fresh replicas report the
 * primary down" 1.4 s after the cut, past node-261b's earlier report. The hold ends when the member's
 * probe finds the primary refusing (\`fenced\`: its offset ranks, and the refusing-primary proof
 * applies) or its link or probe goes down (a down vote with a final offset). Gates
 * \`member_linked\`, \`member_linked_retarget\`, \`member_linked_offline\`.
 */
export function linkedMembers(view: ShardView, primaryId: string | undefined, exclude: string): Heartbeat[] {
  if (primaryHeardAsReplica(view, primaryId)) return [];
  const members = guardMembers(view.snapshot, primaryId) ?? [];
  return view.nodes
    .filter(
      ({ heartbeat: node, fresh }) =>
        fresh &&
        node.node_id !== primaryId &&
        node.node_id !== exclude &&
        members.includes(node.node_id) &&
        node.role === "replica" &&
        node.db_status === "up" &&
        node.primary_node_id === primaryId &&
        node.primary_link === "up" &&
        node.primary_probe === "ok",
    )
    .map(({ heartbeat }) => heartbeat)
    .sort((a, b) => a.node_id.localeCompare(b.node_id));
}

/**
 * The old primary's own fresh report shows its database a replica: it takes no write, so a node
 * linked to it acknowledges nothing past its report (the probe says \`ok\` of a reachable replica
 * too). A named primary in a replication cycle with its own replica is replaced, not waited for
 * (replication-cycle.test.ts, issue 30 finding 4).
 */
function primaryHeardAsReplica(view: ShardView, primaryId: string | undefined): boolean {
  return view.nodes.some(
    ({ heartbeat, fresh }) => fresh && heartbeat.node_id === primaryId && heartbeat.role === "replica",
  );
}

/** Why a change of primary waits for linked members (gates \`member_linked\`, \`member_linked_retarget\`, \`member_linked_offline\`). */
export function memberLinkedReason(linked: readonly Heartbeat[], primaryId: string): string {
  const each = linked.map(
    (node) =>
      `member ${node.node_id} of ${primaryId}'s replica set (its fresh report: following ${primaryId} with its link up, its probe found it taking writes, last_txn_id ${node.last_txn_id})`,
  );
  return (
    `${each.join("; ")}: it acknowledges ${primaryId}'s writes on past that report, so its offset is no final one;` +
    ` waiting for its probe to find ${primaryId} refusing every write (then its offset ranks) or for its link to drop` +
    " (nemesis seed 7342)"
  );
}

function followersAfter(
  view: ShardView,
  primaryId: string | undefined,
  primary: Heartbeat | undefined,
  exclude: string,
): NodeView[] {
  // Without a set under the guard nothing is "outside" it (as \`unheardMembers\`, nothing is waited for).
  const members = guardMembers(view.snapshot, primaryId);
  if (members === undefined) return [];
  const since = primary === undefined ? Number.NEGATIVE_INFINITY : agentWrittenAt(primary);
  return view.nodes
    .filter(
      ({ heartbeat: node }) =>
        node.node_id !== primaryId &&
        node.node_id !== exclude &&
        !members.includes(node.node_id) &&
        node.role === "replica" &&
        node.db_status === "up" &&
        node.primary_node_id === primaryId &&
        node.primary_link === "up" &&
        agentWrittenAt(node) > since,
    )
    .sort((a, b) => a.heartbeat.node_id.localeCompare(b.heartbeat.node_id));
}

/** Why a change of primary waits for unheard followers (gates \`follower_unheard\`, \`follower_unheard_offline\`, \`follower_unheard_retarget\`). */
export function followerUnheardReason(
  followers: readonly Heartbeat[],
  primaryId: string,
  now: number,
): string {
  const each = followers.map(
    (node) =>
      `${node.node_id}, outside ${primaryId}'s replica set, its agent last heard ${Math.max(0, Math.round(agentAgeMs(node, now) / 1000))} s ago` +
      ` (its agent's last report, after ${primaryId}'s agent's last: following ${primaryId} with its link up, last_txn_id ${node.last_txn_id})`,
  );
  return (
    `${each.join("; ")}: Redis counts it in WAIT and in the write guard, and ${primaryId}'s agent reported nothing since` +
    ` that could have demanded it; it may hold acknowledged writes no other node has, and a report with its link up is no final offset;` +
    ` waiting for its agent to report its link down or another primary (restart it if it is silent), for ${primaryId}'s agent to report, or for ${primaryId} to be found refusing every write` +
    " (docs/safety.md: after a primary failure, guarantee 3 assumes every replica's agent runs)"
  );
}

/**
 * Proof that \`candidate\` holds every write any member of \`primaryId\`'s set acknowledged, even
 * with members unheard: a fresh replica, linked to that primary on the candidate's lineage, probed
 * it and found it refusing every write (\`primary_probe\` \`fenced\`: its agent's fence, or fewer good
 * replicas than its guard asks for) at offset \`primary_probe_offset\`, and the candidate holds that
 * offset. A refusing primary sends no write past it, so no member holds one the candidate lacks.
 * Residual window (docs/safety.md): the primary takes writes again only if enough members turn good
 * between the probe's read and the promotion. Returns the proof's text, or undefined.
 */
export function candidateHoldsRefusingPrimary(
  view: ShardView,
  primaryId: string,
  candidate: { readonly node_id: string; readonly last_txn_id: number },
): string | undefined {
  const replId = view.nodes.find(({ heartbeat }) => heartbeat.node_id === candidate.node_id)?.heartbeat
    .repl_id;
  if (replId === undefined) return undefined;
  const witness = view.nodes
    .filter(
      ({ heartbeat: node, fresh }) =>
        fresh &&
        node.node_id !== primaryId &&
        node.role === "replica" &&
        node.primary_node_id === primaryId &&
        node.primary_link === "up" &&
        node.primary_probe === "fenced" &&
        node.primary_probe_offset !== undefined &&
        node.repl_id === replId &&
        candidate.last_txn_id >= node.primary_probe_offset,
    )
    .map(({ heartbeat }) => heartbeat)
    .sort((a, b) => (b.primary_probe_offset ?? 0) - (a.primary_probe_offset ?? 0))[0];
  if (witness === undefined) return undefined;
  return (
    `${witness.node_id}'s probe found ${primaryId} refusing every write at offset ${witness.primary_probe_offset},` +
    ` and ${candidate.node_id} holds ${candidate.last_txn_id}: no member of the set holds a write it lacks`
  );
}

/**
 * The replicas \`primary\`'s last report lists as acknowledging its writes that no node names (its
 * heartbeat's \`outsiders\`: databases without an agent), less those a heartbeat whose report still
 * stands now names by address (an agent started on one: its offset ranks). Redis counts them in
 * \`WAIT\` and in the write guard: they may hold writes no node with an agent has, and no failover
 * can rank or promote them. Gates \`outsider_unheard\` and \`outsider_unheard_retarget\`.
 */
export function unheardOutsiders(view: ShardView, primary: Heartbeat | undefined): string[] {
  const listed = primary?.outsiders ?? [];
  return listed
    .filter(
      (address) =>
        !view.nodes.some(
          ({ heartbeat, current }) =>
            current && heartbeat.node_id !== primary?.node_id && heartbeat.node_address === address,
        ),
    )
    .sort();
}

/** Why a change of primary waits for outsiders (gates \`outsider_unheard\`, \`outsider_unheard_retarget\`). */
export function outsiderUnheardReason(outsiders: readonly string[], primaryId: string): string {
  return (
    `${primaryId}'s last report lists replicas no node id names acknowledging its writes (${outsiders.join(", ")}):` +
    ` they may hold acknowledged writes no node with an agent has; waiting for ${primaryId}'s agent to report them gone,` +
    ` for an agent on each (then its offset ranks), or for ${primaryId} to be found refusing every write` +
    " (docs/safety.md: guarantee 1 assumes every replica that acknowledges has an agent)"
  );
}

/** Why a change of primary waits for unheard members (gates \`member_unheard\`, \`member_unheard_offline\`). */
export function memberUnheardReason(
  unheard: readonly UnheardMember[],
  primaryId: string,
  now: number,
): string {
  const each = unheard.map(({ node_id, heartbeat }) =>
    heartbeat === undefined
      ? `member ${node_id} of ${primaryId}'s replica set has no heartbeat stored`
      : `member ${node_id} of ${primaryId}'s replica set unheard for ${Math.max(0, Math.round(agentAgeMs(heartbeat, now) / 1000))} s` +
        ` (its agent's last report: last_txn_id ${heartbeat.last_txn_id}, keepalive ${heartbeat.keepalive_ms ?? 0} ms)`,
  );
  return (
    `${each.join("; ")}: it may hold acknowledged writes no other node has; waiting for its agent to report` +
    ` (restart it) or for ${primaryId}'s agent to drop it from the set` +
    " (docs/safety.md: after a primary failure, guarantee 3 assumes every member's agent runs)"
  );
}
