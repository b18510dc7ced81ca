import { describe, expect, it } from "vitest";
import { parseGap } from "../../bench/nemesis.ts";
import { FAULT_KINDS, parseFaultKinds, scheduleFaults } from "../../src/dev/nemesis/faults.ts";
import { Random } from "../../src/dev/nemesis/random.ts";

describe("nemesis fault schedule", () => {
  it("replays the same schedule for the same seed", () => {
    const options = { minutes: 10, nodes: 3 };
    expect(scheduleFaults(42, options)).toEqual(scheduleFaults(42, options));
  });

  it("draws a different schedule for a different seed", () => {
    const options = { minutes: 10, nodes: 3 };
    expect(scheduleFaults(1, options)).not.toEqual(scheduleFaults(2, options));
  });

  it("draws every enabled kind, equally often", () => {
    const faults = scheduleFaults(7, { minutes: 30, nodes: 3 });
    const counts = Object.fromEntries(FAULT_KINDS.map((kind) => [kind, 0]));
    for (const fault of faults) counts[fault.kind] = (counts[fault.kind] ?? 0) + 1;
    const values = Object.values(counts);
    expect(Math.min(...values)).toBeGreaterThan(0);
    expect(Math.max(...values) - Math.min(...values)).toBeLessThanOrEqual(1);
  });

  it("draws only the kinds asked for", () => {
    const faults = scheduleFaults(3, { minutes: 5, nodes: 3, faults: ["pause-agent", "kill-redis"] });
    expect(new Set(faults.map((fault) => fault.kind))).toEqual(new Set(["pause-agent", "kill-redis"]));
  });

  it("keeps faults inside the run, in order, at most maxConcurrent at once, after the warm-up", () => {
    for (const seed of [1, 2, 3, 4, 5]) {
      const faults = scheduleFaults(seed, { minutes: 5, nodes: 3, maxConcurrent: 2, warmupMs: 5000 });
      expect(faults.length).toBeGreaterThan(10);
      for (const [index, fault] of faults.entries()) {
        expect(fault.id).toBe(index + 1);
        expect(fault.atMs).toBeGreaterThanOrEqual(5000);
        expect(fault.atMs + fault.durationMs).toBeLessThanOrEqual(5 * 60_000);
        if (index > 0) expect(fault.atMs).toBeGreaterThan(faults[index - 1]?.atMs ?? 0);
        const overlapping = faults.filter(
          (other) => other.atMs <= fault.atMs && fault.atMs < other.atMs + other.durationMs,
        );
        expect(overlapping.length).toBeLessThanOrEqual(2);
      }
    }
  });

  it("pauses a controller past its lock lease and leaves at most one node of three dead for good", () => {
    const faults = scheduleFaults(11, { minutes: 30, nodes: 3, lockLeaseMs: 5000 });
    for (const fault of faults.filter((f) => f.kind === "pause-controller")) {
      expect(fault.durationMs).toBeGreaterThan(5000);
    }
    expect(
      faults.filter((f) => f.kind === "kill-redis" && f.params.restart === "none").length,
    ).toBeLessThanOrEqual(1);
  });

  it("cuts every agent and every controller from the store in a store outage, up to 45 s", () => {
    const outages = scheduleFaults(5, { minutes: 30, nodes: 3, faults: ["store-outage"] });
    expect(outages.length).toBeGreaterThan(20);
    for (const fault of outages) {
      expect(fault.target).toBe("everyone");
      expect(fault.durationMs).toBeGreaterThanOrEqual(3000);
      expect(fault.durationMs).toBeLessThanOrEqual(45_000);
    }
  });

  it("reads a gap range and rejects a bad one by its text", () => {
    expect(parseGap("3000-7000")).toEqual({ min: 3000, max: 7000 });
    expect(() => parseGap("7000-3000")).toThrow(/7000-3000/);
    expect(() => parseGap("fast")).toThrow(/fast/);
    expect(() => parseGap("10-20")).toThrow(/100 <= min/);
  });

  it("rejects an unknown kind by name", () => {
    expect(() => parseFaultKinds("kill-redis,frobnicate")).toThrow(/frobnicate/);
    expect(parseFaultKinds("kill-redis, pause-agent")).toEqual(["kill-redis", "pause-agent"]);
  });

  it("the PRNG is deterministic and spreads over [0, 1)", () => {
    const a = new Random(5);
    const b = new Random(5);
    const draws = Array.from({ length: 1000 }, () => a.next());
    expect(draws).toEqual(Array.from({ length: 1000 }, () => b.next()));
    expect(Math.min(...draws)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...draws)).toBeLessThan(1);
    expect(draws.filter((x) => x < 0.5).length).toBeGreaterThan(400);
  });
});
