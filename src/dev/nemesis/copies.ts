/**
 * Guarantee 1 (shared/DESIGN.md) keeps a replica-acknowledged write through the loss of one copy:
 * `WAIT 1` puts it on the primary and on one replica. A kill -9 of redis destroys its process's
 * copy (restarted empty, from an RDB up to 2 s old, or not at all), so the nemesis injects one only
 * while another node is an intact copy: the topology's primary answering as a master, or a replica
 * linked to it. Two copies destroyed together lose writes that no failover system can keep; that
 * is out of the fault model, and `restart-from-rdb.test.ts` covers what the controller does then.
 */

/** What one node's `ROLE` answered; undefined when it did not answer (down, paused, restarting). */
export type RoleRead =
  | { readonly role: "master" }
  | { readonly role: "slave"; readonly following: string | undefined; readonly linkUp: boolean };

/** The node ids, other than `target`, that hold the shard's data intact now. */
export function intactCopies(
  target: string,
  roles: ReadonlyMap<string, RoleRead | undefined>,
  primary: string | undefined,
): string[] {
  if (primary === undefined) return [];
  const intact: string[] = [];
  for (const [id, read] of roles) {
    if (id === target || read === undefined) continue;
    const holds =
      read.role === "master" ? id === primary : read.linkUp && read.following === primary && id !== primary;
    if (holds) intact.push(id);
  }
  return intact.sort();
}

/**
 * How long an agent must have run before the nemesis counts on it to park its replica through a
 * restart of the primary (guarantee 1's assumption, docs/safety.md): it parks on the close of its
 * probe's connection, or on a primary process other than the one it saw while linked, so it must
 * have booted (about 1 s, more under load), read its database and probed the primary while linked
 * (its 1 s cycle) before the primary goes. Nemesis seed 6001: node-35r's agent, restarted 0.41 s
 * before primary node-3 was killed (restart-as-replica of an empty master), logged its start only
 * after the kill, never saw node-3's process, and left node-35r to resync from it: 25,290 writes.
 */
export const AGENT_WATCHING_AFTER_MS = 10_000;

/** The agent beside a copy protects it: running, not held by a fault, and up long enough to watch its primary. */
export function agentProtects(agent: {
  readonly running: boolean;
  readonly busy: boolean;
  readonly upForMs: number | undefined;
}): boolean {
  return (
    agent.running && !agent.busy && agent.upForMs !== undefined && agent.upForMs >= AGENT_WATCHING_AFTER_MS
  );
}

/** Kinds that cut nodes apart or off the store, whatever they target: a replica's link state reads stale meanwhile. */
const CUTTING_KINDS: ReadonlySet<string> = new Set([
  "partition-nodes",
  "partition-agent-store",
  "partition-agent-sqs",
  "store-outage",
]);

/**
 * Why no copy can be counted on now, or undefined: a fault that cuts nodes apart or off the store
 * (the primary may be deposed meanwhile, and a replica's `ROLE` still shows its link up), or any
 * other fault on the primary itself. Nemesis seed 6002: a scale-in stopped a replica for good
 * while a partition isolated the primary, counted as an intact copy; the primary was replaced and
 * the 38 writes only those two held were lost (two copies destroyed: beyond guarantee 1).
 */
export function copiesUncertain(
  active: ReadonlyArray<{ readonly kind: string; readonly targets: readonly string[] }>,
  primary: string | undefined,
): string | undefined {
  for (const fault of active) {
    if (CUTTING_KINDS.has(fault.kind)) return `${fault.kind} active`;
    if (fault.kind !== "membership" && primary !== undefined && fault.targets.includes(primary))
      return `${fault.kind} on the primary ${primary}`;
  }
  return undefined;
}

/**
 * The topology's primary is a process this run restarted (from its RDB or empty), and the shard
 * has not moved on from it: the topology names it at the epoch read after the restart, or names
 * it while not online (a failover from it under way, or the shard marked offline on its lineage:
 * a later epoch with no promotion done). It and the replicas linked to it may hold less than what
 * was acknowledged, so the copies rule counts none of them (seed 5401). Nemesis seed 7341: primary
 * node-3 restarted empty at epoch 4; epoch 5 began a failover to node-2 (parked by its agent with
 * every write) still naming node-3; the copies rule, reading epoch 5, counted node-3, answering as
 * a master, as an intact copy and restarted node-2 empty 100 ms before its PROMOTE: every copy of
 * 6,161 acknowledged writes destroyed (docs/open-holes/nemesis-7341-analysis.md).
 */
export function primaryRolledBack(
  topology:
    | { readonly epoch: number; readonly status: string; readonly primary_node_id?: string | undefined }
    | undefined,
  restartedAtEpoch: ReadonlyMap<string, number>,
): boolean {
  const primary = topology?.primary_node_id;
  if (topology === undefined || primary === undefined) return false;
  const at = restartedAtEpoch.get(primary);
  if (at === undefined) return false;
  return at === topology.epoch || (topology.status !== "online" && topology.epoch >= at);
}

/**
 * The same rule where every dataset can be read (the simulator, src/dev/sim/world.ts): the
 * acknowledged writes `target` holds that no other copy holds. Destroying `target`'s copy while
 * any is listed destroys the last copy of those writes: a second destroyed copy, beyond
 * guarantee 1. `others` are the copies that count (`agentProtects` for a replica's), and only
 * their datasets decide, not what the topology says of them.
 */
export function soleCopies<K>(
  target: { has(key: K): boolean },
  acknowledged: Iterable<K>,
  others: ReadonlyArray<{ has(key: K): boolean }>,
): K[] {
  const sole: K[] = [];
  for (const key of acknowledged)
    if (target.has(key) && !others.some((copy) => copy.has(key))) sole.push(key);
  return sole;
}
