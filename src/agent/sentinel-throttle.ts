export interface AuthThrottlePolicy {
  /** Wrong passwords an address may give before it is made to wait. */
  readonly freeFailures: number;
  /** The first wait; each further failure doubles it. */
  readonly baseBlockMs: number;
  readonly maxBlockMs: number;
  /** An address with no failure for this long starts afresh. */
  readonly forgetAfterMs: number;
  /** Addresses remembered at once (the oldest is forgotten first). */
  readonly maxAddresses: number;
}

export const AUTH_THROTTLE_POLICY: AuthThrottlePolicy = {
  freeFailures: 5,
  baseBlockMs: 1000,
  maxBlockMs: 60_000,
  forgetAfterMs: 10 * 60_000,
  maxAddresses: 4096,
};

interface AddressRecord {
  failures: number;
  lastFailure: number;
  blockedUntil: number;
}

/**
 * Back-off for wrong Sentinel passwords, per client address: a few mistakes are free (a
 * misconfigured client retrying), then every further one blocks the address for twice as long,
 * up to `maxBlockMs`. While blocked, its password attempts are refused without being checked, so
 * opening more connections buys a guesser nothing. Memory is bounded by `maxAddresses`.
 */
export class AuthThrottle {
  readonly #policy: AuthThrottlePolicy;
  readonly #now: () => number;
  readonly #records = new Map<string, AddressRecord>();

  constructor(now: () => number, policy: Partial<AuthThrottlePolicy> = {}) {
    this.#now = now;
    this.#policy = { ...AUTH_THROTTLE_POLICY, ...policy };
  }

  /** ms the address must still wait before its next attempt is checked (0: now). */
  blockedFor(address: string): number {
    const record = this.#current(address);
    return record === undefined ? 0 : Math.max(0, record.blockedUntil - this.#now());
  }

  failed(address: string): void {
    const now = this.#now();
    const record = this.#current(address) ?? { failures: 0, lastFailure: now, blockedUntil: 0 };
    record.failures++;
    record.lastFailure = now;
    const over = record.failures - this.#policy.freeFailures;
    if (over > 0) {
      const wait = Math.min(this.#policy.maxBlockMs, this.#policy.baseBlockMs * 2 ** Math.min(over - 1, 30));
      record.blockedUntil = now + wait;
    }
    // Re-inserted last: the map's order is the order of last failure, oldest first.
    this.#records.delete(address);
    this.#records.set(address, record);
    while (this.#records.size > this.#policy.maxAddresses) {
      const oldest = this.#records.keys().next().value as string;
      this.#records.delete(oldest);
    }
  }

  succeeded(address: string): void {
    this.#records.delete(address);
  }

  get addresses(): number {
    return this.#records.size;
  }

  #current(address: string): AddressRecord | undefined {
    const record = this.#records.get(address);
    if (record === undefined) return undefined;
    const now = this.#now();
    if (now - record.lastFailure > this.#policy.forgetAfterMs && now >= record.blockedUntil) {
      this.#records.delete(address);
      return undefined;
    }
    return record;
  }
}
