import { describe, expect, it } from "vitest";
import type { FaultKind } from "../../src/dev/nemesis/faults.ts";
import { runSuiteNemesis } from "../support/suite-nemesis.ts";

/**
 * The suite's run of the `membership` kind (issue 29), beside nemesis.test.ts's run of the others:
 * 90 s in which the node set changes three ways while nodes are killed, agents paused and
 * restarted, and agents cut off from the store. The seed's schedule (pure; chosen by scanning)
 * draws all three changes, one fault at a time: `scale` (3 -> 5 -> 3, at 11 s), `anonymous` (a
 * replica without an agent, at 42 s; it waits while the scale-down still drains: `busyWaitMs`) and
 * `replace` (a node lost for good and replaced by a new node id at a new address, at 63 s); no
 * node is killed for good but the replaced one. The checker, guarantee 3 included, must find the
 * run valid, and the node set must have changed for good.
 */
const SEED = 332_427;
const MINUTES = 1.5;
const FAULTS: FaultKind[] = [
  "membership",
  "kill-redis",
  "pause-agent",
  "restart-agent",
  "partition-agent-store",
];
const SCHEDULE = { gapMinMs: 2000, gapMaxMs: 4000, maxConcurrent: 1 } as const;

describe("nemesis: membership changes", () => {
  it("a 90-second fixed-seed run that scales, replaces and attaches an agentless replica keeps every guarantee the checker checks", {
    timeout: 420_000,
  }, async () => {
    // Prepare, Act
    const { schedule, report, lines, log } = await runSuiteNemesis({
      seed: SEED,
      minutes: MINUTES,
      faults: FAULTS,
      schedule: SCHEDULE,
      // A change waits for a node still busy with the one before (a scale-down drains for 30-50 s).
      busyWaitMs: 40_000,
    });

    // Assess
    const changes = schedule
      .filter((fault) => fault.kind === "membership")
      .map((fault) => fault.params.change);
    expect(changes).toEqual(["scale", "anonymous", "replace"]);
    expect(report.violations, `${log}\nviolations`).toEqual([]);
    expect(report.valid).toBe(true);
    expect(report.settled, `${log}\nsettled`).toBe(true);
    expect(report.availability, `${log}\navailability`).toEqual([]);
    // Every change ran (each waited for the nodes the one before still held), except that the
    // `replace`, drawn last, may find no replica the harness may destroy before the run ends: the
    // copies rule keeps the only intact copies (src/dev/nemesis/copies.ts), and whether one is free
    // by then depends on timing (the nineteenth session's CI and two runs of three alone skipped
    // it, with every guarantee kept). When it runs, the node set must change for good.
    const membership = report.timeline.filter((fault) => fault.kind === "membership");
    const ran = membership.filter((fault) => fault.skipped === undefined).map((fault) => fault.params.change);
    expect(ran.slice(0, 2), `${log}\nmembership changes run`).toEqual(["scale", "anonymous"]);
    const replace = membership.find((fault) => fault.params.change === "replace");
    if (replace?.skipped === undefined) {
      expect(
        lines.some((line) => /membership: node-\d+r joined .*; node-\d+ decommissioned/.test(line)),
        `${log}\nreplacement`,
      ).toBe(true);
    } else {
      expect(replace.skipped, `${log}\nreplace skipped`).toMatch(
        /no replica to replace while another node holds the data intact/,
      );
    }
    expect(report.writes.ackedByReplica).toBeGreaterThan(300);
    expect(report.writes.lost).toBe(0);
  });
});
