import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../src/adapters/observability.ts";
import type { ControllerDeps } from "../../src/controller/orchestrator.ts";
import { handleOperatorRequest, isOperatorRequest } from "../../src/controller/requests.ts";
import { decide } from "../../src/core/decide.ts";
import type { Topology } from "../../src/core/model.ts";
import { LINEAGE, NOW } from "../support/builders.ts";
import { MemoryShard } from "../support/memory-shard.ts";
import { settled } from "../support/settled.ts";

// Invalid requests are answered before any store is touched: deps without stores prove it.
const noStores = { log: silentLogger } as unknown as ControllerDeps;

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
      reason: "invalid request: to: only for switchover and recover",
    });
  });
});

describe("operator recover: the way out of offline_no_candidate", () => {
  function offlineOnALostLineage(): MemoryShard {
    const shard = new MemoryShard();
    shard.topology = {
      shard: shard.shard,
      epoch: 7,
      status: "offline",
      updated_at: shard.now() - 10_000,
      lineage: { node_id: "p1", repl_id: "a-lineage-no-node-continues", last_txn_id: 5000 },
    };
    return shard;
  }

  it("sets the lineage to the named node's under a new epoch, after which the controller brings the shard online", async () => {
    // Prepare
    const shard = offlineOnALostLineage();
    const stuck = decide(shard.snapshot(), shard.config, shard.now());

    // Act
    const response = await handleOperatorRequest(shard.deps(), {
      action: "recover",
      shard: "s1",
      to: "r1",
      reason: "both survivors restarted on a new lineage; keeping r1's data",
    });

    // Assess
    expect(stuck).toMatchObject({ kind: "none", code: "offline_no_candidate" });
    expect(response).toMatchObject({ ok: true, outcome: "recovered", epoch: 7 });
    expect(shard.topology).toMatchObject({
      epoch: 8,
      status: "offline",
      // The old primary stays named: the offline rules judge membership against it (issue 30, finding 8).
      lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: 990 },
    });
    expect(decide(shard.snapshot(), shard.config, shard.now())).toMatchObject({ kind: "bring_online" });
  });

  it.each([
    ["an online shard", () => new MemoryShard(), "r1", /only an offline shard is recovered/],
    ["a node without a heartbeat", offlineOnALostLineage, "r9", /r9 has no heartbeat/],
  ] as const)("refuses %s, changing nothing", async (_name, prepare, to, reason) => {
    // Prepare
    const shard = prepare();
    const before = structuredClone(shard.topology);

    // Act
    const response = await handleOperatorRequest(shard.deps(), {
      action: "recover",
      shard: "s1",
      to,
      reason: "x",
    });

    // Assess
    expect(response).toMatchObject({ ok: false, outcome: "refused" });
    expect(response.reason).toMatch(reason);
    expect(shard.topology).toEqual(before);
  });

  it("needs a target and a reason", async () => {
    const response = await handleOperatorRequest(noStores, { action: "recover", shard: "s1", to: "r1" });
    expect(response).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/recover needs to .* and reason/),
    });
  });
});

