/**
 * The write guard: which writes a primary's own database accepts, as a pure function of what
 * the agent sees. One mechanism for every fence (docs/agent.md#the-replica-set-guard):
 *
 * - **guard**: `min-replicas-to-write` = the size of the primary's replica set plus every other
 *   replica acknowledging now (`outsiders`: no agent, an unknown or duplicate address): Redis counts
 *   every acknowledging replica, so only when the count includes them all does reaching it take
 *   every member, attached and acknowledging within `min-replicas-max-lag`. A promotion detaches its target
 *   from the old primary, so the old primary refuses writes within that lag, even when its agent
 *   is dead, hung or cut off, and even when the coordination store is down. Only members may be
 *   promoted (decide.ts), so every promotion removes a member.
 * - **fence**: refuse every write (`min-replicas-to-write` beyond reach) while the topology does
 *   not confirm this node, or (policies `fence`, and `failsafe` with no replica to witness) after
 *   `fenceTimeoutMs` without a heartbeat written. Under `failsafe` also when this agent alone lost
 *   the store: a majority of the replica set was seen reaching it since (`storeWitnesses`), so
 *   the controller can replace this primary, and will, once its replicas report it fenced.
 * - **open**: the operator's own settings (policy `keep-serving`, and `fence` while confirmed).
 *
 * The set only grows after the database already demands the new member, and only shrinks through
 * a store write conditioned on the topology still naming this primary (`removeWhilePrimary`), so
 * no failover can have picked a member the primary no longer counts.
 */

export const FENCE_POLICIES = ["failsafe", "fence", "keep-serving"] as const;
export type FencePolicy = (typeof FENCE_POLICIES)[number];

/** `min-replicas-to-write` that no shard reaches: every write gets NOREPLICAS, reads go on. */
export const FENCED_MIN_REPLICAS = 1_000_000;

/**
 * Whether a primary refuses every write: its agent's fence (`min-replicas-to-write` at
 * FENCED_MIN_REPLICAS), or fewer good replicas than `min-replicas-to-write` asks (Redis answers
 * `NOREPLICAS`; `goodReplicas` is INFO's `min_slaves_good_slaves`, absent when the guard is off).
 */
export function refusesWrites(minReplicasToWrite: number, goodReplicas: number | undefined): boolean {
  if (!Number.isFinite(minReplicasToWrite) || minReplicasToWrite <= 0) return false;
  if (minReplicasToWrite >= FENCED_MIN_REPLICAS) return true;
  return goodReplicas !== undefined && goodReplicas < minReplicasToWrite;
}

/**
 * `min-replicas-max-lag` under the guard, s. Replicas acknowledge once a second, so 2 s never
 * drops a healthy replica; a detached one stops counting within 3 s of its last acknowledgement
 * (Redis compares whole seconds), and the primary notices within 1 s more (its replication cron).
 */
export const GUARD_MAX_LAG_S = 2;

/**
 * Slack for a late replication cron on a loaded host, ms: Redis runs it once a second from its
 * event loop, after whatever command or fork is in progress.
 */
export const GUARD_CRON_SLACK_MS = 500;

/**
 * How long a promoted node refuses writes after its last contact with the old primary, ms. The old
 * primary counts it good while `unixtime - repl_ack_time <= min-replicas-max-lag` in whole seconds
 * (up to GUARD_MAX_LAG_S + 1 s after its last acknowledgement), and refreshes that count only in
 * its once-a-second replication cron (+1 s): measured up to 4,045 ms from the replica's stop to the
 * old primary's last accepted write (`npm run bench:guard-window`, 20 trials at load 16; issue 30,
 * finding 5). It was GUARD_MAX_LAG_S + 1 s (3,000 ms), which that measurement exceeded.
 */
export const PROMOTION_FENCE_WINDOW_MS = (GUARD_MAX_LAG_S + 2) * 1000 + GUARD_CRON_SLACK_MS;

