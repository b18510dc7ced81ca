/**
 * The planted holes of `npm run sim:mutants` (bench/sim-mutants.ts): each is a small source patch of
 * a real safety rule of the product, applied only to a temporary copy of the committed tree (never to
 * the checkout). A patch whose search text no longer occurs exactly once is reported as "no longer
 * applies" (test/unit/sim-mutants.test.ts keeps every one applicable).
 */

export interface Patch {
  readonly file: string;
  /** Text that must occur exactly once in `file`. */
  readonly search: string;
  readonly replace: string;
}

export interface Mutant {
  readonly name: string;
  /** The rule it breaks, and where the hole was found first. */
  readonly hole: string;
  /** Which guarantee (../shared/DESIGN.md "Guarantees", the checker's letters) breaking it should show. */
  readonly expect: string;
  readonly patches: readonly Patch[];
  /**
   * Options of `npm run sim` for the hunt when the default schedule is not the one (`--faults`,
   * `--overlap`): more of the faults that exercise this rule. @default the default schedule
   */
  readonly sim?: readonly string[];
}

const WRITE_GUARD = "src/core/write-guard.ts";

/** Faults that take the primary away (its database dead or hung, its machine cut off, its agent dead). */
const PRIMARY_DIES = "kill-redis,hang-redis,partition-node,kill-agent";
/** Those and the faults that leave a primary alive but cut off from part of the shard or the store. */
const PRIMARY_FAULTS =
  "partition-node,partition-oneway,store-outage-node,pause-agent,kill-agent,kill-redis,hang-redis";

/**
 * A hunt's schedule: the kinds named (a repeated kind weighs more), faults overlapping, so the
 * fault that exercises a rule meets a failover.
 */
function hunt(...kinds: readonly string[]): readonly string[] {
  return ["--faults", kinds.join(","), "--overlap"];
}