describe("operator drain and undrain", () => {
  it("drains a replica: recorded in the topology, the primary and the epoch unchanged", async () => {
    // Prepare
    const shard = new MemoryShard();
    const before = shard.topology;

    // Act
    const response = await handleOperatorRequest(shard.deps(), { action: "drain", shard: "s1", node: "r2" });

    // Assess
    expect(response).toMatchObject({ ok: true, outcome: "drained" });
    expect(shard.topology).toEqual({ ...before, drained: ["r2"], updated_at: expect.any(Number) });
  });

  it("undrains: the list goes when its last node leaves it", async () => {
    // Prepare
    const shard = new MemoryShard();
    await handleOperatorRequest(shard.deps(), { action: "drain", shard: "s1", node: "r2" });

    // Act
    const response = await handleOperatorRequest(shard.deps(), {
      action: "undrain",
      shard: "s1",
      node: "r2",
    });

    // Assess
    expect(response).toMatchObject({ ok: true, outcome: "undrained" });
    expect(shard.topology?.drained).toBeUndefined();
  });

  it("undrains a node on an offline shard, the way out of priority_zero_ahead_offline (nemesis 7351)", async () => {
    // Prepare: the primary p1 is gone; the drained r2 holds more than r1, so the shard is held
    // offline until an operator undrains r2, and the hold's reason says so.
    const shard = new MemoryShard();
    shard.nodes.delete("p1");
    shard.nodes.set("r2", { role: "replica", primary: "p1", txn: 1000, epoch: 3 });
    shard.topology = {
      shard: shard.shard,
      epoch: 7,
      status: "offline",
      updated_at: shard.now() - 10_000,
      lineage: { node_id: "p1", repl_id: LINEAGE, last_txn_id: 1000 },
      drained: ["r2"],
    };
    const held = decide(shard.snapshot(), shard.config, shard.now());

    // Act
    const response = await handleOperatorRequest(shard.deps(), {
      action: "undrain",
      shard: "s1",
      node: "r2",
    });

    // Assess
    expect(held).toMatchObject({ kind: "none", code: "offline_no_candidate" });
    expect(held.kind === "none" && held.reason).toMatch(/shardguard undrain/);
    expect(response).toMatchObject({ ok: true, outcome: "undrained", epoch: 7 });
    expect(shard.topology).toMatchObject({ epoch: 7, status: "offline" });
    expect(shard.topology?.drained).toBeUndefined();
    expect(decide(shard.snapshot(), shard.config, shard.now())).toMatchObject({
      kind: "bring_online",
      target: { node_id: "r2" },
    });
  });

  it("refuses to drain a node of an offline shard, saying why and changing nothing", async () => {
    // Prepare
    const shard = new MemoryShard();
    shard.topology = { ...(shard.topology as Topology), status: "offline" };
    const before = structuredClone(shard.topology);

    // Act
    const response = await handleOperatorRequest(shard.deps(), { action: "drain", shard: "s1", node: "r2" });

    // Assess
    expect(response).toMatchObject({ ok: false, outcome: "refused" });
    expect(response.reason).toMatch(/offline/);
    expect(shard.topology).toEqual(before);
  });

  it("refuses an unknown node in one sentence, changing nothing", async () => {
    // Prepare
    const shard = new MemoryShard();
    const before = shard.topology;

    // Act
    const response = await handleOperatorRequest(shard.deps(), { action: "drain", shard: "s1", node: "n9" });

    // Assess
    expect(response).toMatchObject({ ok: false, outcome: "refused" });
    expect(response.reason).toMatch(/^unknown node n9: shard s1 has /);
    expect(shard.topology).toBe(before);
  });

  it.each([
    { request: { action: "drain", shard: "s1" }, reason: "invalid request: drain needs node" },
    {
      request: { action: "pause", shard: "s1", node: "r1" },
      reason: "invalid request: node: only for drain and undrain",
    },
  ])("answers $request.action with a misplaced node field: $reason", async ({ request, reason }) => {
    const response = await handleOperatorRequest(noStores, request);
    expect(response).toMatchObject({ ok: false, reason });
  });
});

describe("operator drain of the primary", () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: NOW });
  });

  afterEach(() => {
    vi.useRealTimers();
  });

  it("switches over away from it, then records it drained although the cleanup deleted its heartbeat", async () => {
    // Prepare
    const shard = new MemoryShard();

    // Act
    const response = await settled(
      handleOperatorRequest(shard.deps(), { action: "drain", shard: "s1", node: "p1" }),
    );

    // Assess
    expect(response).toMatchObject({ ok: true, outcome: "drained", primary: "r1" });
    expect(shard.snapshot().nodes.map((node) => node.node_id)).not.toContain("p1");
    expect(shard.topology).toMatchObject({ status: "online", primary_node_id: "r1", drained: ["p1"] });
    expect(shard.history).toMatchObject([{ kind: "switchover", old_primary_node_id: "p1" }]);
  });
});
