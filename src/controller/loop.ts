import { setTimeout as delay } from "node:timers/promises";
import pLimit, { type LimitFunction } from "p-limit";
import type { Decision } from "../core/decide.ts";
import { errorMessage } from "../core/errors.ts";
import { inPartition, type Partition } from "../core/partition.ts";
import {
  indexListingStale,
  screenWakes,
  type Wake,
  type WakeLimits,
  type WakeReceiver,
  wakeLimits,
  wokenCycleDelay,
} from "../core/wake.ts";
import {
  type ControllerDeps,
  type CycleResult,
  defaultPhaseTimeouts,
  runShardCycle,
} from "./orchestrator.ts";

/**
 * The controller loop: every `tickIntervalMs`, one cycle per shard of the shard index (or of its
 * partition of it), at most `concurrency` at a time (p-limit), until the caller's time is nearly
 * up (Lambda) or it is aborted (local process). Several loops may run at once (overlapping Lambda
 * invocations, a local controller beside the Lambda): every action is taken under the shard's lock
 * with a compare-and-set on the epoch, so overlap costs reads, never a second failover.
 */

export interface LoopOptions {
  /** One pass over the shards, then return. */
  readonly once?: boolean;
  /** Only these shards instead of the shard index. */
  readonly shards?: readonly string[];
  /** Time the caller has left, in ms (Lambda: `context.getRemainingTimeInMillis`). @default unlimited */
  readonly remainingMs?: () => number;
  /** Stop starting passes when less than this remains. @default 2 s + tickIntervalMs */
  readonly stopBeforeMs?: number;
  /**
   * Start no failover when less than this remains: decisions are still logged, and the next
   * (overlapping) invocation acts. @default the confirm timeout + 3 s
   */
  readonly actBudgetMs?: number;
  /** Cycles in flight at once (one limit for all the passes of a run). @default 32 */
  readonly concurrency?: number;
  /**
   * Only the shards of this partition (consistent hashing of the shard id, src/core/partition.ts),
   * for K controllers sharing a fleet. Wake-ups are not filtered: any controller may act on any
   * shard, under its lock. @default every shard
   */
  readonly partition?: Partition;
  readonly signal?: AbortSignal;
  /** Shard index page size. @default INDEX_PAGE_SIZE */
  readonly pageSize?: number;
  /**
   * Wake-ups to long-poll beside the ticks (the local controller): a shard named in one gets a
   * cycle at once. The periodic pass stays the safety net. @default none
   */
  readonly wake?: WakeReceiver;
  /**
   * Return after the first pass, `minMs` or more into the run, in which every shard was quiet
   * (`isQuiet`: healthy, paused or cooling down, nothing in flight), instead of running until the
   * time is up: the Lambda's mode, where the schedule and the agents' wake-ups start the next run.
   * @default run until the time is up
   */
  readonly untilQuiet?: { readonly minMs: number };
}

/** Longest SQS long poll. */
const WAKE_WAIT_SECONDS = 20;

export interface LoopSummary {
  readonly passes: number;
  readonly cycles: number;
  /** Cycles that did something (initialized, completed, offline, aborted, stuck). */
  readonly actions: number;
  readonly errors: number;
}

const ACTED = new Set(["initialized", "completed", "offline", "aborted", "stuck"]);

/**
 * Shards per page of the shard index. An index item is about 50 bytes, so a page of 1,000 is well
 * under a Query's 1 MB and costs the same read units per shard as pages of 100 (units count bytes),
 * while a pass over 5,000 shards waits on 5 sequential pages instead of 50 (bench:scale).
 */
export const INDEX_PAGE_SIZE = 1000;

/** Cycles in flight at once, unless the caller says otherwise (bench:scale: 32 beat 8 by 0.62). */
export const DEFAULT_CONCURRENCY = 32;

/**
 * Holds what must outlive one pass (and, at module scope in Lambda, one invocation): the last
 * state logged per shard, so a line is written when something changes, not every tick.
 */
export class ControllerLoop {
  readonly #deps: ControllerDeps;
  /** Per shard: the last state logged (decision/code/outcome), since when, and when last logged. */
  readonly #lastState = new Map<string, { state: string; since: number; loggedAt: number }>();
  readonly #offline = new Set<string>();
  readonly #inFlight = new Map<string, Promise<void>>();
  /** Shards woken while a cycle of theirs ran: one more cycle once it ends. */
  readonly #rewake = new Set<string>();
  /** Shards whose last cycle in this run was not quiet (`isQuiet`), or failed. */
  readonly #unquiet = new Set<string>();
  /** The shard index's ids at its last complete listing, and when: wake-ups naming others are dropped. */
  #known: Set<string> | undefined;
  #knownAt: number | undefined;
  /** When each woken shard's last woken cycle starts (screenWakes' per-shard interval). */
  readonly #wokenAt = new Map<string, number>();

