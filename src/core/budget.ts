/**
 * The invocation's time budget (Lambda), as pure functions of the time it has left: whether a
 * step may start, and how long a lease to ask for. The one budget of every controller action:
 * failover cycles and operator requests alike.
 */

/** Time a step needs beyond its own bound before it may start (the fenced writes around it, the release). */
export const PHASE_MARGIN_MS = 1000;

/** Shortest lease worth taking or renewing: with less time left, the invocation takes no lock. */
export const MIN_LEASE_MS = 1000;

/** Time needed before the first of `boundsMs` (steps run one after the other) may start: each bound plus the margin. */
export function timeNeeded(boundsMs: readonly number[]): number {
  return boundsMs.reduce((sum, bound) => sum + bound + PHASE_MARGIN_MS, 0);
}

/**
 * The lease to ask for: the configured one, cut to the time the invocation has left, so that a
 * lease never outlives the invocation that can renew it (a controller cut off by its timeout
 * leaves a lock that expires when it stopped). Undefined when less than MIN_LEASE_MS is left:
 * too late to take or extend a lock at all. `remainingMs` is unlimited for a local process.
 */
export function leaseWithin(lockLeaseMs: number, remainingMs: number): number | undefined {
  const lease = Math.min(lockLeaseMs, Math.floor(remainingMs));
  return lease >= MIN_LEASE_MS ? lease : undefined;
}
