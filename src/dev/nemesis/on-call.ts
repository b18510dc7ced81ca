import type { FailoverConfig } from "../../core/config.ts";
import { dataLineageOf, decide, isAlive } from "../../core/decide.ts";
import { errorMessage } from "../../core/errors.ts";
import { holdsAllOf, peerPointOf } from "../../core/identity.ts";
import type { Heartbeat } from "../../core/model.ts";
import type { ShardSnapshot } from "../../core/ports.ts";
import type { FaultValue, History } from "./history.ts";

/**
 * The on-call engineer of a nemesis run, paged by one hold only: the controller keeps the shard
 * from a node with priority 0 because that node alone holds writes the others lack (gates
 * `priority_zero_ahead`, `priority_zero_ahead_offline`: "priority 0 is never promoted … or for an
 * operator to give that node a priority"). Nothing but an operator lifts that hold, so the run
 * plays one: `pageAfterMs` after the hold is first seen (the time to read the page), it restarts
 * that node's agent with a priority and the controller takes it from there.
 *
 * The hold is recorded in the history as a fault of kind `operator-paged` (a negative id), from
 * the first sight to the operator's act: the checker then judges guarantee 3 from the act on, as
 * after any heal, and names the page as the cause of the stretch before it. Without this the
 * priorities fault left a shard offline for 20 minutes (nemesis seed 4601) and the settle step's
 * `recover` kept a node with less data (seeds 4601 and 4711: 549 and 3 writes lost).
 */
export class OnCallOperator {
  readonly #history: History;
  readonly #snapshot: () => Promise<ShardSnapshot>;
  readonly #now: () => number;
  readonly #config: FailoverConfig;
  readonly #givePriority: (id: string) => void;
  readonly #undrain: (id: string) => Promise<void>;
  readonly #pageAfterMs: number;
  readonly #log: (text: string) => void;
  #timer: NodeJS.Timeout | undefined;
  #busy = false;
  #page: { readonly value: FaultValue; readonly seenAt: number } | undefined;
  #pages = 0;

  constructor(options: {
    readonly history: History;
    readonly snapshot: () => Promise<ShardSnapshot>;
    readonly now: () => number;
    readonly config: FailoverConfig;
    readonly givePriority: (id: string) => void;
    /** \`shardguard undrain\` of a drained holder (the runner runs the CLI); none: nothing undrains. */
    readonly undrain?: (id: string) => Promise<void>;
    readonly pageAfterMs: number;
    readonly log: (text: string) => void;
  }) {
    this.#history = options.history;
    this.#snapshot = options.snapshot;
    this.#now = options.now;
    this.#config = options.config;
    this.#givePriority = options.givePriority;
    this.#undrain = options.undrain ?? (async () => {});
    this.#pageAfterMs = options.pageAfterMs;
    this.#log = options.log;
  }

  /** How many times the operator was paged. */
  get pages(): number {
    return this.#pages;
  }

  start(intervalMs = 1000): void {
    this.#timer = setInterval(() => {
      if (this.#busy) return;
      this.#busy = true;
      this.tick()
        .catch((error) => this.#log(`on-call: ${errorMessage(error)}`))
        .finally(() => {
          this.#busy = false;
        });
    }, intervalMs);
  }