export const MUTANTS: readonly Mutant[] = [
  {
    name: "no-promotion-window",
    hole: "a promoted node takes writes at once, while the old primary's guard may still count it (finding 5 of issue 30: the promotion fence window)",
    expect: "two writable primaries outside the fence window",
    sim: hunt(PRIMARY_FAULTS, "replica-lag,unmanaged-replica"),
    patches: [
      {
        file: WRITE_GUARD,
        search: "if (input.promotionWindowOpen) {",
        replace: "if (false && input.promotionWindowOpen) {",
      },
    ],
  },
  {
    name: "unconfirmed-primary-open",
    hole: "a primary the topology no longer confirms keeps taking writes (the fence on an unconfirmed primary; a returning old primary)",
    expect: "two writable primaries; a node left following the wrong primary",
    sim: hunt(PRIMARY_FAULTS, "replica-lag,unmanaged-replica"),
    patches: [
      {
        file: WRITE_GUARD,
        search: "if (input.confirmed === false) {",
        replace: "if (false && input.confirmed === false) {",
      },
    ],
  },
  {
    name: "guard-one-replica",
    hole: "the write guard demands one acknowledging replica instead of every member of the replica set (docs/agent.md#the-replica-set-guard)",
    expect: "a replica-acknowledged write lost; two writable primaries",
    patches: [
      {
        file: WRITE_GUARD,
        search: "minReplicas: demanded + outsiders,",
        replace: "minReplicas: Math.min(1, demanded + outsiders),",
      },
    ],
  },
  {
    name: "guard-ignores-outsiders",
    hole: "the write guard does not count replicas outside the replica set, so an unnamed replica stands in for a member (the replica outside the replica set)",
    expect: "two writable primaries; a replica-acknowledged write lost",
    sim: hunt(
      "unmanaged-replica,unmanaged-replica,partition-redis-link,store-outage-node,replica-lag",
      PRIMARY_DIES,
    ),
    patches: [
      {
        file: WRITE_GUARD,
        search: "minReplicas: demanded + outsiders,",
        replace: "minReplicas: demanded,",
      },
    ],
  },
  {
    name: "restarted-primary-open",
    hole: "a primary whose database restarted empty (or from an old RDB) serves writes again instead of staying fenced until it follows (guarantee 5, docs/agent.md#database-identity)",
    expect: "a replica-acknowledged write lost",
    sim: ["--faults", "all,restart-redis-fast,restart-redis-fast,restart-redis-fast", "--overlap"],
    patches: [
      {
        file: WRITE_GUARD,
        search: "if (input.restarted) {",
        replace: "if (false && input.restarted) {",
      },
    ],
  },
  {
    name: "fence-lifted-on-write",
    hole: "a fenced primary lifts its fence on a heartbeat write alone, without a fresh topology read that confirms it (a fence lifted on a write alone)",
    expect: "two writable primaries",
    sim: hunt("store-ops,store-ops,store-outage-node,partition-redis-link", PRIMARY_DIES),
    patches: [
      {
        file: WRITE_GUARD,
        search: "if (input.fenced === true && input.topologyFresh === false) {",
        replace: "if (false && input.fenced === true && input.topologyFresh === false) {",
      },
    ],
  },
  {
    name: "rank-lowest-offset",
    hole: "failover candidates ranked by the lowest offset first (the wrong offset order): a lagging replica is promoted over one that holds more (guarantee 1)",
    expect: "a replica-acknowledged write lost",
    sim: hunt("replica-lag,replica-lag", PRIMARY_DIES),
    patches: [
      {
        file: "src/core/decide/pick-candidate.ts",
        search:
          "function compareByOffset(a: Candidate, b: Candidate): number {\n  if (a.eligible !== b.eligible) return a.eligible ? -1 : 1;\n  if (a.last_txn_id !== b.last_txn_id) return b.last_txn_id - a.last_txn_id;",
        replace:
          "function compareByOffset(a: Candidate, b: Candidate): number {\n  if (a.eligible !== b.eligible) return a.eligible ? -1 : 1;\n  if (a.last_txn_id !== b.last_txn_id) return a.last_txn_id - b.last_txn_id;",
      },
    ],
  },
  {
    name: "promote-outside-replica-set",
    hole: "the replica-set guard is skipped when picking a candidate: a node the old primary's write guard does not count may be promoted (the replica outside the replica set)",
    expect: "two writable primaries; a replica-acknowledged write lost",
    sim: hunt("replica-lag,replica-lag,partition-redis-link,unmanaged-replica", PRIMARY_DIES),
    patches: [
      {
        file: "src/core/decide/pick-candidate.ts",
        search: "if (members !== undefined && !members.includes(node.node_id)) {",
        replace: "if (false && members !== undefined && !members.includes(node.node_id)) {",
      },
    ],
  },
  {
    name: "accept-stale-command",
    hole: "an agent obeys a command whose epoch is below the topology's or its own highest (a controller paused past its lease sending its old plan; guarantees 4 and 6)",
    expect: "a node following the wrong primary; two writable primaries",
    sim: hunt(
      "controller-stall-failover,controller-stall-failover,sqs-late,sqs-late,sqs-unreliable",
      PRIMARY_DIES,
    ),
    patches: [
      {
        file: "src/agent/command-screen.ts",
        search: "if (command.epoch < context.highestEpoch) {",
        replace: "if (false && command.epoch < context.highestEpoch) {",
      },
      {
        file: "src/agent/command-screen.ts",
        search: "if (command.epoch < current) {",
        replace: "if (false && command.epoch < current) {",
      },
    ],
  },
  {
    name: "no-park-on-restart",
    hole: "a replica whose primary's connection closed is not parked, so it full-syncs from a primary restarted empty and loses its data (nemesis seed 3116; an empty replica's restart)",
    expect: "a replica-acknowledged write lost",
    sim: ["--faults", "all,restart-redis-fast,restart-redis-fast,restart-redis-fast", "--overlap"],
    patches: [
      {
        file: "src/agent/primary-probe.ts",
        search: "if (this.#address !== address) return;",
        replace: "if (this.#address !== address || true) return;",
      },
    ],
  },
  {
    name: "staleness-units",
    hole: "a wrong staleness comparison: a heartbeat's age in ms compared with the window in µs, so a dead primary's heartbeat stays fresh for 1000x the failure timeout",
    expect: "the shard unavailable past the availability limit",
    patches: [
      {
        file: "src/core/freshness.ts",
        search: "return ageMs <= windowMs && ageMs >= -MAX_CLOCK_SKEW_MS;",
        replace: "return ageMs <= windowMs * 1000 && ageMs >= -MAX_CLOCK_SKEW_MS;",
      },
    ],
  },
  {
    name: "role-lock-across-store-call",
    hole: "an agent reads the topology for a command while holding the role lock, so a hung store delays parking a replica (nemesis seed 3116: the role lock held across a store call)",
    expect: "a replica-acknowledged write lost",
    sim: hunt("store-ops,store-ops,store-flaky,restart-redis-fast,restart-redis-fast", PRIMARY_DIES),
    patches: [
      {
        file: "src/agent/command-consumer.ts",
        search:
          '    const topology = message.command\n      ? await withStoreTimeout(ctx.deps.topology.read(ctx.shard), ctx.storeTimeoutMs, "topology read")\n      : undefined;\n    const outcome = await ctx.roleLock.run(async () => {\n',
        replace:
          '    const outcome = await ctx.roleLock.run(async () => {\n    const topology = message.command\n      ? await withStoreTimeout(ctx.deps.topology.read(ctx.shard), ctx.storeTimeoutMs, "topology read")\n      : undefined;\n',
      },
    ],
  },
  {
    name: "write-without-lock-check",
    hole: "a controller's writes no longer carry the lock check (the store's WriteFence dropped): a controller paused past its lease writes its old plan over another's (promoting without the lock)",
    expect: "two writable primaries; a node following the wrong primary",
    sim: hunt("controller-stall-failover,controller-stall-failover,sqs-late", PRIMARY_DIES),
    patches: [
      {
        file: "src/adapters/dynamo-coordination-store.ts",
        search: "const checks = [lockCheck(this.tableName, fence.lease)];",
        replace: "const checks = [lockCheck(this.tableName, fence.lease)].slice(1);",
      },
    ],
  },
  {
    name: "ignore-store-returning",
    hole: "the controller fails over while agents are just back from a store outage, on heartbeats that are stale only because the store was down (agents back from a store outage)",
    expect: "a needless failover; two writable primaries or a lost write",
    sim: hunt("store-outage-agents,store-outage-agents,store-outage-node,store-ops", PRIMARY_DIES),
    patches: [
      {
        file: "src/core/decide/online.ts",
        search: "(v.storeReturning === undefined ? undefined :",
        replace: "(true ? undefined :",
      },
    ],
  },
  {
    name: "config-fence-opened",
    hole: "an agent opens a database started fenced by its config before any topology read confirms this primary (nemesis seed 5803: an agent restarted without its state opened a primary's new RDB process in an offline shard; an anonymous replica acknowledged 76 writes, and the shard came back on another node)",
    expect: "replica-acknowledged writes lost",
    sim: hunt(
      "agent-lost-state,agent-lost-state,agent-lost-state",
      "kill-redis,kill-redis,hang-redis,unmanaged-replica,unmanaged-replica",
      "store-outage-node,partition-node,restart-redis-fast",
    ),
    patches: [
      {
        file: "src/agent/write-guard.ts",
        search: "if (ctx.confirmed === true || ctx.state.state.fence !== undefined) return undefined;",
        replace: "return undefined;",
      },
    ],
  },
];

/** Applies a mutant's patches to `read`/`write` of one tree; the names of patches that do not apply. */
export function applyMutant(
  mutant: Mutant,
  read: (file: string) => string,
  write: (file: string, text: string) => void,
): string[] {
  const missing: string[] = [];
  const texts = new Map<string, string>();
  for (const patch of mutant.patches) {
    const text = texts.get(patch.file) ?? read(patch.file);
    const count = text.split(patch.search).length - 1;
    if (count !== 1) {
      missing.push(`${patch.file}: search text found ${count} times`);
      continue;
    }
    texts.set(
      patch.file,
      text.replace(patch.search, () => patch.replace),
    );
  }
  if (missing.length > 0) return missing;
  for (const [file, text] of texts) write(file, text);
  return [];
}
