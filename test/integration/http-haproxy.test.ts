import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import { Haproxy, type ServerState } from "../../src/dev/local-stack/haproxy.ts";
import { freePort } from "../../src/dev/local-stack/processes.ts";
import { WriteWorkload } from "../../src/dev/workload/writer.ts";
import { startChaosCluster, WAIT_MS, waitForNewPrimary } from "../support/chaos-cluster.ts";
import { checkExposition } from "../support/prometheus-text.ts";

/**
 * The agents' HTTP role checks (docs/http.md) with real processes, and a real HAProxy in front
 * of the three nodes checking `GET /primary` as users configure it: a client writing through the
 * one HAProxy address follows a kill -9 failover, loses no acknowledged write, and HAProxy never
 * counts two servers up.
 */

const NODES = ["node-1", "node-2", "node-3"] as const;
const httpPorts = new Map<string, number>();
let cluster: LocalCluster;

beforeAll(async () => {
  for (const id of NODES) httpPorts.set(id, await freePort());
  cluster = await startChaosCluster({
    readyTimeoutMs: 90_000,
    agentEnv: (id) => ({
      SHARDGUARD_HTTP_PORT: String(httpPorts.get(id)),
      SHARDGUARD_HTTP_BIND: "127.0.0.1",
    }),
  });
}, 120_000);

afterAll(async () => {
  await cluster?.stop();
});

const httpOf = (id: string) => `127.0.0.1:${httpPorts.get(id)}`;

async function get(id: string, path: string, method = "GET") {
  const response = await fetch(`http://${httpOf(id)}${path}`, { method, signal: AbortSignal.timeout(5000) });
  return { status: response.status, body: await response.text(), type: response.headers.get("content-type") };
}