export interface WriteGuardInput {
  readonly policy: FencePolicy;
  /** The database's role now. */
  readonly role: "primary" | "replica";
  /**
   * Whether the topology confirms this node as the primary. `undefined` while the store is
   * unreachable: the last confirmation stands (failsafe: the replicas are the fence).
   */
  readonly confirmed: boolean | undefined;
  /** Why it is not confirmed (topology names another node, a failover away, offline, malformed). */
  readonly unconfirmedReason?: string;
  /** The stored replica set of this primary, as last read or written. */
  readonly members: readonly string[];
  /** Node ids of the replicas attached to the database with a completed sync. */
  readonly attached: readonly string[];
  /**
   * Replicas the database counts toward `min-replicas-to-write` now (online, acknowledging within
   * the guard's lag) that `attached` does not name: no known node id, this node's own id, or an id
   * another address already stands for (`classifyReplicas`). @default 0
   */
  readonly outsiders?: number;
  readonly msSinceHeartbeatWritten: number;
  /** The write fence is on now. @default false */
  readonly fenced?: boolean;
  /**
   * This cycle read the topology; false when the read failed and `confirmed` is the last one read.
   * A fence is lifted only on a fresh read: a heartbeat write alone says nothing of a failover
   * decided while this agent was cut off. @default true
   */
  readonly topologyFresh?: boolean;
  readonly fenceTimeoutMs: number;
  /** The database restarted without continuing its own lineage (an empty or old restart). */
  readonly restarted: boolean;
  /** A promotion's fence window is still open (the old primary may not have noticed yet). */
  readonly promotionWindowOpen: boolean;
  /**
   * Why the database's clock step keeps it fenced (`clockStepFence`, src/core/clock-step.ts):
   * Redis's guard would count a detached replica good for the step's length more. @default none
   */
  readonly clockStepped?: string | undefined;
  /**
   * Why the replicas' lag is not trusted now (\`clockStepFreeze\`, src/agent/clock-watch.ts: a
   * forward step of the database's clock, after which every lag reads the step too high until
   * each replica acknowledges again): the plan drops no member. @default none
   */
  readonly lagUntrusted?: string | undefined;
  /**
   * Members of the replica set seen writing to the coordination store after this agent's own
   * writes began to fail (their probes' heartbeat counters, `storeWitnessesOf`). @default none
   */
  readonly storeWitnesses?: readonly string[];
}

/**
 * How far a witness's published heartbeat count must move past the count seen when this agent's
 * writes began to fail. A replica publishes its count before each heartbeat write, so the count
 * seen lags its true count by at most one write; two more prove a write that completed after
 * this agent was already failing: the store answers others. In a store-wide outage no write
 * completes, so the count moves at most one.
 */
export const WITNESS_ADVANCE = 2;

/**
 * Members that reached the store while this agent could not: their count moved at least
 * `WITNESS_ADVANCE` past the `baseline` (counts when this agent's writes began to fail). A count
 * that went down is a restarted agent and proves nothing yet.
 */
export function storeWitnessesOf(
  members: readonly string[],
  baseline: ReadonlyMap<string, number>,
  now: ReadonlyMap<string, number>,
): string[] {
  return members.filter((id) => {
    const before = baseline.get(id);
    const after = now.get(id);
    return before !== undefined && after !== undefined && after - before >= WITNESS_ADVANCE;
  });
}

export type WriteGuardPlan =
  | { readonly kind: "replica" }
  | { readonly kind: "fence"; readonly reason: string }
  | {
      readonly kind: "open";
      /** The replica set is kept under every policy: only its members may be promoted. */
      readonly join: readonly string[];
      readonly leave: readonly string[];
      readonly reason: string;
    }
  | {
      readonly kind: "guard";
      /** `min-replicas-to-write` to apply now. */
      readonly minReplicas: number;
      /** Attached replicas to add to the stored set (after the database demands them). */
      readonly join: readonly string[];
      /** Members no longer attached: to remove through the conditioned store write. */
      readonly leave: readonly string[];
      readonly reason: string;
    };

