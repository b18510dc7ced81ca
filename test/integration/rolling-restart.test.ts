import { afterEach, describe, expect, it } from "vitest";
import { rollingRestart } from "../../bench/lib/rolling.ts";
import { LocalCluster } from "../../src/dev/local-cluster.ts";
import { WriteWorkload } from "../../src/dev/workload/writer.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Issue 34, item 5: a rolling restart of all three nodes of a shard under a steady `WAIT 1` writer,
 * driven by the runbook's commands (drain, restart empty, undrain; the primary last, its drain a
 * switchover), default timings, real redis-server, agents and controller. The same driver as
 * `npm run bench:rolling` (bench/lib/rolling.ts).
 */

let cluster: LocalCluster | undefined;
let writer: WriteWorkload | undefined;

afterEach(async () => {
  await writer?.stop();
  await cluster?.stop();
  writer = undefined;
  cluster = undefined;
});

describe("a rolling restart of a shard", () => {
  it("restarts every node with no acknowledged write lost and one switchover, for the primary", {
    timeout: 360_000,
  }, async () => {
    // Prepare
    cluster = await LocalCluster.start({ readyTimeoutMs: 120_000 });
    const active = cluster;
    writer = new WriteWorkload({ resolvePrimary: () => active.primaryAddress(), waitReplicas: 1 });
    writer.start();
    await waitFor(() => (writer?.stats().acked ?? 0) > 50, "acknowledged writes", 30_000);
    const before = await active.topology();

    // Act
    const result = await rollingRestart(active, writer, { log: (line) => process.stderr.write(`${line}\n`) });
    await writer.stop();
    const after = await active.topology();
    const client = active.node(after?.primary_node_id as string).client();
    const verified = await writer.verify(client);
    client.disconnect();
    const history = await active.aws.store.history.list(active.shard, 10);
    process.stderr.write(`rolling restart: ${JSON.stringify(result)}\n`);

    // Assess
    expect(result.steps.map((step) => step.wasPrimary)).toEqual([false, false, true]);
    expect(verified.checked).toBeGreaterThan(100);
    expect(verified.lost).toEqual([]);
    // Only the primary's drain moved the primary: one switchover, no failover.
    expect(after).toMatchObject({ status: "online", epoch: (before?.epoch ?? 0) + 1 });
    expect(after?.drained).toBeUndefined();
    expect(history.map((record) => record.kind)).toEqual(["switchover"]);
    // The bound per primary move is 1.5 s on this machine; held to 3 s (a loaded moment,
    // measured 1.2-3.5 s for switchovers at load 17-19) so that the test reports rather than flakes.
    const primaryStep = result.steps.find((step) => step.wasPrimary);
    expect(primaryStep?.longestGapMs).toBeLessThanOrEqual(3000);
  });
});
