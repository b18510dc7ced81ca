import { errorMessage } from "../core/errors.ts";
import type { HeartbeatInput } from "../core/model.ts";
import type { Logger } from "../core/observability.ts";
import type { Clock, HeartbeatStore, ShardSnapshot, WriteFence } from "../core/ports.ts";
import { type MasterState, masterState, type SentinelView } from "../core/sentinel.ts";
import { withStoreTimeout } from "./scheduling.ts";

export interface SentinelFeedOptions {
  readonly shard: string;
  readonly nodeId: string;
  readonly failureTimeoutMs: number;
  /** An answer never comes from a snapshot whose read started longer ago than this. */
  readonly refreshMs: number;
  readonly storeTimeoutMs: number;
  /** One strongly consistent read of the shard (the untapped store). */
  readonly read: () => Promise<ShardSnapshot>;
  readonly clock: Clock;
  readonly monotonicNow: () => number;
  readonly logger: Logger;
}

interface Held {
  readonly snapshot: ShardSnapshot;
  /** Monotonic ms at which the read that returned it started. */
  readonly startedAt: number;
}

/**
 * The shard as the agent last read it, for the Sentinel endpoint. Fed by every snapshot the
 * heartbeat loop reads (tap) and by its own reads when a client asks and the newest snapshot
 * started more than `refreshMs` ago (one read in flight at a time, shared by all waiting clients).
 * Monotonic: a snapshot at a lower epoch than the one held, or read before it, is ignored.
 */
export class SentinelFeed {
  readonly #options: SentinelFeedOptions;
  #held: Held | undefined;
  #inflight: Promise<void> | undefined;
  #inflightStartedAt = Number.NEGATIVE_INFINITY;
  readonly #listeners: Array<(state: MasterState) => void> = [];
  #watching: () => boolean = () => false;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  #lastFailureLog = Number.NEGATIVE_INFINITY;

  constructor(options: SentinelFeedOptions) {
    this.#options = options;
  }

  /** Offers a snapshot whose read started at `startedAt`; true when it became the held one. */
  offer(snapshot: ShardSnapshot, startedAt: number): boolean {
    const held = this.#held;
    if (held !== undefined) {
      const heldEpoch = held.snapshot.topology?.epoch ?? -1;
      const epoch = snapshot.topology?.epoch ?? -1;
      if (epoch < heldEpoch || (epoch === heldEpoch && startedAt < held.startedAt)) return false;
    }
    this.#held = { snapshot, startedAt };
    const state = masterState(snapshot.topology);
    for (const listener of this.#listeners) listener(state);
    this.#scheduleWatch(state);
    return true;
  }

  /** Called with the master state of every snapshot taken (events are computed from it). */
  onSnapshot(listener: (state: MasterState) => void): void {
    this.#listeners.push(listener);
  }

  /**
   * While `watching()` holds (someone subscribed) and the shard has no master to give, reads
   * every `refreshMs` so that `+switch-master` goes out as soon as the topology names the new one.
   */
  watchWhile(watching: () => boolean): void {
    this.#watching = watching;
  }

  /** The view to answer from: refreshed first when the held snapshot is older than `refreshMs`. */
  async view(): Promise<SentinelView> {
    const now = this.#options.monotonicNow();
    const held = this.#held;
    if (held === undefined || now - held.startedAt > this.#options.refreshMs) await this.refresh();
    const current = this.#held;
    if (current === undefined) {
      throw new Error(`shard ${this.#options.shard} has not been read from the coordination table yet`);
    }
    return {
      shard: this.#options.shard,
      topology: current.snapshot.topology,
      nodes: current.snapshot.nodes,
      selfNodeId: this.#options.nodeId,
      nowMs: this.#options.clock.now(),
      failureTimeoutMs: this.#options.failureTimeoutMs,
    };
  }

  /** One read, shared with any read that started within `refreshMs`; failures leave the held view. */
  refresh(): Promise<void> {
    const now = this.#options.monotonicNow();
    if (this.#inflight && now - this.#inflightStartedAt <= this.#options.refreshMs) return this.#inflight;
    this.#inflightStartedAt = now;
    const read = (async () => {
      try {
        const snapshot = await withStoreTimeout(
          this.#options.read(),
          this.#options.storeTimeoutMs,
          `snapshot of shard ${this.#options.shard} for the Sentinel endpoint`,
        );
        this.offer(snapshot, now);
      } catch (error) {
        const at = this.#options.monotonicNow();
        if (at - this.#lastFailureLog >= 30_000) {
          this.#lastFailureLog = at;
          this.#options.logger.warn(
            "sentinel endpoint: shard read failed; answering from the last snapshot",
            {
              error: errorMessage(error),
              heldEpoch: this.#held?.snapshot.topology?.epoch,
            },
          );
        }
      } finally {
        // A newer read may have replaced this one (it started more than refreshMs later).
        if (this.#inflightStartedAt === now) this.#inflight = undefined;
      }
    })();
    this.#inflight = read;
    return read;
  }

  /** Wraps the agent's heartbeat store: its snapshots feed this view, its heartbeats carry `sentinelAddress`. */
  tap(inner: HeartbeatStore, sentinelAddress: () => string | undefined): HeartbeatStore {
    return {
      put: (heartbeat: HeartbeatInput) => {
        const address = sentinelAddress();
        return inner.put(address === undefined ? heartbeat : { ...heartbeat, sentinel_address: address });
      },
      snapshot: async (shard: string) => {
        const startedAt = this.#options.monotonicNow();
        const snapshot = await inner.snapshot(shard);
        if (shard === this.#options.shard) this.offer(snapshot, startedAt);
        return snapshot;
      },
      deleteNode: (shard: string, nodeId: string, fence?: WriteFence) =>
        inner.deleteNode(shard, nodeId, fence),
    };
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #scheduleWatch(state: MasterState): void {
    if (this.#stopped || this.#timer !== undefined || state.kind === "serving" || !this.#watching()) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      void this.refresh().then(() => {
        const held = this.#held;
        if (held) this.#scheduleWatch(masterState(held.snapshot.topology));
      });
    }, this.#options.refreshMs);
    this.#timer.unref();
  }
}
