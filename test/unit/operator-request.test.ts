import { describe, expect, it } from "vitest";
import { silentLog } from "../../src/controller/observability.ts";
import { handleOperatorRequest, isOperatorRequest } from "../../src/controller/operator.ts";
import type { ControllerDeps } from "../../src/controller/orchestrator.ts";

// Invalid requests are answered before any store is touched: deps without stores prove it.
const noStores = { log: silentLog } as unknown as ControllerDeps;

describe("operator requests", () => {
  it("tells an operator request from a scheduled event by its action", () => {
    expect(isOperatorRequest({ action: "pause", shard: "s1" })).toBe(true);
    expect(isOperatorRequest({ source: "aws.events", "detail-type": "Scheduled Event" })).toBe(false);
    expect(isOperatorRequest(undefined)).toBe(false);
  });

  it("answers an unknown action with the field and the allowed values", async () => {
    const response = await handleOperatorRequest(noStores, { action: "failover", shard: "s1" });
    expect(response.ok).toBe(false);
    expect(response.reason).toMatch(/^invalid request: action: /);
    expect(response.reason).toMatch(/switchover/);
  });

  it("answers a malformed shard id naming the field", async () => {
    const response = await handleOperatorRequest(noStores, { action: "pause", shard: "no spaces allowed" });
    expect(response).toMatchObject({ ok: false });
    expect(response.reason).toMatch(/shard: must be 1-24 letters/);
  });

  it("refuses a target on anything but a switchover", async () => {
    const response = await handleOperatorRequest(noStores, { action: "pause", shard: "s1", to: "r1" });
    expect(response).toEqual({
      ok: false,
      action: "pause",
      shard: "s1",
      reason: "invalid request: to: only for switchover",
    });
  });
});