describe("the agent's HTTP endpoint", () => {
  it("answers the role checks, the status and the metrics of a healthy shard", {
    timeout: 60_000,
  }, async () => {
    // Prepare: every agent has read the topology with the shard online.
    await cluster.waitFor(
      "node-1 answering /primary with 200",
      async () => (await get("node-1", "/primary")).status === 200,
      WAIT_MS,
    );
    await cluster.waitFor(
      "node-2 and node-3 answering /replica with 200",
      async () =>
        (await get("node-2", "/replica")).status === 200 && (await get("node-3", "/replica")).status === 200,
      WAIT_MS,
    );

    // Act
    const primary = await get("node-1", "/primary");
    const replicaAsPrimary = await get("node-2", "/primary");
    const primaryAsReplica = await get("node-1", "/replica");
    const readOnly = await get("node-1", "/read-only");
    const health = await get("node-3", "/health");
    const head = await get("node-1", "/primary", "HEAD");
    const post = await get("node-1", "/primary", "POST");
    const unknown = await get("node-1", "/nothing-here");
    const status = JSON.parse((await get("node-2", "/status")).body);
    const metrics = await get("node-1", "/metrics");

    // Assess
    expect(primary).toMatchObject({
      status: 200,
      body: "primary, confirmed by the topology, accepting writes\n",
    });
    expect(replicaAsPrimary.status).toBe(503);
    expect(replicaAsPrimary.body).toBe("the database is a replica\n");
    expect(primaryAsReplica).toMatchObject({ status: 503, body: "the database is a primary\n" });
    expect(readOnly.status).toBe(200);
    expect(health.status).toBe(200);
    expect(head).toMatchObject({ status: 200, body: "" });
    expect(post.status).toBe(405);
    expect(unknown.status).toBe(404);
    expect(status).toMatchObject({
      shard: cluster.shard,
      node: "node-2",
      role: "replica",
      fenced: null,
      database_up: true,
      topology: { status: "online", primary: "node-1" },
      checks: { primary: { ok: false }, replica: { ok: true }, health: { ok: true } },
    });
    expect(metrics.type).toContain("text/plain");
    expect(metrics.body).toContain(
      `shardguard_agent_role{role="primary",shard="${cluster.shard}",node="node-1"} 1`,
    );
    expect(metrics.body).toContain(
      `shardguard_agent_check{check="primary",shard="${cluster.shard}",node="node-1"} 1`,
    );
    expect(metrics.body).toMatch(/shardguard_agent_heartbeat_age_seconds\{[^}]*\} \d/);
    expect(metrics.body).toContain("shardguard_agent_process_cpu_seconds_total");
    // Parses as a scraper would, and every metric docs/http.md names is exposed with its type.
    const parsed = checkExposition(metrics.body);
    expect(parsed.problems).toEqual([]);
    const documented = [
      ...readFileSync(new URL("../../docs/http.md", import.meta.url), "utf8").matchAll(
        /^\| `(shardguard_agent_[a-z_]+)(?:\{[^}]*\})?` \| (counter|gauge) \|/gm,
      ),
    ].map(([, name, type]) => ({ name, type }));
    expect(documented.length).toBeGreaterThan(5);
    for (const { name, type } of documented)
      expect({ name, type: parsed.families.get(name ?? "") }).toEqual({ name, type });
  });

  it("routes writes through HAProxy to the one primary across a kill -9 failover, losing none", {
    timeout: 120_000,
  }, async () => {
    // Prepare
    const before = await cluster.topology();
    const oldPrimary = before?.primary_node_id as string;
    const haproxy = await Haproxy.start(
      NODES.map((id) => ({ id, redis: cluster.node(id).address, http: httpOf(id) })),
      { checkIntervalMs: 200 },
    );
    const samples: ServerState[][] = [];
    let sampling = true;
    let sampler: Promise<void> | undefined;
    const writer = new WriteWorkload({ resolvePrimary: async () => haproxy.address, writeIntervalMs: 5 });
    const lastFailures: string[] = [];
    writer.on("failure", (failure) => {
      lastFailures.push(`${failure.kind}: ${failure.message}`);
      lastFailures.splice(0, lastFailures.length - 3);
    });
    try {
      // HAProxy 2.6 counts every server up until its first check: sampled from the first checks on.
      await cluster.waitFor(
        `HAProxy counting ${oldPrimary} up, and only it`,
        async () => {
          const up = (await haproxy.servers()).filter((s) => s.status.startsWith("UP"));
          return up.length === 1 && up[0]?.id === oldPrimary;
        },
        WAIT_MS,
      );
      sampler = (async () => {
        while (sampling) {
          samples.push(await haproxy.servers());
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
      })();
      writer.start();
      await cluster.waitFor("writes acknowledged through HAProxy", () => writer.stats().acked > 100, WAIT_MS);

      // Act
      // The writer stamps its acknowledgements with performance.now().
      const killedAt = performance.now();
      cluster.node(oldPrimary).signal("SIGKILL");
      const after = await waitForNewPrimary(cluster, before?.epoch ?? 0);
      const firstWrite = await writer.waitForAckAfter(killedAt, undefined, WAIT_MS);
      if (firstWrite === undefined) {
        // What each agent answered and what HAProxy saw, for the failure message.
        const statuses = await Promise.all(NODES.map((id) => get(id, "/status").catch((e) => String(e))));
        console.error("no write after the kill", {
          servers: JSON.stringify(samples.slice(-3)),
          lastFailures,
          haproxy: haproxy.output(),
          stats: await haproxy.rawStats(),
          statuses,
          failures: writer.stats().failures,
        });
      }
      await cluster.waitFor("more writes through HAProxy", () => writer.stats().acked > 300, WAIT_MS);
      await writer.stop();
      sampling = false;
      await sampler;
      const client = cluster.node(after.primary_node_id as string).client();
      const verified = await writer.verify(client);
      client.disconnect();
      const upAtOnce = samples.map((servers) =>
        servers.filter((s) => s.status.startsWith("UP")).map((s) => s.id),
      );

      // Assess
      expect(after.primary_node_id).not.toBe(oldPrimary);
      expect(firstWrite, "a write acknowledged through HAProxy after the kill").toBeDefined();
      console.info(
        `first write through HAProxy ${(firstWrite?.at ?? 0) - killedAt} ms after the kill; ${samples.length} samples of HAProxy's servers`,
      );
      expect(samples.length).toBeGreaterThan(10);
      expect(
        upAtOnce.flatMap((up, index) => (up.length > 1 ? [`sample ${index}: ${up.join(", ")}`] : [])),
        `${oldPrimary} killed, ${after.primary_node_id} promoted`,
      ).toEqual([]);
      expect(upAtOnce.some((up) => up.length === 1 && up[0] === after.primary_node_id)).toBe(true);
      expect(verified.checked).toBeGreaterThan(300);
      expect(verified.lost).toEqual([]);
    } finally {
      sampling = false;
      await sampler;
      await writer.stop();
      await haproxy.stop();
    }
  });
});