/** Decides the write guard of one node. */
export function planWriteGuard(input: WriteGuardInput): WriteGuardPlan {
  if (input.role !== "primary") return { kind: "replica" };
  if (input.restarted) {
    return {
      kind: "fence",
      reason: "the database restarted without continuing its replication lineage (its data may be gone)",
    };
  }
  if (input.confirmed === false) {
    return { kind: "fence", reason: input.unconfirmedReason ?? "the topology does not confirm this primary" };
  }
  if (input.promotionWindowOpen) {
    return { kind: "fence", reason: "promoted: waiting out the fence window of the old primary" };
  }
  if (input.clockStepped !== undefined) return { kind: "fence", reason: input.clockStepped };
  if (input.fenced === true && input.topologyFresh === false) {
    return { kind: "fence", reason: "fenced until a topology read confirms this primary again" };
  }
  const cutOff = input.msSinceHeartbeatWritten >= input.fenceTimeoutMs;
  const cutOffReason = `no heartbeat written for ${Math.round(input.msSinceHeartbeatWritten)} ms`;
  const members = new Set(input.members);
  const attached = new Set(input.attached);
  const join = [...attached].filter((id) => !members.has(id)).sort();
  // Membership frozen after a forward clock step: a member's lag read across it says nothing of
  // whether it acknowledges (nemesis seed 7381); the freeze ends by itself.
  const leave = input.lagUntrusted !== undefined ? [] : [...members].filter((id) => !attached.has(id)).sort();
  switch (input.policy) {
    case "keep-serving":
      return { kind: "open", join, leave, reason: cutOff ? `${cutOffReason}; keep-serving` : "confirmed" };
    case "fence":
      return cutOff
        ? { kind: "fence", reason: cutOffReason }
        : { kind: "open", join, leave, reason: "confirmed" };
    case "failsafe": {
      if (members.size === 0 && join.length === 0 && cutOff) {
        // No replica to witness that nobody else was promoted: nothing but the store can.
        return { kind: "fence", reason: `${cutOffReason} and no replica in the replica set` };
      }
      const witnesses = (input.storeWitnesses ?? []).filter((id) => members.has(id));
      if (cutOff && members.size > 0 && witnesses.length > members.size / 2) {
        // Not a store outage: this agent alone is cut off. Serving on would leave the shard with a
        // primary nobody can manage; fenced, its replicas report it so and the controller replaces it.
        return {
          kind: "fence",
          reason: `${cutOffReason} while ${[...witnesses].sort().join(", ")} of the replica set reach the coordination store: this agent alone is cut off`,
        };
      }
      // Redis counts every acknowledging replica: each one outside the set must be demanded
      // too, or two anonymous replicas would stand in for two members (guarantee 2).
      const outsiders = Math.max(0, input.outsiders ?? 0);
      const demanded = members.size + join.length;
      const named = `every member of the replica set must acknowledge (${[...members, ...join].sort().join(", ")})`;
      const others = `${outsiders} replica${outsiders === 1 ? "" : "s"} outside the replica set`;
      return {
        kind: "guard",
        // Raise before the store learns of a joiner; lower only after the store agreed.
        minReplicas: demanded + outsiders,
        join,
        leave,
        reason:
          demanded === 0
            ? outsiders === 0
              ? "no replica in the replica set"
              : `no replica in the replica set; ${others} must acknowledge too`
            : outsiders === 0
              ? named
              : `${named}, and the ${others}`,
      };
    }
  }
}

/** One replica the database lists as online, as the agent sees it. */
export interface ListedReplica {
  readonly address: string;
  /** The node id this address maps to (`nodeIdsByAddress`), if any. */
  readonly nodeId: string | undefined;
  /** Acknowledging within the guard's lag: Redis counts it toward `min-replicas-to-write` now. */
  readonly acknowledging: boolean;
}

/**
 * Splits the database's acknowledging replicas into node ids (`attached`) and the count of those
 * no id may stand for (`outsiders`): an unknown address, this node's own id (a stale map), or an
 * id a second address claims too (only one replica can be that node). Each outsider is a replica
 * Redis counts that no member is: the guard demands it as well.
 */
export function classifyReplicas(
  replicas: readonly ListedReplica[],
  selfId: string,
): { attached: string[]; outsiders: number } {
  const attached: string[] = [];
  let outsiders = 0;
  for (const replica of replicas) {
    if (!replica.acknowledging) continue;
    const id = replica.nodeId;
    if (id === undefined || id === selfId || attached.includes(id)) outsiders++;
    else attached.push(id);
  }
  return { attached, outsiders };
}

/** The freshness of one heartbeat, as `nodeIdsByAddress` reads it. */
export interface AddressClaim {
  readonly node_id: string;
  readonly node_address: string;
  /** µs (AWS-aligned) of the heartbeat's last write. */
  readonly written_us: number;
}

/**
 * address -> node id from the stored heartbeats. Heartbeat items live for days, so the map must
 * not be last-writer-wins over all of them: per address and per node id the freshest heartbeat
 * wins (a reused IP, a node moved to a new address), and a heartbeat older than `maxAgeMs` names
 * nothing unless `keep` does (the topology's primary, a member of this primary's replica set:
 * a member whose agent fell silent stays demanded at its address while its database acknowledges).
 */
export function nodeIdsByAddress(
  claims: readonly AddressClaim[],
  nowMs: number,
  maxAgeMs: number,
  keep: (claim: AddressClaim) => boolean = () => false,
): Map<string, string> {
  const freshestFirst = [...claims].sort((a, b) => b.written_us - a.written_us);
  const byAddress = new Map<string, string>();
  // Decided by its freshest claim, even one too old to name anything: an older claim never wins.
  const seenAddresses = new Set<string>();
  const seenIds = new Set<string>();
  for (const claim of freshestFirst) {
    const decided = seenAddresses.has(claim.node_address) || seenIds.has(claim.node_id);
    seenAddresses.add(claim.node_address);
    seenIds.add(claim.node_id);
    if (decided) continue;
    if (nowMs - claim.written_us / 1000 > maxAgeMs && !keep(claim)) continue;
    byAddress.set(claim.node_address, claim.node_id);
  }
  return byAddress;
}
