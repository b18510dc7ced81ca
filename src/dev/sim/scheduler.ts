import { AsyncLocalStorage } from "node:async_hooks";
import crypto from "node:crypto";
import { syncBuiltinESMExports } from "node:module";
import timersPromises from "node:timers/promises";
import { Random } from "../nemesis/random.ts";

/**
 * Virtual time for the simulator: one explicit scheduler replaces the process's timers and clocks
 * (setTimeout/setInterval/setImmediate, node:timers/promises, Date, performance.now) and its
 * randomness (Math.random, crypto.randomUUID) while a simulation runs, so the real agent and
 * controller code runs unchanged on simulated time. Nothing real is waited for: the driver pops
 * the earliest timer, sets the clock to its time and runs it, then drains every promise that
 * became ready (one process.nextTick, see `#afterTimer`) before the next. Timers due at the same instant run in
 * an order drawn from the seeded generator, so a seed also chooses the interleaving of ready work.
 *
 * Every timer belongs to the simulated host whose code created it (AsyncLocalStorage carries the
 * host through callbacks and awaits): a paused host's timers and deliveries wait until it resumes,
 * as a SIGSTOPped process's would, and a killed host's never run.
 */

export interface Timer {
  readonly id: number;
  at: number;
  readonly tie: number;
  readonly host: string | undefined;
  readonly fn: () => void;
  readonly interval: number | undefined;
  cancelled: boolean;
}

/** The epoch the simulated wall clock starts at (a fixed date, so traces do not depend on the day). */
export const SIM_EPOCH_MS = Date.UTC(2026, 0, 1);

interface Saved {
  setTimeout: typeof globalThis.setTimeout;
  clearTimeout: typeof globalThis.clearTimeout;
  setInterval: typeof globalThis.setInterval;
  clearInterval: typeof globalThis.clearInterval;
  setImmediate: typeof globalThis.setImmediate;
  clearImmediate: typeof globalThis.clearImmediate;
  Date: DateConstructor;
  performanceNow: () => number;
  random: () => number;
  randomUUID: typeof crypto.randomUUID;
  promisesSetTimeout: typeof timersPromises.setTimeout;
  promisesSetImmediate: typeof timersPromises.setImmediate;
  nextTick: typeof process.nextTick;
}

/** A handle that looks enough like Node's Timeout for the code that uses one (unref, ref, hasRef). */
class VirtualTimeout {
  readonly timer: Timer;
  readonly #byId: Map<number, Timer>;
  constructor(timer: Timer, byId: Map<number, Timer>) {
    this.timer = timer;
    this.#byId = byId;
  }
  unref(): this {
    return this;
  }
  ref(): this {
    return this;
  }
  hasRef(): boolean {
    return true;
  }
  refresh(): this {
    return this;
  }
  /** As a number (Node's timeouts convert to their id): clearTimeout(id) finds the timer by it. */
  [Symbol.toPrimitive](): number {
    if (!this.timer.cancelled) this.#byId.set(this.timer.id, this.timer);
    return this.timer.id;
  }
}

/**
 * The running host, one storage for every scheduler of the process. Node's AsyncLocalStorage (on
 * AsyncContextFrame, Node 24) keeps a storage's key in the async context after `run`/`exit` (it
 * restores the prior value, undefined, rather than removing the key), and every `run` copies the
 * whole context: a storage per scheduler left one more key per seed in the batch's own context, so
 * every timer of a batch's Nth seed copied N keys (issue 32: per-seed time grew with N).
 */
const hosts = new AsyncLocalStorage<string>();

export class Scheduler {
  readonly random: Random;
  readonly #hosts = hosts;
  /** Timers not yet due: a binary min-heap on (at, tie). Cancelled ones are dropped when popped. */
  readonly #heap: Timer[] = [];
  /**
   * Timers whose handle was turned into a number (`+setTimeout(...)`), by id, for clearTimeout(id);
   * registered on conversion, not for every timer (issue 32).
   */
  readonly #byId = new Map<number, Timer>();
  /** host -> timers that came due while it was paused, in due order. */
  readonly #held = new Map<string, Timer[]>();
  readonly #paused = new Set<string>();
  readonly #dead = new Set<string>();
  #nextId = 1;
  #now = SIM_EPOCH_MS;
  #saved: Saved | undefined;
  /** Timers run so far (a measure of work). */
  fired = 0;
  /** `process.nextTick` calls by code other than the scheduler's own (see `#afterTimer`). */
  #foreignTicks = 0;

