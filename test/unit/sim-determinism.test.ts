import { describe, expect, it } from "vitest";
import { EXTRA_FAULT_KINDS, simulate } from "../../src/dev/sim/world.ts";

/**
 * The simulator's promise: a seed and a commit replay one run exactly. Two runs of one seed, with
 * faults, must produce the same event trace byte for byte and the same history.
 */
describe("the simulator", () => {
  it("replays a seed with faults to the same trace, byte for byte", async () => {
    // Prepare
    const options = { seed: 424242, minutes: 1, settleSeconds: 20 };

    // Act
    const first = await simulate(options);
    const second = await simulate(options);

    // Assess
    expect(first.trace.length).toBeGreaterThan(10);
    expect(first.faults).toBeGreaterThan(0);
    expect(second.trace.join("\n")).toBe(first.trace.join("\n"));
    expect(second.writes).toBe(first.writes);
    expect(second.timersFired).toBe(first.timersFired);
    expect(JSON.stringify(second.check.stats)).toBe(JSON.stringify(first.check.stats));
  }, 60_000);

  it("replays the kinds drawn only when asked for, overlapping, to the same trace", async () => {
    // Prepare: every kind the default schedule leaves out (an unmanaged replica, a lagging replica
    // link, per-operation store faults, late SQS copies, a controller frozen mid-failover).
    const options = {
      seed: 31337,
      minutes: 1.5,
      settleSeconds: 20,
      faultKinds: [...EXTRA_FAULT_KINDS],
      overlap: true,
    };

    // Act
    const first = await simulate(options);
    const second = await simulate(options);

    // Assess
    expect(first.faults).toBeGreaterThan(2);
    expect(first.modelErrors).toEqual([]);
    expect(second.trace.join("\n")).toBe(first.trace.join("\n"));
    expect(second.timersFired).toBe(first.timersFired);
  }, 60_000);

  it("adds the agents' info lines to the trace without changing the run (--agent-log info)", async () => {
    // Prepare
    const options = { seed: 424242, minutes: 1, settleSeconds: 20 };

    // Act
    const warn = await simulate(options);
    const info = await simulate({ ...options, agentLog: "info" });

    // Assess: the same run, and a trace with every line of the default one in order, and more.
    expect(info.timersFired).toBe(warn.timersFired);
    expect(info.writes).toBe(warn.writes);
    expect(JSON.stringify(info.check.stats)).toBe(JSON.stringify(warn.check.stats));
    expect(info.trace.filter((line) => / n\d\/agent#\d+ info /.test(line)).length).toBeGreaterThan(0);
    expect(info.trace.filter((line) => !/ n\d\/agent#\d+ info /.test(line))).toEqual(warn.trace);
  }, 60_000);

  it("gives another seed another run", async () => {
    // Prepare
    const base = { minutes: 1, settleSeconds: 20 };

    // Act
    const a = await simulate({ ...base, seed: 1 });
    const b = await simulate({ ...base, seed: 2 });

    // Assess
    expect(b.trace.join("\n")).not.toBe(a.trace.join("\n"));
  }, 60_000);
});
