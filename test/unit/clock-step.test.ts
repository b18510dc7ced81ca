import { describe, expect, it } from "vitest";
import { silentLogger } from "../../src/adapters/observability.ts";
import { clockStepFence, clockStepFreeze, FORWARD_STEP_FREEZE_MS } from "../../src/agent/clock-watch.ts";
import type { ReplicationInfo } from "../../src/agent/redis-info.ts";
import { type ClockSample, clockStepBack, clockStepForward } from "../../src/core/clock-step.ts";
import { PROMOTION_FENCE_WINDOW_MS, planWriteGuard } from "../../src/core/write-guard.ts";

/**
 * Issue 30, finding 5 (guarantee 2): Redis's write guard runs on the primary's wall clock, so a
 * backward step keeps a detached replica counted good that much longer. The primary's agent reads
 * the server's clock with every INFO, bracketed by its own monotonic send and receive instants.
 */

/** A read sent at `sent` (agent monotonic ms), answered `rtt` later, the server's clock reading `server`. */
function read(sent: number, server: number, rtt = 2): ClockSample {
  return { serverTimeMs: server, sentAtMs: sent, receivedAtMs: sent + rtt };
}

const T0 = 1_800_000_000_000;

/** Reads that prove no step either way: a pause or a hang only widens the brackets. */
const NO_STEP_EITHER_WAY: ReadonlyArray<{
  name: string;
  previous: ClockSample | undefined;
  next: ClockSample;
  step: undefined;
}> = [
  { name: "no earlier read", previous: undefined, next: read(1000, T0 + 1000), step: undefined },
  {
    name: "the clock advanced with real time",
    previous: read(0, T0),
    next: read(1000, T0 + 1001),
    step: undefined,
  },
  {
    name: "the agent paused after the database answered (the answer arrives late): no step",
    previous: read(0, T0),
    next: { serverTimeMs: T0 + 1000, sentAtMs: 1000, receivedAtMs: 9000 },
    step: undefined,
  },
  {
    name: "the database hung and answered late (its clock reads late too): no step",
    previous: read(0, T0),
    next: { serverTimeMs: T0 + 9000, sentAtMs: 1000, receivedAtMs: 9002 },
    step: undefined,
  },
];

describe("clockStepBack", () => {
  it.each([
    ...NO_STEP_EITHER_WAY,
    {
      name: "the earlier read was slow to arrive (a wide bracket): no step claimed",
      previous: { serverTimeMs: T0, sentAtMs: 0, receivedAtMs: 5000 },
      next: read(5001, T0 + 200),
      step: undefined,
    },
    {
      name: "a forward step is no step back (clockStepForward judges it: the agent's guard reads the lag too)",
      previous: read(0, T0),
      next: read(1000, T0 + 31_000),
      step: undefined,
    },
    {
      name: "a step back within the tolerance",
      previous: read(0, T0),
      next: read(1000, T0 + 100),
      step: undefined,
    },
    {
      name: "a step back of 10 s",
      previous: read(0, T0),
      next: read(1000, T0 + 1000 - 10_000),
      step: { atLeastMs: 9998, atMostMs: 10_002 },
    },
    {
      name: "reads out of order (an INFO used late): nothing judged",
      previous: read(1000, T0),
      next: read(0, T0 - 50_000),
      step: undefined,
    },
  ])("$name", ({ previous, next, step }) => {
    expect(clockStepBack(previous, next)).toEqual(step);
  });
});

/**
 * Nemesis seed 7381 (guarantee 1): a forward step makes every replica's INFO lag read the step too
 * high until its next ACK, while \`WAIT\` still counts it; the agent's guard reads that lag to decide
 * whom it demands.
 */
describe("clockStepForward", () => {
  it.each([
    ...NO_STEP_EITHER_WAY,
    {
      name: "a wide bracket hides a step no larger than its width",
      previous: { serverTimeMs: T0, sentAtMs: 0, receivedAtMs: 5000 },
      next: read(5001, T0 + 5500),
      step: undefined,
    },
    {
      name: "a step back: not a forward step",
      previous: read(0, T0),
      next: read(1000, T0 - 9000),
      step: undefined,
    },
    {
      name: "a forward step within the tolerance",
      previous: read(0, T0),
      next: read(1000, T0 + 1900),
      step: undefined,
    },
    {
      name: "a forward step of 9 s (nemesis seed 7381's heal)",
      previous: read(0, T0),
      next: read(1000, T0 + 10_000),
      step: { atLeastMs: 8998, atMostMs: 9002 },
    },
    {
      name: "an overlapping read (sent before the previous one arrived) is judged too",
      previous: { serverTimeMs: T0, sentAtMs: 100, receivedAtMs: 110 },
      next: { serverTimeMs: T0 + 9050, sentAtMs: 90, receivedAtMs: 130 },
      step: { atLeastMs: 9020, atMostMs: 9070 },
    },
  ])("$name", ({ previous, next, step }) => {
    expect(clockStepForward(previous, next)).toEqual(step);
  });
});

