import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { DatabaseRecord } from "../../src/agent/db-record.ts";
import { APPLIED_IDS_LIMIT, StateDir } from "../../src/agent/state-dir.ts";
import { waitFor } from "../support/wait.ts";

const dirs: string[] = [];
function aStateDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "shardguard-state-test-"));
  dirs.push(dir);
  return dir;
}

afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe("the agent's state dir", () => {
  it("assigns a node id on first start and keeps it through restarts", () => {
    // Prepare
    const dir = aStateDir();
    const first = StateDir.open(dir, { shard: "s1", now: 1 });
    const assigned = first.nodeId;
    first.release();

    // Act
    const second = StateDir.open(dir, { shard: "s1", now: 2 });

    // Assess
    expect(assigned).toMatch(/^node-[0-9a-f]{10}$/);
    expect(second.nodeId).toBe(assigned);
    expect(second.state.created_at).toBe(1);
    second.release();
  });

  it("keeps the operator's node id and refuses a different one later", () => {
    // Prepare
    const dir = aStateDir();
    StateDir.open(dir, { shard: "s1", nodeId: "redis-a", now: 1 }).release();

    // Act + Assess
    expect(() => StateDir.open(dir, { shard: "s1", nodeId: "redis-b", now: 2 })).toThrowError(
      /--node-id redis-b does not match node id redis-a/,
    );
    const again = StateDir.open(dir, { shard: "s1", now: 3 });
    expect(again.nodeId).toBe("redis-a");
    again.release();
  });

  it("refuses a state dir of another shard", () => {
    // Prepare
    const dir = aStateDir();
    StateDir.open(dir, { shard: "s1", now: 1 }).release();

    // Act + Assess
    expect(() => StateDir.open(dir, { shard: "s2", now: 2 })).toThrowError(/belongs to node .* of shard s1/);
  });

  it("refuses a second agent on the same state dir while the first runs", () => {
    // Prepare
    const dir = aStateDir();
    const first = StateDir.open(dir, { shard: "s1", now: 1 });

    // Act + Assess
    expect(() => StateDir.open(dir, { shard: "s1", now: 2 })).toThrowError(/in use by process/);
    first.release();
    expect(() => StateDir.open(dir, { shard: "s1", now: 3 }).release()).not.toThrow();
  });

  it("takes over the lock of an agent that died", () => {
    // Prepare: a pid far above any pid_max on Linux belongs to no process.
    const dir = aStateDir();
    writeFileSync(join(dir, "agent.lock"), "99999999\n");

    // Act
    const state = StateDir.open(dir, { shard: "s1", now: 1 });

    // Assess
    expect(readFileSync(join(dir, "agent.lock"), "utf8").trim()).toBe(String(process.pid));
    state.release();
  });

  it("takes over the lock of a killed agent that its parent has not reaped yet", async () => {
    // Prepare: `sleep 5` never reaps the background `sleep 0`, which stays a zombie.
    const parent = spawn("sh", ["-c", "sleep 0 & echo $!; exec sleep 5"], {
      stdio: ["ignore", "pipe", "ignore"],
    });
    const zombie = await new Promise<number>((resolve) =>
      parent.stdout.once("data", (data) => resolve(Number(data))),
    );
    // Wait (with a deadline) until the child has exited and is a zombie: on a loaded machine `sleep 0` takes a while.
    const isZombie = () => {
      try {
        return /\) Z /.test(readFileSync(`/proc/${zombie}/stat`, "utf8"));
      } catch {
        return false;
      }
    };
    await waitFor(isZombie, `process ${zombie} to become a zombie`, 10_000, 20);
    const dir = aStateDir();
    writeFileSync(join(dir, "agent.lock"), `${zombie}\n`);

    // Act
    const opened = () => StateDir.open(dir, { shard: "s1", now: 1 });

    // Assess
    try {
      expect(readFileSync(`/proc/${zombie}/stat`, "utf8")).toMatch(/\) Z /);
      const state = opened();
      state.release();
    } finally {
      parent.kill("SIGKILL");
    }
  });

  it("remembers applied commands and the highest epoch across restarts", () => {
    // Prepare
    const dir = aStateDir();
    const state = StateDir.open(dir, { shard: "s1", now: 1 });
    state.recordApplied("c-1", 4, { promoted_epoch: 4 });
    state.recordApplied("c-2", 2);
    state.release();

    // Act
    const reopened = StateDir.open(dir, { shard: "s1", now: 2 });

    // Assess
    expect(reopened.hasApplied("c-1")).toBe(true);
    expect(reopened.hasApplied("c-3")).toBe(false);
    expect(reopened.state.highest_epoch).toBe(4);
    expect(reopened.state.promoted_epoch).toBe(4);
    reopened.release();
  });

  it("keeps the database's identity with the lineage it continues, for the next agent's judgement", () => {
    // Prepare: a promoted primary (a new replid, the old primary's as replid2)
    const dir = aStateDir();
    const state = StateDir.open(dir, { shard: "s1", now: 1 });
    const prior = { repl_id: "lineage-1", offset: 5000 };
    state.update({
      db_identity: { run_id: "run-a", repl_id: "lineage-2", offset: 5010, role: "primary", synced: 0, prior },
    });
    state.release();

    // Act
    const reopened = StateDir.open(dir, { shard: "s1", now: 2 });
    const record = new DatabaseRecord(reopened.state);

    // Assess: a restart is judged against both lineages (sim seed 7011)
    expect(record.identity?.prior).toEqual({ replId: "lineage-1", offset: 5000 });
    reopened.release();
  });

  // 1,005 durable writes (fsync, rename, fsync of the directory): seconds on a busy disk.
  it("bounds the list of applied command ids, dropping the oldest", { timeout: 30_000 }, () => {
    // Prepare
    const state = StateDir.open(aStateDir(), { shard: "s1", now: 1 });

    // Act
    for (let index = 0; index < APPLIED_IDS_LIMIT + 5; index++) state.recordApplied(`c-${index}`, 1);

    // Assess
    expect(state.state.applied_command_ids).toHaveLength(APPLIED_IDS_LIMIT);
    expect(state.hasApplied("c-0")).toBe(false);
    expect(state.hasApplied(`c-${APPLIED_IDS_LIMIT + 4}`)).toBe(true);
    state.release();
  });

  it("writes atomically, leaving no temporary file behind", () => {
    // Prepare
    const dir = aStateDir();
    const state = StateDir.open(dir, { shard: "s1", now: 1 });

    // Act
    state.update({ fence: { saved: { "min-replicas-to-write": "0" }, since: 5 } });
    state.release();

    // Assess
    expect(readdirSync(dir).sort()).toEqual(["state.json"]);
    expect(JSON.parse(readFileSync(join(dir, "state.json"), "utf8")).fence.saved).toEqual({
      "min-replicas-to-write": "0",
    });
  });

  it("refuses a damaged state file instead of inventing a new identity", () => {
    // Prepare
    const dir = aStateDir();
    writeFileSync(join(dir, "state.json"), "{ not json");

    // Act + Assess
    expect(() => StateDir.open(dir, { shard: "s1", now: 1 })).toThrowError(
      /is not valid JSON.*repair or remove it/,
    );
    expect(existsSync(join(dir, "agent.lock"))).toBe(false);
  });
});
