import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ENV } from "../../src/adapters/env.ts";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { buildClockShim } from "../../src/dev/nemesis/clock-shim.ts";
import { TcpProxy } from "../../src/dev/nemesis/tcp-proxy.ts";
import { awsEnv } from "../support/aws.ts";
import {
  CHAOS_CONFIG,
  probeWrite,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
} from "../support/chaos-cluster.ts";
import { rawHeartbeat } from "../support/data-safety.ts";

/**
 * Nemesis seed 6811's second incident (issue 30, finding 5; guarantee 2), with real processes: a
 * primary's redis clock steps back while its agent's store calls are slow. The agent judged the
 * step only inside its heartbeat cycle, whose guard ran after the cycle's store calls: in 6811 the
 * cycle had waited out three store timeouts, and node-125r took writes for 2.1 s beside the new
 * primary. The clock watch now reads the database on its own timer and fences at once
 * (\`runClockWatch\`, src/agent/agent.ts).
 *
 * node-1's agent reaches DynamoDB through a TCP proxy that delays every request 3 s (its store
 * timeout is raised to 5 s, so the calls succeed, slowly: a heartbeat cycle lasts about 6 s; the
 * shard's failure and fence timeouts are raised so that nothing fails over or fences meanwhile).
 * Then node-1's redis-server clock (the nemesis's clock shim) steps back 10 s. On the code before,
 * the fence came after the cycle's store calls, at least 3 s after the step; now within one watch
 * interval plus a round trip. Bound: STEP_FENCE_BOUND_MS, with room for a loaded machine.
 */

/** How long after the step node-1 may still take writes. */
const STEP_FENCE_BOUND_MS = 1_500;
/** The delay node-1's agent's store calls take (each request through the proxy). */
const STORE_DELAY_MS = 3_000;

let shim: string | undefined;
let unavailable: string | undefined;
const dir = mkdtempSync(join(tmpdir(), "shardguard-clock-step-slow-"));
try {
  shim = buildClockShim(dir);
} catch (error) {
  unavailable = `no C compiler for the clock shim: ${String(error)}`;
  console.warn(`clock-step-slow-store test skipped: ${unavailable}`);
}
const clockFile = (id: string) => join(dir, `${id}.offset`);

let cluster: LocalCluster | undefined;
let proxy: TcpProxy | undefined;

afterEach(async () => {
  await cluster?.stop();
  await proxy?.stop();
  cluster = undefined;
  proxy = undefined;
  rmSync(dir, { recursive: true, force: true });
});

describe.runIf(unavailable === undefined)(
  "a primary whose database's clock steps back while its store is slow",
  () => {
    it("refuses writes within one clock-watch interval, not after the cycle's store calls", {
      timeout: 180_000,
    }, async () => {
      // Prepare
      const direct = awsEnv().AWS_ENDPOINT_URL_DYNAMODB;
      if (!direct) throw new Error("no AWS_ENDPOINT_URL_DYNAMODB from the global setup");
      const started = TcpProxy.forUrl(direct, "dynamodb");
      proxy = started;
      await started.start();
      for (const id of ["node-1", "node-2", "node-3"]) writeFileSync(clockFile(id), "0");
      cluster = await startChaosCluster({
        config: { ...CHAOS_CONFIG, failureTimeoutMs: 30_000, fenceTimeoutMs: 25_000 },
        redisEnv: (id) => ({ LD_PRELOAD: shim, SHARDGUARD_CLOCK_FILE: clockFile(id) }),
        agentEnv: (id) =>
          id === "node-1"
            ? { AWS_ENDPOINT_URL_DYNAMODB: started.urlFor(direct), [ENV.storeTimeoutMs]: "5000" }
            : undefined,
        readyTimeoutMs: 90_000,
      });
      const active = cluster;
      await waitForFollowers(active, "node-1", ["node-2", "node-3"]);
      await active.waitFor(
        "node-1 taking writes",
        async () => (await probeWrite(active.node("node-1"), "clock-slow:before")).accepted,
        WAIT_MS,
      );
      started.setMode({ kind: "delay", delayMs: STORE_DELAY_MS });
      // The step must land while a cycle waits on the store: node-1's stored heartbeat ages past
      // its usual cadence (250 ms) while node-1 still takes writes.
      await active.waitFor(
        "node-1's heartbeat aging behind its slow store calls, node-1 still writable",
        async () => {
          const item = await rawHeartbeat(active.shard, "node-1");
          const ageMs = Date.now() - Number(item?.agent_updated ?? 0) / 1000;
          return (
            ageMs > STORE_DELAY_MS / 2 &&
            (await probeWrite(active.node("node-1"), "clock-slow:slow")).accepted
          );
        },
        WAIT_MS,
      );

      // Act: step node-1's redis clock back 10 s.
      const steppedAt = performance.now();
      writeFileSync(clockFile("node-1"), "-10000");
      let refusedAfterMs: number | undefined;
      let refusal: string | undefined;
      await active.waitFor(
        "node-1 refusing writes after the step",
        async () => {
          const probe = await probeWrite(active.node("node-1"), "clock-slow:during");
          if (probe.accepted) return false;
          refusedAfterMs = performance.now() - steppedAt;
          refusal = probe.refusal;
          return true;
        },
        WAIT_MS,
      );

      // Assess
      expect(refusal).toMatch(/NOREPLICAS/);
      expect(refusedAfterMs).toBeLessThan(STEP_FENCE_BOUND_MS);
      started.setMode({ kind: "pass" });
      await active.waitFor(
        "node-1 taking writes again once the step's window is past",
        async () => (await probeWrite(active.node("node-1"), "clock-slow:after")).accepted,
        60_000,
      );
      expect((await active.topology())?.primary_node_id).toBe("node-1");
      expect((await active.topology())?.epoch).toBe(0);
    });
  },
);