describe("clockStepFence: the agent's watch of its own database", () => {
  function agent() {
    let now = 0;
    return {
      ctx: { logger: silentLogger, epochContext: {}, monotonicNow: () => now },
      advance: (ms: number) => {
        now += ms;
      },
    };
  }
  const info = (role: "primary" | "replica", clock: ClockSample): ReplicationInfo => ({
    role,
    offset: 0,
    replId: "a".repeat(40),
    primary: undefined,
    replicas: [],
    clock,
  });

  it("fences a primary for the step's upper bound plus the promotion window, then lifts by itself", () => {
    const { ctx, advance } = agent();
    expect(clockStepFence(ctx, info("primary", read(0, T0)))).toBeUndefined();
    advance(1000);
    const reason = clockStepFence(ctx, info("primary", read(1000, T0 - 9000)));
    expect(reason).toMatch(/^the database's clock stepped back 9998-10002 ms: .* fenced for 14502 ms$/);
    advance(10_002 + PROMOTION_FENCE_WINDOW_MS - 1);
    expect(clockStepFence(ctx, info("primary", read(1000 + 10_001, T0 + 1001)))).toBe(reason);
    advance(1);
    expect(clockStepFence(ctx, info("primary", read(1000 + 10_003, T0 + 1003)))).toBeUndefined();
  });

  it("freezes the replica set (no fence) for a while after a forward step, then lets go by itself (nemesis seed 7381)", () => {
    const { ctx, advance } = agent();
    expect(clockStepFence(ctx, info("primary", read(0, T0)))).toBeUndefined();
    expect(clockStepFreeze(ctx)).toBeUndefined();
    advance(1000);
    expect(clockStepFence(ctx, info("primary", read(1000, T0 + 10_000)))).toBeUndefined();
    expect(clockStepFreeze(ctx)).toMatch(
      /^the database's clock stepped forward 8998-9002 ms: .* replica set frozen for 4500 ms$/,
    );
    advance(FORWARD_STEP_FREEZE_MS - 1);
    expect(clockStepFence(ctx, info("primary", read(1000 + 4499, T0 + 14_499)))).toBeUndefined();
    expect(clockStepFreeze(ctx)).toBeDefined();
    advance(1);
    expect(clockStepFreeze(ctx)).toBeUndefined();
  });

  it("judges a forward step on a read that overlaps the last one judged (the guard plans from it)", () => {
    const { ctx, advance } = agent();
    clockStepFence(ctx, info("primary", read(0, T0)));
    advance(1000);
    // The watch's read, before the step, arrives while the cycle's read (after the step) is out.
    clockStepFence(ctx, info("primary", { serverTimeMs: T0 + 1000, sentAtMs: 1000, receivedAtMs: 1010 }));
    expect(clockStepFreeze(ctx)).toBeUndefined();
    advance(30);
    clockStepFence(ctx, info("primary", { serverTimeMs: T0 + 10_020, sentAtMs: 990, receivedAtMs: 1030 }));
    expect(clockStepFreeze(ctx)).toMatch(/^the database's clock stepped forward /);
  });

  it("does not fence a replica (it takes no writes), and the same read judged twice proves nothing", () => {
    const { ctx, advance } = agent();
    clockStepFence(ctx, info("replica", read(0, T0)));
    advance(1000);
    expect(clockStepFence(ctx, info("replica", read(1000, T0 - 9000)))).toBeUndefined();
    const again = read(2000, T0 - 8000);
    expect(clockStepFence(ctx, info("primary", again))).toBeUndefined();
    expect(clockStepFence(ctx, info("primary", again))).toBeUndefined();
  });
});

describe("planWriteGuard with a clock step", () => {
  it("drops no member while the lag is untrusted after a forward step (nemesis seed 7381)", () => {
    const plan = planWriteGuard({
      policy: "failsafe",
      role: "primary",
      confirmed: true,
      members: ["n2", "n3"],
      attached: ["n2"],
      msSinceHeartbeatWritten: 0,
      fenceTimeoutMs: 2000,
      restarted: false,
      promotionWindowOpen: false,
      lagUntrusted: "the database's clock stepped forward 8998-9002 ms",
    });
    expect(plan).toMatchObject({ kind: "guard", minReplicas: 2, join: [], leave: [] });
  });

  it("fences a confirmed primary while the step's fence lasts, with its reason", () => {
    const plan = planWriteGuard({
      policy: "failsafe",
      role: "primary",
      confirmed: true,
      members: ["n2"],
      attached: ["n2"],
      msSinceHeartbeatWritten: 0,
      fenceTimeoutMs: 2000,
      restarted: false,
      promotionWindowOpen: false,
      clockStepped: "the database's clock stepped back 9998-10002 ms",
    });
    expect(plan).toEqual({ kind: "fence", reason: "the database's clock stepped back 9998-10002 ms" });
  });
});
