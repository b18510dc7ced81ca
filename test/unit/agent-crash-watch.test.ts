import { describe, expect, it } from "vitest";
import type { AgentContext } from "../../src/agent/context.ts";
import { isLoopback, recordCrash } from "../../src/agent/crash-watch.ts";

/** The smallest context recordCrash reads and writes, with a settable AWS-aligned clock. */
function aContext(runId = "run-1") {
  let now = 1_800_000_000_000;
  let wakes = 0;
  const lines: string[] = [];
  const ctx = {
    crash: undefined,
    identity: { runId },
    epochContext: {},
    deps: { clock: { now: () => now } },
    logger: { warn: (message: string) => lines.push(message) },
    wakeHeartbeat: () => {
      wakes += 1;
    },
  } as unknown as AgentContext;
  return {
    ctx,
    advance: (ms: number) => {
      now += ms;
    },
    wakes: () => wakes,
    lines,
  };
}

describe("isLoopback", () => {
  it.each([
    ["127.0.0.1", true],
    ["127.1.2.3", true],
    ["localhost", true],
    ["::1", true],
    ["[::1]", true],
    ["10.0.1.17", false],
    ["redis.internal", false],
    ["128.0.0.1", false],
  ])("%s -> %s", (host, expected) => {
    expect(isLoopback(host)).toBe(expected);
  });
});

describe("recordCrash", () => {
  it("wakes the heartbeat on the first observation and once more when a later one confirms it", () => {
    // Prepare
    const { ctx, advance, wakes, lines } = aContext();

    // Act
    recordCrash(ctx, "refused");
    advance(60);
    recordCrash(ctx, "refused");
    advance(60);
    recordCrash(ctx, "refused");
    advance(100);
    recordCrash(ctx, "refused");

    // Assess
    expect(wakes()).toBe(2);
    expect(lines).toEqual(["database died", "database death confirmed"]);
    expect(ctx.crash).toMatchObject({ state: "refused", run_id: "run-1" });
    expect(((ctx.crash?.last_seen ?? 0) - (ctx.crash?.first_seen ?? 0)) / 1000).toBe(220);
  });

  it("keeps the dead process's run_id and first sighting when the state changes, and wakes again", () => {
    const { ctx, advance, wakes } = aContext("old");
    recordCrash(ctx, "refused");
    const first = ctx.crash?.first_seen;
    advance(150);
    recordCrash(ctx, "restarted");

    expect(ctx.crash).toMatchObject({ state: "restarted", run_id: "old", first_seen: first });
    expect(wakes()).toBe(2);
  });
});