  /** Stops paging; an open page is closed as it stands (the final heal takes over). */
  stop(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
    if (this.#page) this.#close("the run ended");
  }

  /** One look at the shard, as the on-call engineer's dashboard shows it. */
  async tick(): Promise<void> {
    const snapshot = await this.#snapshot();
    const now = this.#now();
    const holder = priorityZeroHolder(snapshot, this.#config, now);
    if (holder === undefined) {
      if (this.#page) this.#close("the hold ended by itself");
      return;
    }
    if (this.#page === undefined) {
      this.#pages++;
      const value: FaultValue = {
        id: -1000 - this.#pages,
        kind: "operator-paged",
        target: "shard",
        nodes: [holder],
        note: `the controller holds for ${holder}, priority 0 or drained, the only node with all the data`,
      };
      this.#page = { value, seenAt: performance.now() };
      this.#history.append({ process: "nemesis", type: "info", f: "inject", value });
      this.#log(`  on-call: paged: the controller holds for ${holder} (priority 0, the most data)`);
      return;
    }
    if (performance.now() - this.#page.seenAt < this.#pageAfterMs) return;
    const drained = snapshot.topology?.drained?.includes(holder) === true;
    const zero = snapshot.nodes.find((node) => node.node_id === holder)?.priority === 0;
    if (drained) await this.#undrain(holder);
    if (zero || !drained) this.#givePriority(holder);
    this.#close(
      drained
        ? `${holder} undrained${zero ? " and its agent restarted with a priority" : ""}`
        : `${holder}'s agent restarted with a priority`,
    );
  }

  #close(note: string): void {
    const page = this.#page;
    if (!page) return;
    this.#page = undefined;
    this.#history.append({ process: "nemesis", type: "info", f: "heal", value: { ...page.value, note } });
    this.#log(`  on-call: ${note}`);
  }
}

/**
 * The priority-0 node the controller holds for: the decision is a hold, and the same snapshot with
 * that node given a priority is a promotion of it (whichever gate held: `priority_zero_ahead*`, or
 * `no_eligible_node` when it is the only node on the lineage). Undefined otherwise.
 */
export function priorityZeroHolder(
  snapshot: ShardSnapshot,
  config: FailoverConfig,
  now: number,
): string | undefined {
  if (decide(snapshot, config, now).kind !== "none") return undefined;
  const drained = snapshot.topology?.drained ?? [];
  const zeros = mostDataFirst(snapshot, config, now).filter(
    (node) => node.priority === 0 || drained.includes(node.node_id),
  );
  for (const zero of zeros) {
    // A drained node ranks as priority 0 (its hold names \`shardguard undrain\`, nemesis 7351): the
    // operator undrains it and, if its priority is 0, gives it one.
    const topology = snapshot.topology && {
      ...snapshot.topology,
      drained: drained.filter((id) => id !== zero.node_id),
    };
    const given = {
      ...snapshot,
      topology,
      nodes: snapshot.nodes.map((node) =>
        node === zero && node.priority === 0 ? { ...node, priority: OPERATOR_GIVES } : node,
      ),
    };
    const decision = decide(given, config, now);
    if (
      (decision.kind === "failover" || decision.kind === "bring_online") &&
      decision.target.node_id === zero.node_id
    )
      return zero.node_id;
  }
  return undefined;
}

/** The priority the operator gives (the runner restarts the agent with it). */
export const OPERATOR_GIVES = 100;

/**
 * The live nodes, the one holding the most data first (a fenced node restarted from its RDB counts
 * by the lineage it holds, \`dataLineageOf\`); among equals, a node with a priority first, then by id.
 * What an operator reads in \`shardguard status\` to choose whose data to keep.
 */
export function mostDataFirst(snapshot: ShardSnapshot, config: FailoverConfig, now: number): Heartbeat[] {
  return snapshot.nodes
    .filter((node) => isAlive(node, config, now))
    .sort(
      (a, b) =>
        dataLineageOf(b).last_txn_id - dataLineageOf(a).last_txn_id ||
        Number(b.priority > 0) - Number(a.priority > 0) ||
        a.node_id.localeCompare(b.node_id),
    );
}

/**
 * The live nodes an on-call engineer may recover on in the middle of a run: those whose data holds
 * every write of the lineage the offline topology stored (\`holdsAllOf\`), the most data first;
 * every live node when none is stored. A recover on any other node gives up acknowledged writes by
 * choice: nemesis seed 6303's mid-run operator ranked offsets across lineages and recovered on a
 * node holding 966 bytes of another lineage while the stored lineage's holder (its agent dead, its
 * database up) held 11,428 acknowledged writes, which were lost. With none, the operator waits, as
 * the hold's reason asks (bring the holder's agent back; the final heal does).
 */
export function recoverCandidates(snapshot: ShardSnapshot, config: FailoverConfig, now: number): Heartbeat[] {
  const stored = snapshot.topology?.lineage;
  const live = mostDataFirst(snapshot, config, now);
  if (stored === undefined) return live;
  const data = { replId: stored.repl_id, offset: stored.last_txn_id };
  return live.filter((node) => holdsAllOf(peerPointOf(node), data));
}