  constructor(seed: number) {
    this.random = new Random(seed);
  }

  /** Virtual ms since 1970. */
  get now(): number {
    return this.#now;
  }

  /** Virtual ms since the simulation began. */
  get elapsed(): number {
    return this.#now - SIM_EPOCH_MS;
  }

  /** The host whose code is running (undefined: the simulator itself). */
  get host(): string | undefined {
    return this.#hosts.getStore();
  }

  /** Runs `fn` as code of `host`: every timer and await it starts belongs to that host. */
  onHost<T>(host: string | undefined, fn: () => T): T {
    return host === undefined ? this.#hosts.exit(fn) : this.#hosts.run(host, fn);
  }

  /**
   * host -> a runner of functions as code of that host, for the timers `runUntil` fires: the async
   * context of the runner's own code with the host set, taken once (AsyncLocalStorage.snapshot),
   * where `onHost` builds a new context, a copy, on entry and another on exit for every timer
   * (issue 32: several per cent of a run's CPU). The same context as `onHost` would give, as long as the
   * runner's own context does not change during a run; `runUntil` clears it when called.
   */
  readonly #runners = new Map<string | undefined, (fn: () => void) => void>();

  #runnerOf(host: string | undefined): (fn: () => void) => void {
    let runner = this.#runners.get(host);
    if (runner === undefined) {
      runner = this.onHost(host, () => AsyncLocalStorage.snapshot());
      this.#runners.set(host, runner);
    }
    return runner;
  }

  /** Schedules `fn` after `ms` on `host` (default: the current host). */
  schedule(ms: number, fn: () => void, host: string | undefined = this.host, interval?: number): Timer {
    const timer: Timer = {
      id: this.#nextId++,
      at: this.#now + Math.max(0, Number.isFinite(ms) ? ms : 0),
      tie: this.random.next(),
      host,
      fn,
      interval,
      cancelled: false,
    };
    this.#push(timer);
    return timer;
  }

  cancel(timer: Timer | undefined): void {
    if (!timer) return;
    timer.cancelled = true;
    this.#byId.delete(timer.id);
  }

  /** Freezes a host (SIGSTOP): its due timers wait until `resume`. */
  pause(host: string): void {
    this.#paused.add(host);
  }

  resume(host: string): void {
    this.#paused.delete(host);
    const held = this.#held.get(host) ?? [];
    this.#held.delete(host);
    // Everything that came due while frozen runs now, in the order it came due (1 µs apart: equal
    // instants would be ordered by the random tie-break).
    held.forEach((timer, index) => {
      timer.at = this.#now + index * 0.001;
      this.#push(timer);
    });
  }

  isPaused(host: string | undefined): boolean {
    return host !== undefined && this.#paused.has(host);
  }

  /** Kills a host's code for good: its timers are dropped (a new process gets a new host name). */
  kill(host: string): void {
    this.#dead.add(host);
    this.#held.delete(host);
    this.#paused.delete(host);
  }

  isDead(host: string | undefined): boolean {
    return host !== undefined && this.#dead.has(host);
  }

  /** Runs timers in virtual-time order until `until` (virtual ms since 1970) or `stop()` says so. */
  async runUntil(until: number, stop: () => boolean = () => false): Promise<void> {
    const saved = this.#saved;
    if (!saved) throw new Error("the scheduler is not installed");
    await this.#drain(saved);
    this.#runners.clear();
    while (!stop()) {
      const next = this.#popDue(until);
      if (next === undefined) break;
      this.#now = Math.max(this.#now, next.at);
      if (next.cancelled) continue;
      if (next.host !== undefined && this.#dead.has(next.host)) continue;
      if (next.host !== undefined && this.#paused.has(next.host)) {
        const held = this.#held.get(next.host) ?? [];
        held.push(next);
        this.#held.set(next.host, held);
        continue;
      }
      if (next.interval === undefined) this.#byId.delete(next.id);
      else {
        next.at = this.#now + Math.max(1, next.interval);
        this.#push(next);
      }
      this.fired++;
      const ticks = this.#foreignTicks;
      this.#runnerOf(next.host)(next.fn);
      await this.#afterTimer(saved);
      if (this.#foreignTicks !== ticks) await this.#drain(saved);
    }
    this.#now = Math.max(this.#now, Math.min(until, this.#earliest() ?? until));
  }

  #earliest(): number | undefined {
    return this.#heap[0]?.at;
  }

  static #before(a: Timer, b: Timer): boolean {
    return a.at < b.at || (a.at === b.at && a.tie < b.tie);
  }

  #push(timer: Timer): void {
    const heap = this.#heap;
    heap.push(timer);
    let index = heap.length - 1;
    while (index > 0) {
      const parent = (index - 1) >> 1;
      if (!Scheduler.#before(timer, heap[parent] as Timer)) break;
      heap[index] = heap[parent] as Timer;
      index = parent;
    }
    heap[index] = timer;
  }

  #popDue(until: number): Timer | undefined {
    const heap = this.#heap;
    const top = heap[0];
    if (top === undefined || top.at > until) return undefined;
    const last = heap.pop() as Timer;
    if (heap.length > 0) {
      let index = 0;
      for (;;) {
        const left = 2 * index + 1;
        if (left >= heap.length) break;
        const right = left + 1;
        const child =
          right < heap.length && Scheduler.#before(heap[right] as Timer, heap[left] as Timer) ? right : left;
        if (!Scheduler.#before(heap[child] as Timer, last)) break;
        heap[index] = heap[child] as Timer;
        index = child;
      }
      heap[index] = last;
    }
    return top;
  }

  /** Lets every promise that is ready run, and no timer (the end of a run). */
  async settle(): Promise<void> {
    if (this.#saved) await this.#drain(this.#saved);
  }

  /** Lets every promise that is ready run: one real macrotask hop drains the microtask queue. */
  #drain(saved: Saved): Promise<void> {
    return new Promise((resolve) => saved.setImmediate(resolve));
  }

  /**
   * After a timer: lets every promise it made ready run, as `#drain` does, without a turn of the
   * event loop (a setImmediate hop polls the OS once: most of an empty timer's cost, issue 32). Called
   * from the runner's own continuation, a microtask: Node runs a nextTick callback only once the
   * microtask queue is empty (processTicksAndRejections: every queued tick, then runMicrotasks,
   * until both are empty), so when `resolve` runs, every ready continuation of the timer's code has
   * run, chains included. Only a tick queued by other code meanwhile could still be pending (it
   * would run before the runner resumes, its promises after): the runner counts such ticks and then
   * takes the full hop as well, so the order of work is the same as with `#drain` alone.
   */
  #afterTimer(saved: Saved): Promise<void> {
    return new Promise((resolve) => saved.nextTick(resolve));
  }

  /** Replaces the process's timers, clocks and randomness with this scheduler's. */
  install(): void {
    if (this.#saved) return;
    const performanceNow = performance.now.bind(performance);
    const saved: Saved = {
      setTimeout: globalThis.setTimeout,
      clearTimeout: globalThis.clearTimeout,
      setInterval: globalThis.setInterval,
      clearInterval: globalThis.clearInterval,
      setImmediate: globalThis.setImmediate,
      clearImmediate: globalThis.clearImmediate,
      Date: globalThis.Date,
      performanceNow,
      random: Math.random,
      randomUUID: crypto.randomUUID,
      promisesSetTimeout: timersPromises.setTimeout,
      promisesSetImmediate: timersPromises.setImmediate,
      nextTick: process.nextTick,
    };
    this.#saved = saved;
    const self = this;
    const toTimer = (handle: unknown): Timer | undefined => {
      if (handle instanceof VirtualTimeout) return handle.timer;
      if (typeof handle === "number") return this.#byId.get(handle);
      return undefined;
    };
    const g = globalThis as unknown as Record<string, unknown>;
    g.setTimeout = (fn: (...args: unknown[]) => void, ms?: number, ...args: unknown[]) =>
      new VirtualTimeout(
        this.schedule(ms ?? 0, () => fn(...args)),
        this.#byId,
      );
    g.setInterval = (fn: (...args: unknown[]) => void, ms?: number, ...args: unknown[]) =>
      new VirtualTimeout(
        this.schedule(ms ?? 0, () => fn(...args), this.host, ms ?? 0),
        this.#byId,
      );
    g.setImmediate = (fn: (...args: unknown[]) => void, ...args: unknown[]) =>
      new VirtualTimeout(
        this.schedule(0, () => fn(...args)),
        this.#byId,
      );
    g.clearTimeout = (handle: unknown) => this.cancel(toTimer(handle));
    g.clearInterval = g.clearTimeout;
    g.clearImmediate = g.clearTimeout;
    const RealDate = saved.Date;
    class SimDate extends RealDate {
      constructor(...args: unknown[]) {
        if (args.length === 0) super(self.#now);
        else super(...(args as [number]));
      }
      static override now(): number {
        return self.#now;
      }
    }
    g.Date = SimDate;
    Object.defineProperty(performance, "now", {
      value: () => this.#now - SIM_EPOCH_MS,
      configurable: true,
      writable: true,
    });
    Math.random = () => this.random.next();
    const uuid = () => {
      const hex = Array.from({ length: 32 }, () => this.random.int(0, 15).toString(16)).join("");
      return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-4${hex.slice(13, 16)}-a${hex.slice(17, 20)}-${hex.slice(20, 32)}`;
    };
    (crypto as { randomUUID: unknown }).randomUUID = uuid;
    const promises = timersPromises as unknown as Record<string, unknown>;
    promises.setTimeout = <T>(ms?: number, value?: T, options?: { signal?: AbortSignal }) =>
      new Promise<T | undefined>((resolve, reject) => {
        const signal = options?.signal;
        if (signal?.aborted) return reject(abortError(signal));
        const timer = this.schedule(ms ?? 0, () => {
          signal?.removeEventListener("abort", onAbort);
          resolve(value);
        });
        const onAbort = () => {
          this.cancel(timer);
          reject(abortError(signal));
        };
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    promises.setImmediate = <T>(value?: T) =>
      new Promise<T | undefined>((resolve) => this.schedule(0, () => resolve(value)));
    const nextTick = saved.nextTick;
    process.nextTick = (callback: (...args: unknown[]) => void, ...args: unknown[]) => {
      this.#foreignTicks++;
      nextTick(callback, ...args);
    };
    syncBuiltinESMExports();
  }

  /** Puts the real timers, clocks and randomness back. */
  uninstall(): void {
    const saved = this.#saved;
    if (!saved) return;
    const g = globalThis as unknown as Record<string, unknown>;
    g.setTimeout = saved.setTimeout;
    g.clearTimeout = saved.clearTimeout;
    g.setInterval = saved.setInterval;
    g.clearInterval = saved.clearInterval;
    g.setImmediate = saved.setImmediate;
    g.clearImmediate = saved.clearImmediate;
    g.Date = saved.Date;
    Object.defineProperty(performance, "now", {
      value: saved.performanceNow,
      configurable: true,
      writable: true,
    });
    Math.random = saved.random;
    (crypto as { randomUUID: unknown }).randomUUID = saved.randomUUID;
    const promises = timersPromises as unknown as Record<string, unknown>;
    promises.setTimeout = saved.promisesSetTimeout;
    promises.setImmediate = saved.promisesSetImmediate;
    process.nextTick = saved.nextTick;
    syncBuiltinESMExports();
    this.#saved = undefined;
  }
}

function abortError(signal: AbortSignal | undefined): Error {
  const error = new Error("The operation was aborted", { cause: signal?.reason });
  error.name = "AbortError";
  return error;
}
