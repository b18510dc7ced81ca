import { describe, expect, it } from "vitest";
import {
  type BenchConfig,
  buildReport,
  formatReport,
  formatTable,
  type MachineInfo,
  type SystemRun,
  type TrialResult,
} from "../../bench/lib/report.ts";

const config: BenchConfig = {
  trials: 3,
  failureTimeoutMs: 3000,
  systems: ["sentinel", "shardguard"],
  nodeCount: 3,
  quietMs: 5000,
  trialTimeoutMs: 33_000,
  sentinel: { sentinels: 3, quorum: 2, failoverTimeoutMs: 10_000 },
  shardguard: { heartbeatIntervalMs: 1000, tickIntervalMs: 500, fenceTimeoutMs: 2000 },
  writer: { commandTimeoutMs: 250, writeIntervalMs: 2, retryDelayMs: 10 },
};

const machine: MachineInfo = {
  cpus: 2,
  cpuModel: "test cpu",
  node: "v24.0.0",
  platform: "linux",
  totalMemoryGiB: 24,
  loadAverage: [0, 0, 0],
  redisServer: "Redis server v=7.0.15 sha=0",
};

function aTrial(
  trial: number,
  failoverMs: number | undefined,
  overrides: Partial<TrialResult> = {},
): TrialResult {
  return {
    trial,
    oldPrimary: "127.0.0.1:1",
    newPrimary: "127.0.0.1:2",
    failoverMs,
    advertisedMs: failoverMs === undefined ? undefined : failoverMs - 20,
    lostWrites: 0,
    lostAtFailover: 0,
    lostSeqs: [],
    checkedWrites: 100,
    failedWrites: 1,
    advertisedPrimaries: ["127.0.0.1:2"],
    phases: undefined,
    error: undefined,
    ...overrides,
  };
}

function aRun(name: string, trials: TrialResult[], overrides: Partial<SystemRun> = {}): SystemRun {
  return {
    name,
    trials,
    falseFailovers: [],
    quietPeriods: trials.length + 1,
    writer: { attempts: 1000, acked: 990, failedWrites: 10, checkedAtEnd: 990, lostAtEnd: 0 },
    error: undefined,
    ...overrides,
  };
}

describe("the failover report", () => {
  it("divides Shardguard's median by Sentinel's and meets the target at or under 0.8", () => {
    // Prepare
    const runs = [
      aRun("sentinel", [aTrial(1, 4000), aTrial(2, 4200), aTrial(3, 5000)]),
      aRun("shardguard", [aTrial(1, 3000), aTrial(2, 3360), aTrial(3, 3100)], {}),
    ];

    // Act
    const report = buildReport(config, machine, runs);

    // Assess
    expect(report.ratio.value).toBeCloseTo(3100 / 4200);
    expect(report.ratio.p99).toBeCloseTo(3360 / 5000);
    expect(report.ratio.met).toBe(true);
    expect(report.systems[0]?.summary.failoverMs?.median).toBe(4200);
  });

  it("does not count the target as met when Shardguard failed over without a kill", () => {
    // Prepare
    const runs = [
      aRun("sentinel", [aTrial(1, 4000)]),
      aRun("shardguard", [aTrial(1, 2000)], {
        falseFailovers: [
          { when: "after trial 1", from: "a", to: "b", detail: "advertised primary changed to b" },
        ],
      }),
    ];

    // Act
    const report = buildReport(config, machine, runs);

    // Assess
    expect(report.ratio.value).toBe(0.5);
    expect(report.ratio.met).toBe(false);
  });

  it("leaves the ratio unmeasured with one system, and keeps failed trials out of the statistics", () => {
    // Prepare
    const runs = [
      aRun("sentinel", [
        aTrial(1, 4000, { lostWrites: 2, lostSeqs: [7, 8] }),
        aTrial(2, undefined, { error: "no write acknowledged" }),
      ]),
    ];

    // Act
    const report = buildReport(config, machine, runs);
    const text = formatReport(report);

    // Assess
    expect(report.ratio).toMatchObject({ value: null, met: null });
    expect(report.systems[0]?.summary).toMatchObject({ successfulTrials: 1, failedTrials: 1 });
    expect(report.systems[0]?.summary.lostWrites.total).toBe(2);
    expect(text).toContain("Ratio shardguard/sentinel: n/a");
    expect(text).toContain("no write acknowledged");
  });

  it("reports per-phase medians when a system reports phases", () => {
    // Prepare
    const phases = (detection: number) => ({ detection, lock: 40, promote: 300 });
    const runs = [
      aRun("shardguard", [
        aTrial(1, 3000, { phases: phases(2000) }),
        aTrial(2, 3100, { phases: phases(2200) }),
        aTrial(3, 3050, { phases: phases(2100) }),
      ]),
    ];

    // Act
    const report = buildReport(config, machine, runs);

    // Assess
    expect(report.systems[0]?.summary.phases.detection?.median).toBe(2100);
    expect(formatReport(report)).toMatch(/detection\s+lock\s+promote/);
  });

  it("aligns table columns, numbers to the right", () => {
    // Act
    const table = formatTable(
      ["system", "median ms"],
      [
        ["sentinel", "4,210"],
        ["shardguard", "950"],
      ],
    );

    // Assess
    expect(table.split("\n")).toEqual([
      "system      median ms",
      "----------  ---------",
      "sentinel        4,210",
      "shardguard        950",
    ]);
  });
});

describe("the printed report", () => {
  it("puts every per-trial value under its own header", () => {
    // Prepare
    const report = buildReport(config, machine, [
      aRun("sentinel", [aTrial(1, 4321, { lostAtFailover: 2, lostWrites: 5, failedWrites: 7 })]),
    ]);

    // Act
    const lines = formatReport(report).split("\n");
    const header = lines.find((line) => line.startsWith("system") && line.includes("lost at failover")) ?? "";
    const row = lines[lines.indexOf(header) + 2] ?? "";
    const valueUnder = (column: string) => {
      const end = header.indexOf(column) + column.length;
      return row.slice(0, end).trim().split(/\s+/).at(-1);
    };

    // Assess
    expect(valueUnder("failover ms")).toBe("4,321");
    expect(valueUnder("lost at failover")).toBe("2");
    expect(valueUnder("lost in trial")).toBe("5");
    expect(valueUnder("failed writes")).toBe("7");
  });
});
