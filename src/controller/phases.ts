import { PHASE_MARGIN_MS, timeNeeded } from "../core/budget.ts";
import { targetConfirmed } from "../core/continuation.ts";
import { confirmedCrash } from "../core/crash.ts";
import { QueueMissing } from "../core/errors.ts";
import { isAgentHeard } from "../core/freshness.ts";
import { type Command, type CommandType, type FailoverPhase, MAX_COMMAND_TIMEOUT_MS } from "../core/model.ts";
import type { ShardSnapshot } from "../core/ports.ts";
import { type Outcome, OutOfTime, PhaseTimeout, sleepOf } from "./deps.ts";
import { requestReports } from "./reports.ts";
import { complete, type Run, recordPhase, stateOf } from "./transitions.ts";

/**
 * The phases of a change, in their one order:
 *
 *   [catch_up] -> promote -> confirm -> repoint -> cleanup -> complete
 *
 * Each is recorded in the topology (a fenced write) before its work, has a bound, and is
 * idempotent: command ids are deterministic per epoch and node, so a continued phase re-sends the
 * same command, which the agent runs at most once. `promote` is the point of no return.
 * A phase starts only when the invocation's remaining time covers its bound plus a margin;
 * otherwise the cycle stops (OutOfTime) with the phase recorded for the next invocation.
 */

interface Phase {
  readonly name: ExecutedPhase;
  /** Only for some changes (catch_up: switchovers). */
  readonly applies?: (run: Run) => boolean;
  readonly run: (run: Run) => Promise<void>;
}

export type ExecutedPhase = "catch_up" | "promote" | "confirm" | "repoint" | "cleanup";

const PHASES: readonly Phase[] = [
  { name: "catch_up", applies: (run) => stateOf(run).kind === "switchover", run: catchUp },
  { name: "promote", run: promote },
  { name: "confirm", run: confirm },
  { name: "repoint", run: repoint },
  { name: "cleanup", run: cleanup },
];

/** Runs the phases from `from` (up to `until`, included, when given) and completes the change at the end. */
export async function execute(
  run: Run,
  from: ExecutedPhase,
  until?: ExecutedPhase,
): Promise<Outcome | undefined> {
  const start = PHASES.findIndex((phase) => phase.name === from);
  const end = until === undefined ? PHASES.length : PHASES.findIndex((phase) => phase.name === until) + 1;
  for (const phase of PHASES.slice(start, end)) {
    if (phase.applies && !phase.applies(run)) continue;
    // confirm's start is the time PROMOTE went out: it is recorded even when this invocation has no
    // time left to wait, so the next one gives the target its confirm timeout from the send, not
    // from the epoch bump (simulator seed 320092: a controller frozen 42 s between recording
    // promote and sending PROMOTE deferred confirm; the next invocation, 24 ms after the target
    // promoted, judged it overdue and took the shard offline while it took acknowledged writes).
    if (phase.name !== "confirm") requireTime(run, phase.name);
    await run.lock.hold(phase.name);
    await recordPhase(run, phase.name);
    if (phase.name === "confirm") requireTime(run, phase.name);
    await phase.run(run);
    await run.deps.onPhase?.(run.shard, phase.name, run.topology.epoch);
  }
  return until === undefined ? complete(run) : undefined;
}

/**
 * Throws OutOfTime unless the invocation can still run `phases` (one after the other, each within
 * its bound plus the margin) before `at` starts. By default `at` needs its own bound; the epoch
 * bump, which writes but waits for nothing, needs the bound of the phases it leads to before
 * PROMOTE (`promote`; a switchover's `catch_up` and `promote`).
 */
export function requireTime(
  run: Run,
  at: ExecutedPhase | "epoch_bumped",
  phases: readonly ExecutedPhase[] = at === "epoch_bumped" ? ["promote"] : [at],
): void {
  const bounds = phases.map((phase) => run.timeouts[phase]);
  const left = run.remainingMs();
  if (left < timeNeeded(bounds)) {
    const what = phases.length === 1 && phases[0] === at ? "" : ` (${phases.join(", ")})`;
    throw new OutOfTime(
      at,
      `shard ${run.shard}: phase ${at}${what} needs up to ${bounds.join(" + ")} + ${phases.length * PHASE_MARGIN_MS} ms, ${Math.max(0, Math.floor(left))} ms left in this invocation`,
    );
  }
}

function command(run: Run, type: CommandType, node: string, extra: Partial<Command> = {}): Command {
  const epoch = run.topology.epoch;
  return {
    type,
    shard: run.shard,
    epoch,
    // Deterministic: a continued phase re-sends the same id, which the agent runs at most once.
    command_id: `${run.shard}:${epoch}:${type}:${node}`,
    issued_at: run.deps.clock.now(),
    ...extra,
  };
}

