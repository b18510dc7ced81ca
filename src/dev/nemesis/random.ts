/**
 * The nemesis's one source of randomness: every choice that shapes a run (which fault, when, on
 * which target spec, how long, which restart mode) is drawn from one `Random` seeded from the run's
 * seed, so the same seed replays the same schedule (not the same outcome: processes and the
 * emulators still race). Nothing in `src/dev/nemesis/` calls `Math.random`.
 *
 * The generator is mulberry32 (Tommy Ettinger, public domain): 32 bits of state, period 2^32,
 * passes gjrand/PractRand to well beyond the few thousand draws a run makes. It is not
 * cryptographic and does not need to be.
 */
export class Random {
  #state: number;

  constructor(seed: number) {
    // Mix the seed once so seeds 1, 2, 3 do not start on neighbouring states.
    this.#state = (Math.imul((seed >>> 0) ^ 0x9e3779b9, 0x85ebca6b) ^ 0xc2b2ae35) >>> 0;
  }

  /** A float in [0, 1). */
  next(): number {
    this.#state = (this.#state + 0x6d2b79f5) >>> 0;
    let t = this.#state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  }

  /** An integer in [min, max] (both inclusive). */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  /** One element of a non-empty list. */
  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new RangeError("pick from an empty list");
    return items[Math.floor(this.next() * items.length)] as T;
  }

  /** True with probability `p`. */
  chance(p: number): boolean {
    return this.next() < p;
  }

  /** An independent generator for a sub-stream (e.g. per node), derived from this one. */
  fork(): Random {
    return new Random(this.int(0, 0xffffffff));
  }
}