  constructor(deps: ControllerDeps) {
    this.#deps = deps;
  }

  async run(options: LoopOptions = {}): Promise<LoopSummary> {
    const { config } = this.#deps;
    const remaining = options.remainingMs ?? (() => Number.POSITIVE_INFINITY);
    const stopBefore = options.stopBeforeMs ?? 2000 + config.tickIntervalMs;
    const actBudget = options.actBudgetMs ?? defaultPhaseTimeouts(config).confirm + 3000;
    const limit = pLimit(options.concurrency ?? DEFAULT_CONCURRENCY);
    const totals = { passes: 0, cycles: 0, actions: 0, errors: 0 };
    const left = remaining();
    this.#deps.log.debug("controller loop started", {
      remaining_ms: Number.isFinite(left) ? left : undefined,
    });
    const runStarted = Date.now();
    this.#unquiet.clear();
    const stopWakes = new AbortController();
    const wakes =
      options.wake && !options.once
        ? this.#consumeWakes(options.wake, options, stopWakes.signal, totals, () => remaining() > actBudget)
        : undefined;
    try {
      while (!options.signal?.aborted && remaining() > stopBefore) {
        const started = Date.now();
        try {
          await this.#pass(this.#passScope(options, totals.passes), limit, remaining() > actBudget, totals);
        } catch (error) {
          // Listing the shards failed (store unreachable): log, and try again next tick.
          totals.errors += 1;
          this.#deps.log.error("controller pass failed", { error: errorMessage(error) });
        }
        totals.passes += 1;
        this.#deps.metrics.count("shardOffline", this.#offline.size);
        this.#deps.metrics.flush();
        if (options.once) break;
        const quiet = options.untilQuiet;
        if (
          quiet !== undefined &&
          Date.now() - runStarted >= quiet.minMs &&
          this.#unquiet.size === 0 &&
          this.#inFlight.size === 0
        ) {
          this.#deps.log.debug("every shard quiet: controller run ends", { passes: totals.passes });
          break;
        }
        const wait = config.tickIntervalMs - (Date.now() - started);
        if (wait > 0) await delay(wait, undefined, { signal: options.signal }).catch(() => {});
      }
      stopWakes.abort();
      await wakes;
      // Orchestrations still running finish (each bounded by its phase timeouts).
      await Promise.allSettled([...this.#inFlight.values()]);
    } finally {
      stopWakes.abort();
      this.#deps.metrics.flush();
    }
    this.#deps.log.debug("controller loop stopped", totals);
    return totals;
  }

  /**
   * One cycle now for each shard the wake-ups name (Lambda: the SQS event source mapping's batch),
   * waiting for them. A shard already orchestrating gets one more cycle when that ends.
   */
  async wake(
    wakes: readonly Wake[],
    options: { remainingMs?: () => number; act?: boolean; concurrency?: number } = {},
  ): Promise<LoopSummary & { readonly shards: readonly string[] }> {
    const totals = { passes: 0, cycles: 0, actions: 0, errors: 0 };
    const shards = await this.#woken(
      wakes,
      options.act ?? true,
      options.remainingMs,
      totals,
      options.concurrency,
    );
    while (this.#inFlight.size > 0) await Promise.allSettled([...this.#inFlight.values()]);
    this.#deps.metrics.flush();
    return { ...totals, shards };
  }

  async #consumeWakes(
    receiver: WakeReceiver,
    options: LoopOptions,
    stop: AbortSignal,
    totals: { cycles: number; actions: number; errors: number },
    act: () => boolean,
  ): Promise<void> {
    const signal = options.signal ? AbortSignal.any([options.signal, stop]) : stop;
    while (!signal.aborted) {
      try {
        const wakes = await receiver.receive(WAKE_WAIT_SECONDS, signal);
        const wanted = options.shards ? wakes.filter((wake) => options.shards?.includes(wake.shard)) : wakes;
        await this.#woken(wanted, act(), options.remainingMs, totals, options.concurrency);
      } catch (error) {
        this.#deps.log.warn("controller wake-ups unavailable; the periodic pass goes on", {
          error: errorMessage(error),
        });
        await delay(this.#deps.config.tickIntervalMs * 5, undefined, { signal }).catch(() => {});
      }
    }
  }

  /** Cycles the shards the wake-ups may cycle (screenWakes), and returns them. */
  async #woken(
    wakes: readonly Wake[],
    act: boolean,
    remainingMs: (() => number) | undefined,
    totals: { cycles: number; actions: number; errors: number },
    concurrency = DEFAULT_CONCURRENCY,
  ): Promise<string[]> {
    if (wakes.length === 0) return [];
    const limits = wakeLimits(this.#deps.config.tickIntervalMs, concurrency);
    await this.#refreshKnown(wakes, limits);
    const screened = screenWakes(wakes, this.#known, limits);
    if (screened.unknown.length > 0 || screened.overCap.length > 0) {
      this.#deps.log.warn("controller wake-ups dropped", {
        unknown_shards: screened.unknown.length,
        over_cap: screened.overCap.length,
        examples: [...screened.unknown, ...screened.overCap].slice(0, 5),
      });
    }
    const now = this.#deps.clock.now();
    for (const shard of screened.shards) {
      const from = wakes.filter((wake) => wake.shard === shard);
      this.#deps.log.info("controller woken", {
        shard,
        by: from.slice(0, 10).map((wake) => `${wake.node}: ${wake.reason}`),
        latency_ms: Math.round(now - Math.min(...from.map((wake) => wake.sent_at))),
      });
      this.#cycleNow(shard, act, remainingMs, totals, limits);
    }
    return [...screened.shards];
  }

  /**
   * Lists the shard index when a wake-up names a shard the last listing did not hold and that
   * listing is older than `indexMaxAgeMs` (or there is none): a flood of made-up ids costs one
   * listing per `indexMaxAgeMs`. A failed listing keeps the last one.
   */
  async #refreshKnown(wakes: readonly Wake[], limits: WakeLimits): Promise<void> {
    const known = this.#known;
    if (known !== undefined && wakes.every((wake) => known.has(wake.shard))) return;
    if (!indexListingStale(this.#knownAt, Date.now(), limits.indexMaxAgeMs)) return;
    this.#knownAt = Date.now();
    try {
      const listed = new Set<string>();
      let token: string | undefined;
      do {
        const page = await this.#deps.store.shards.list(token, INDEX_PAGE_SIZE);
        for (const shard of page.shards) listed.add(shard);
        token = page.nextPageToken;
      } while (token);
      this.#known = listed;
    } catch (error) {
      this.#deps.log.warn("shard index not listed for wake-ups; the last listing stays", {
        error: errorMessage(error),
      });
    }
  }

  #cycleNow(
    shard: string,
    act: boolean,
    remainingMs: (() => number) | undefined,
    totals: { cycles: number; actions: number; errors: number },
    limits: WakeLimits,
  ): void {
    const running = this.#inFlight.get(shard);
    if (running) {
      if (this.#rewake.has(shard)) return;
      this.#rewake.add(shard);
      void running.finally(() => {
        this.#rewake.delete(shard);
        this.#cycleNow(shard, act, remainingMs, totals, limits);
      });
      return;
    }
    // Woken cycles of one shard start minIntervalMs apart at least: later wake-ups wait (and
    // coalesce, through the in-flight entry) instead of adding reads.
    const now = Date.now();
    const wait = wokenCycleDelay(this.#wokenAt.get(shard), now, limits.minIntervalMs);
    this.#wokenAt.set(shard, now + wait);
    if (this.#wokenAt.size > 2 * (this.#known?.size ?? 0) + limits.maxShards) this.#forgetWoken(now, limits);
    const cycle = (wait > 0 ? delay(wait) : Promise.resolve())
      .then(() => this.#cycle(shard, act, remainingMs, totals))
      .finally(() => this.#inFlight.delete(shard));
    this.#inFlight.set(shard, cycle);
  }

  /** Drops the start times that no longer delay anything (bounds the map under a flood). */
  #forgetWoken(now: number, limits: WakeLimits): void {
    for (const [shard, at] of this.#wokenAt)
      if (at + limits.minIntervalMs <= now) this.#wokenAt.delete(shard);
  }

  async #pass(
    options: LoopOptions,
    limit: LimitFunction,
    act: boolean,
    totals: { cycles: number; actions: number; errors: number },
  ): Promise<void> {
    const launched: Promise<void>[] = [];
    for await (const shard of this.#shards(options)) {
      // A shard still orchestrating from an earlier pass is not looked at again until it is done.
      if (this.#inFlight.has(shard)) continue;
      const cycle = limit(() => this.#cycle(shard, act, options.remainingMs, totals)).finally(() => {
        this.#inFlight.delete(shard);
      });
      this.#inFlight.set(shard, cycle);
      launched.push(cycle);
    }
    // A long orchestration must not hold up detection on the other shards: wait at most a tick.
    const tick = delay(this.#deps.config.tickIntervalMs, undefined, { signal: options.signal }).catch(
      () => {},
    );
    await Promise.race([Promise.allSettled(launched), tick]);
  }

  /**
   * What a pass covers. A run that ends when quiet (Lambda) reads every shard once, then only
   * those not quiet: a shard healthy at the first pass that fails later wakes a run of its own
   * through its agents, or is seen by the next scheduled one, as between runs. So an incident on
   * one shard costs one Query per tick, not one per shard of the fleet (docs/cost.md).
   */
  #passScope(options: LoopOptions, passesDone: number): LoopOptions {
    if (options.untilQuiet === undefined || passesDone === 0) return options;
    return { ...options, shards: [...this.#unquiet] };
  }

  async *#shards(options: LoopOptions): AsyncGenerator<string> {
    const { partition } = options;
    if (options.shards) {
      yield* options.shards.filter((shard) => inPartition(shard, partition));
      return;
    }
    // The index lists a shard of an older installation twice (docs/deploy.md#upgrading-the-shard-index).
    const listed = new Set<string>();
    let token: string | undefined;
    do {
      const page = await this.#deps.store.shards.list(token, options.pageSize ?? INDEX_PAGE_SIZE);
      for (const shard of page.shards) {
        if (listed.has(shard)) continue;
        listed.add(shard);
        if (inPartition(shard, partition)) yield shard;
      }
      token = page.nextPageToken;
    } while (token);
    // A complete listing: what wake-ups are screened against (screenWakes).
    this.#known = listed;
    this.#knownAt = Date.now();
  }

  async #cycle(
    shard: string,
    act: boolean,
    remainingMs: (() => number) | undefined,
    totals: { cycles: number; actions: number; errors: number },
  ) {
    try {
      // The remaining time bounds each phase and the lease: a phase that could be cut off by the
      // invocation's timeout is left to the next invocation instead.
      const result = await runShardCycle(this.#deps, shard, { act, remainingMs });
      totals.cycles += 1;
      if (ACTED.has(result.outcome)) totals.actions += 1;
      if (isQuiet(result)) this.#unquiet.delete(shard);
      else this.#unquiet.add(shard);
      this.#observe(result);
    } catch (error) {
      totals.errors += 1;
      this.#unquiet.add(shard);
      this.#deps.log.error("shard cycle failed", {
        shard,
        error: errorMessage(error),
        error_name: error instanceof Error ? error.name : undefined,
      });
      this.#lastState.delete(shard);
    }
  }

  #observe(result: CycleResult): void {
    const { decision } = result;
    if (decision && isStaleDetection(decision)) this.#deps.metrics.count("staleHeartbeatDetected");
    if (
      result.outcome === "offline" ||
      (decision?.kind === "none" && decision.code === "offline_no_candidate")
    ) {
      this.#offline.add(result.shard);
    } else if (result.outcome !== "no_action" || decision?.kind === "none") {
      this.#offline.delete(result.shard);
    }
    const state = `${decision?.kind ?? "-"}/${decision?.kind === "none" ? decision.code : ""}/${result.outcome}`;
    const attributes = {
      shard: result.shard,
      decision: decision?.kind,
      code: decision?.kind === "none" ? decision.code : undefined,
      outcome: result.outcome,
      epoch: result.epoch,
      primary: result.primary,
      reason: result.reason,
    };
    const last = this.#lastState.get(result.shard);
    const now = Date.now();
    if (last?.state === state && (isQuiet(result) || now - last.loggedAt < STILL_LOG_MS)) {
      this.#deps.log.debug("shard unchanged", attributes);
      return;
    }
    // A shard that stays stale, held or offline is said again every STILL_LOG_MS: its reason
    // names what it waits for, which changes within one code (an operator reads the latest).
    const since = last?.state === state ? last.since : now;
    this.#lastState.set(result.shard, { state, since, loggedAt: now });
    this.#deps.log.info(
      result.reason,
      since === now ? attributes : { ...attributes, unchanged_for_ms: now - since },
    );
  }
}

/**
 * How often a shard whose state is unchanged but not quiet (a stale primary held by a gate, an
 * offline shard, a lock held elsewhere) is logged again at info, with how long it has been so.
 */
export const STILL_LOG_MS = 30_000;

/**
 * Nothing for the controller to watch: the primary fresh (`healthy`), or the shard paused or cooling
 * down, and nothing done. Anything else (a stale primary waiting for its quorum, an offline shard,
 * a failover, a lock held by another run) keeps a run going until it is settled or the time is up.
 */
export function isQuiet(result: CycleResult): boolean {
  const { decision } = result;
  return (
    result.outcome === "no_action" &&
    decision?.kind === "none" &&
    !decision.primaryStale &&
    (decision.code === "healthy" || decision.code === "paused" || decision.code === "cooldown")
  );
}

/** A cycle that found the primary's heartbeat stale, whether or not it could act on it. */
export function isStaleDetection(decision: Decision): boolean {
  if (decision.kind === "failover" || decision.kind === "mark_offline") return true;
  return decision.kind === "none" && decision.primaryStale;
}
