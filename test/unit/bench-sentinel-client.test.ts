import { describe, expect, it } from "vitest";
import { mergeRows } from "../../bench/failover.ts";
import { clientBreakdown, type TrialResult } from "../../bench/lib/report.ts";
import { connectionOf } from "../../bench/lib/sentinel-client-workload.ts";
import { faultOf, ROWS } from "../../bench/systems/types.ts";

function aTrial(overrides: Partial<TrialResult>): TrialResult {
  return {
    trial: 1,
    oldPrimary: "127.0.0.1:1",
    newPrimary: "127.0.0.1:2",
    failoverMs: 1000,
    advertisedMs: 600,
    lostWrites: 0,
    lostAtFailover: 0,
    lostSeqs: [],
    checkedWrites: 10,
    failedWrites: 0,
    advertisedPrimaries: ["127.0.0.1:2"],
    phases: undefined,
    error: undefined,
    ...overrides,
  };
}

const aRow = (fault: (typeof ROWS)[number], median: number) => ({
  fault,
  systems: { shardguard: { median, p99: median, trials: 10, falseFailovers: 0, lost: 0 } },
  ratio: null,
  p99Ratio: null,
});

describe("the sentinel-client row", () => {
  it("is a crash of the primary's redis-server, listed after the fault rows, as is the haproxy row", () => {
    expect(ROWS).toEqual(["crash", "host", "hang", "switchover", "sentinel-client", "haproxy"]);
    expect(faultOf("switchover")).toBe("switchover");
    expect(faultOf("sentinel-client")).toBe("crash");
    expect(faultOf("haproxy")).toBe("crash");
    expect(faultOf("hang")).toBe("hang");
  });

  it("reads which connection to which server answered from CLIENT INFO", () => {
    const info =
      "id=17 addr=127.0.0.1:50412 laddr=127.0.0.1:6380 fd=9 name= age=0 idle=0 flags=N db=0 sub=0 psub=0\n";
    expect(connectionOf(info)).toEqual({ id: "17", laddr: "127.0.0.1:6380" });
    expect(connectionOf(Buffer.from(info))).toEqual({ id: "17", laddr: "127.0.0.1:6380" });
    // addr= is the client's side and must not be taken for laddr.
    expect(connectionOf("id=3 addr=127.0.0.1:1 fd=9")).toBeUndefined();
    expect(connectionOf(undefined)).toBeUndefined();
  });

  it("splits the client's time into discovery and the write guard, from the instants each trial has", () => {
    const breakdown = clientBreakdown([
      aTrial({ failoverMs: 1000, advertisedMs: 600, firstContactMs: 700 }),
      aTrial({ failoverMs: 1200, advertisedMs: 700, firstContactMs: 900 }),
      aTrial({ failoverMs: 900, advertisedMs: undefined, firstContactMs: 800 }),
    ]);
    expect(breakdown?.killToContactMs?.median).toBe(800);
    expect(breakdown?.contactToAckMs?.median).toBe(300);
    expect(breakdown?.advertisedToContactMs?.median).toBe(150);
    expect(breakdown?.advertisedToAckMs?.median).toBe(450);
    expect(clientBreakdown([aTrial({})])).toBeUndefined();
  });

  it("adds its row to the rows file without dropping rows of earlier runs at the same failure timeout", () => {
    const previous = {
      generatedAt: "2026-01-01T00:00:00.000Z",
      config: { failureTimeoutMs: 3000 },
      rows: [aRow("crash", 700), aRow("host", 3400), aRow("hang", 5000)],
    };
    const merged = mergeRows(previous, [{ ...aRow("sentinel-client", 900), measuredAt: "later" }], 3000);
    expect(merged.map((row) => [row.fault, row.measuredAt])).toEqual([
      ["crash", "2026-01-01T00:00:00.000Z"],
      ["host", "2026-01-01T00:00:00.000Z"],
      ["hang", "2026-01-01T00:00:00.000Z"],
      ["sentinel-client", "later"],
    ]);
    const rerun = mergeRows(
      { ...previous, rows: merged },
      [{ ...aRow("crash", 650), measuredAt: "x" }],
      3000,
    );
    expect(rerun.find((row) => row.fault === "crash")?.systems.shardguard?.median).toBe(650);
    expect(rerun.find((row) => row.fault === "sentinel-client")?.measuredAt).toBe("later");
    // Another failure timeout: the earlier rows are not comparable and are dropped.
    expect(mergeRows(previous, [aRow("crash", 650)], 1000).map((row) => row.fault)).toEqual(["crash"]);
    expect(mergeRows(undefined, [aRow("hang", 1)], 3000)).toHaveLength(1);
  });
});