/** Runs an API-call phase under its timeout. */
async function withTimeout<T>(
  run: Run,
  phase: FailoverPhase,
  ms: number,
  work: () => Promise<T>,
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new PhaseTimeout(phase, `shard ${run.shard}: phase ${phase} took longer than ${ms} ms`)),
      ms,
    );
  });
  try {
    return await Promise.race([work(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Polls the shard's snapshot until `done`, renewing the lease; throws PhaseTimeout past `ms`.
 * Writes are held (a switchover's pause) or the shard has no writable primary while it waits, so
 * it polls often: each poll is one snapshot read, for a second or two per change.
 */
async function waitFor(
  run: Run,
  phase: FailoverPhase,
  ms: number,
  done: (snapshot: ShardSnapshot) => boolean | Promise<boolean>,
): Promise<void> {
  const deadline = run.deps.clock.now() + ms;
  const pollMs = Math.max(50, Math.min(100, Math.floor(run.deps.config.heartbeatIntervalMs / 4)));
  for (;;) {
    const snapshot = await run.deps.store.heartbeats.snapshot(run.shard);
    if (await done(snapshot)) return;
    if (run.deps.clock.now() >= deadline) {
      throw new PhaseTimeout(phase, `shard ${run.shard}: phase ${phase} not done after ${ms} ms`);
    }
    await run.lock.hold(phase);
    await sleepOf(run.deps)(pollMs);
  }
}

/** Switchover only: writes paused on the old primary, wait until the target has everything. */
async function catchUp(run: Run): Promise<void> {
  const state = stateOf(run);
  const old = state.old_primary_node_id as string;
  const pauseMs = Math.min(
    run.timeouts.catch_up + run.timeouts.promote + run.timeouts.confirm,
    MAX_COMMAND_TIMEOUT_MS,
  );
  await run.deps.bus.send(run.shard, old, command(run, "PAUSE_WRITES", old, { timeout_ms: pauseMs }));
  const targetId = state.new_primary_node_id;
  let askedAt = Number.NEGATIVE_INFINITY;
  await waitFor(run, "catch_up", run.timeouts.catch_up, async (snapshot) => {
    const primary = snapshot.nodes.find((node) => node.node_id === old);
    const target = snapshot.nodes.find((node) => node.node_id === targetId);
    // The old primary's offset is final only once its agent applied the pause (its epoch moved).
    if (primary === undefined || target === undefined || primary.epoch < run.topology.epoch) return false;
    if (target.last_txn_id >= primary.last_txn_id) return true;
    // The target holds the final offset within a replication round trip, but reports it only at
    // its next cycle: a REPORT has it write now (writes are held meanwhile).
    const now = run.deps.clock.now();
    if (now - askedAt >= run.deps.config.heartbeatIntervalMs) {
      askedAt = now;
      await requestReports(run.deps, run.shard, run.topology.epoch, [targetId], run.timeouts.catch_up);
    }
    return false;
  });
}

/** The point of no return: from here on the change is finished, never rolled back. */
async function promote(run: Run): Promise<void> {
  const target = stateOf(run).new_primary_node_id;
  await chainFollowers(run);
  await withTimeout(run, "promote", run.timeouts.promote, () =>
    run.deps.bus.send(run.shard, target, command(run, "PROMOTE", target)),
  );
}

/**
 * Failure timeouts a failover waits, before PROMOTE, for the old primary's other replicas to report
 * following the target; past it, PROMOTE goes ahead (a slow agent delays no failover longer).
 */
export const CHAIN_WAIT_TIMEOUTS = 1;

/**
 * Before PROMOTE of a failover, the old primary's other replicas follow the target (REPLICAOF, the
 * same command id as the repoint's, so an agent runs it once): chained behind it they acknowledge
 * only what the target holds. An old primary that was hung, not dead, runs the writes its clients
 * queued when it wakes, on its good-replica count of before the hang; a replica still linked to it
 * acknowledged them (`WAIT`), and they were lost when it followed the new primary (simulator seeds
 * 43189, 5886: 25 writes each, the old primary woke milliseconds before or after PROMOTE). Redis 7
 * drops a promoted node's replicas and they reconnect at once with a partial resync on its new
 * replication id (measured: 5-13 ms), so the chain costs the failover only the wait for their
 * reports. Skipped for a switchover (its old primary is paused and fenced first) and after a crash
 * the old primary's agent confirmed (a dead process cannot wake). Followers whose agents are not
 * heard are sent the command but not waited for (gates \`member_unheard\`, \`follower_unheard\` held the
 * decision for those that matter); one that does not report within CHAIN_WAIT_TIMEOUTS failure
 * timeouts is logged and PROMOTE goes ahead, as before this step.
 */
async function chainFollowers(run: Run): Promise<void> {
  const state = stateOf(run);
  if (state.kind !== "failover") return;
  const { config, clock } = run.deps;
  const target = state.new_primary_node_id;
  const old = state.old_primary_node_id;
  const snapshot = await run.deps.store.heartbeats.snapshot(run.shard);
  const oldPrimary = snapshot.nodes.find((node) => node.node_id === old);
  if (oldPrimary !== undefined && confirmedCrash(oldPrimary, config, clock.now()) !== undefined) return;
  const followers = snapshot.nodes.filter(
    (node) =>
      node.node_id !== target &&
      node.node_id !== old &&
      node.role === "replica" &&
      node.db_status === "up" &&
      node.primary_node_id === old,
  );
  if (followers.length === 0) return;
  const primary = { node_id: target, address: state.new_primary_address };
  const sent = await withTimeout(run, "promote", run.timeouts.promote, () =>
    sendEach(
      run,
      followers.map((node) => node.node_id),
      (node) => command(run, "REPLICAOF", node, { primary }),
    ),
  );
  const awaited = followers
    .filter((node) => sent.includes(node.node_id) && isAgentHeard(node, config, clock.now()))
    .map((node) => node.node_id);
  const epoch = run.topology.epoch;
  const started = clock.now();
  // Within the invocation's time: PROMOTE itself must still fit after the wait (requireTime's rule).
  const waitMs = Math.min(
    CHAIN_WAIT_TIMEOUTS * config.failureTimeoutMs,
    run.remainingMs() - timeNeeded([run.timeouts.promote]),
  );
  if (awaited.length === 0 || waitMs <= 0) return;
  try {
    await waitFor(run, "promote", waitMs, (latest) =>
      awaited.every((id) => {
        const node = latest.nodes.find((candidate) => candidate.node_id === id);
        return node === undefined || (node.epoch >= epoch && node.primary_node_id === target);
      }),
    );
  } catch (error) {
    if (!(error instanceof PhaseTimeout)) throw error;
    run.deps.log.warn("promoting before every replica of the old primary followed the target", {
      shard: run.shard,
      epoch,
      target,
      followers: awaited,
      waitedMs: clock.now() - started,
    });
  }
}

/**
 * Sends \`commandOf(node)\` to each node; a node without a queue (never started, or decommissioned)
 * is logged and skipped, any other failure fails the phase. Returns the nodes sent to.
 */
async function sendEach(
  run: Run,
  nodes: readonly string[],
  commandOf: (node: string) => Command,
): Promise<string[]> {
  const sent = await Promise.all(
    nodes.map(async (node) => {
      try {
        await run.deps.bus.send(run.shard, node, commandOf(node));
        return node;
      } catch (error) {
        if (!(error instanceof QueueMissing)) throw error;
        run.deps.log.warn("node has no command queue; not sent", {
          shard: run.shard,
          node,
          epoch: run.topology.epoch,
          error: error.message,
        });
        return undefined;
      }
    }),
  );
  return sent.filter((node): node is string => node !== undefined);
}

/** Observe, don't trust a reply: the target's own heartbeat must say primary at the new epoch. */
async function confirm(run: Run): Promise<void> {
  const target = stateOf(run).new_primary_node_id;
  await waitFor(run, "confirm", run.timeouts.confirm, (snapshot) =>
    targetConfirmed(snapshot, target, run.topology.epoch, run.deps.config, run.deps.clock.now()),
  );
}

/** REPLICAOF to every other node, the old primary included: a returning old primary finds it in its queue. */
async function repoint(run: Run): Promise<void> {
  const state = stateOf(run);
  const snapshot = await run.deps.store.heartbeats.snapshot(run.shard);
  const others = new Set(snapshot.nodes.map((node) => node.node_id));
  if (state.old_primary_node_id) others.add(state.old_primary_node_id);
  others.delete(state.new_primary_node_id);
  const primary = { node_id: state.new_primary_node_id, address: state.new_primary_address };
  // A node without a queue (a heartbeat left by a decommissioned node, until its TTL) is skipped: it
  // held the failover in phase repoint forever (nemesis, membership \`replace\`, seed 20268864).
  await withTimeout(run, "repoint", run.timeouts.repoint, () =>
    sendEach(run, [...others], (node) => command(run, "REPLICAOF", node, { primary })),
  );
}

/** The old primary's heartbeat and replica set go (while the lock is ours); it re-creates them when it returns. */
async function cleanup(run: Run): Promise<void> {
  const state = stateOf(run);
  const old = state.old_primary_node_id;
  if (old === undefined || old === state.new_primary_node_id) return;
  await withTimeout(run, "cleanup", run.timeouts.cleanup, () => run.lock.deleteNode(old));
}
