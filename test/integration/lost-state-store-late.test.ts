import { afterEach, describe, expect, it } from "vitest";
import { FENCED_START_ARGS, type RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import { AgentFixture, tryWrite } from "../support/agent-harness.ts";
import type { TcpProxy } from "../support/tcp-proxy.ts";
import { waitFor } from "../support/wait.ts";

/**
 * Nemesis seed 7301 (guarantee 1, 36 replica-acknowledged writes lost), with real redis-server
 * processes and agents: the primary's agent restarts without its state dir, its database is
 * killed and comes back from an RDB older than what its replica acknowledged (Redis 7: a new
 * replication id, the old one kept as `master_replid2` up to the RDB's offset), and the new agent
 * cannot reach the store for its first cycles.
 *
 * The new agent judges the process against this node's own stored report on its first snapshot
 * (`judgeAgainstOwnReport`) and rightly fences it. But its down report is built on "the dead
 * process's last answer" (`downHeartbeat`), and the code before took that from the cycles it ran
 * while the store did not answer: the new process's, on the new id. The controller stored that id
 * as the shard's lineage and ruled the replicas holding every write "foreign" (in 7301 the shard
 * came back on a node holding the restarted process's data only). Now the down report is the
 * node's own stored report: the dead process's id and offset, which the replica continues.
 * No controller runs: the report is what the controller would read.
 */

const BEFORE = 50;
const ACKED = 40;

let fixture: AgentFixture;
let proxy: TcpProxy | undefined;

afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
  await fixture.close();
});

async function replicationIds(node: RedisNode): Promise<{ replId: string; replId2: string; offset: number }> {
  const client = node.client({ maxRetriesPerRequest: 0 });
  try {
    const info = String(await client.info("replication"));
    const field = (name: string) => /^(.*)$/m.exec(info.split(`${name}:`)[1] ?? "")?.[1]?.trim() ?? "";
    return {
      replId: field("master_replid"),
      replId2: field("master_replid2"),
      offset: Number(field("master_repl_offset")),
    };
  } finally {
    client.disconnect();
  }
}

describe("an agent restarted without its state beside a primary back from an older RDB, the store late", () => {
  it("reports the dead process's lineage and offset, which the replica holding the writes continues", {
    timeout: 90_000,
  }, async () => {
    // Prepare: n1 primary, n2 its replica; keys on both, then n1's RDB, then writes n2 acknowledges.
    fixture = new AgentFixture();
    const pair = await fixture.linkedPair();
    const { n1, n2 } = pair;
    const client = n1.client();
    try {
      for (let i = 0; i < BEFORE; i++) await client.set(`before:${i}`, "v");
      await client.call("SAVE");
      for (let i = 0; i < ACKED; i++) {
        await client.set(`acked:${i}`, "v");
        expect(await client.wait(1, 1000)).toBe(1);
      }
    } finally {
      client.disconnect();
    }
    const old = await replicationIds(n1);
    await fixture.waitForHeartbeat(
      "n1",
      (hb) => hb.repl_id === old.replId && hb.last_txn_id >= old.offset,
      `n1 reporting ${old.replId}@${old.offset}`,
    );
    const stored = await fixture.heartbeatOf("n1");

    // Act: n1's agent stops; its database dies and is back from its RDB (fenced, as a supervisor
    // starts it); the next agent starts without a state dir, its store cut off for its first cycles.
    await fixture.stopAgent(pair.n1Agent);
    n1.signal("SIGKILL");
    await n1.stop();
    await n1.start({ extraArgs: FENCED_START_ARGS });
    const back = await replicationIds(n1);
    expect(back.replId, "a new replication id").not.toBe(old.replId);
    expect(back.replId2, "the old one kept as replid2").toBe(old.replId);
    expect(back.offset, "back behind what n2 acknowledged").toBeLessThan(old.offset);
    const behind = await fixture.adaptersBehindProxy();
    proxy = behind.proxy;
    await proxy.cut();
    const agent = await fixture.startAgent(n1, { nodeId: "n1" }, behind.aws);
    // Its cycles read the new process while the store does not answer.
    await waitFor(
      () =>
        (agent.logger.lines.some((line) => line.message === "database answers") &&
          agent.logger.lines.some((line) => line.message === "coordination store unreachable")) ||
        undefined,
      "the new agent reading the restarted process with its store cut off",
      15_000,
    );
    await proxy.start();

    // Assess: n1 reported down with the dead process's lineage, past the RDB, which n2 continues.
    const report = await fixture.waitForHeartbeat(
      "n1",
      (hb) => hb.db_status === "down" && (hb.agent_updated ?? 0) > (stored?.agent_updated ?? 0),
      "the new agent's down report",
    );
    expect({ repl_id: report.repl_id, db_crash: report.db_crash?.state }).toEqual({
      repl_id: old.replId,
      db_crash: "restarted",
    });
    expect(report.last_txn_id).toBeGreaterThan(back.offset);
    const replica = await fixture.heartbeatOf("n2");
    expect(replica?.repl_id, "n2 on the dead process's lineage").toBe(old.replId);
    expect(replica?.last_txn_id ?? 0).toBeGreaterThanOrEqual(report.last_txn_id);
    // n1's new process refuses writes (fenced), n2 still holds every acknowledged write.
    expect(await tryWrite(n1, "after")).toMatch(/NOREPLICAS|READONLY/);
    const n2Client = n2.client();
    try {
      expect(await n2Client.exists(...Array.from({ length: ACKED }, (_, i) => `acked:${i}`))).toBe(ACKED);
    } finally {
      n2Client.disconnect();
    }
  });
});
