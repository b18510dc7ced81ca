import { describe, expect, it } from "vitest";
import { ModelDriver, SCENARIOS } from "../../src/dev/sim/conformance.ts";

/**
 * The simulator's redis-server model on the conformance scenarios whose redis-server 7.0 answer is
 * recorded here (test/integration/sim-conformance.test.ts compares the model with real processes;
 * this keeps the model honest in the unit suite, without redis-server).
 */

async function onModel(name: string): Promise<Record<string, unknown>> {
  const scenario = SCENARIOS[name];
  if (!scenario) throw new Error(`no conformance scenario ${name}`);
  const model = new ModelDriver();
  await model.start();
  try {
    return await scenario(model);
  } finally {
    model.stop();
  }
}

describe("the redis-server model", () => {
  it("disconnects a replica's own replicas on REPLICAOF NO ONE, so they continue on the promoted node's new replid (seed 5249)", async () => {
    // Prepare: c is chained under b (a replica of a); b is then promoted.
    const name = "a chained replica adopts the replid of its promoted master";

    // Act
    const observed = await onModel(name);

    // Assess: what redis-server 7.0 answers (replicationUnsetMaster: shiftReplicationId, disconnectSlaves).
    expect(observed).toEqual({
      adopted: true,
      chainedKeepsOldAsReplid2: true,
      ackedAfter: 1,
      fullSyncs: 0,
      keys: [15, 15],
    });
  });

  it("pings only from a top-level master: a replica of a replica hears nothing while the top master is silent (demoted-unfed's finding)", async () => {
    // Prepare: c chained under b (a replica of a), repl-ping-replica-period 1; then a paused.
    const name = "a chained replica hears nothing while the top master is silent";

    // Act
    const observed = await onModel(name);

    // Assess: what redis-server 7.0 answers (replicationFeedSlaves returns on a replica; b proxies a's PINGs).
    expect(observed).toEqual({
      cHeardWhileTopAlive: true,
      bSilentWhileTopPaused: true,
      cSilentWhileTopPaused: true,
      links: ["up", "up"],
    });
  });
});

describe("the redis-server model: a sync asked of a replica cut from its master", () => {
  it("refuses it as redis-server does (-NOMASTERLINK): the would-be replica keeps its replid and data (seed 7008)", async () => {
    // Act: b parks (REPLICAOF 127.0.0.1 1), then c asks b for a sync.
    const observed = await onModel("a replica cut from its master refuses its own replica's sync");

    // Assess: what redis-server 7.0 answers (syncCommand: not connected with my master).
    expect(observed).toEqual({ cLink: "down", cKeepsReplid: true, served: 0, cKeys: 10 });
  });
});

describe("the redis-server model's answer to the sampler", () => {
  it("refuses a write sent after a hung primary wakes once its replicas left during the hang (its overdue cron runs first; seed 48242)", async () => {
    // Prepare: a primary demanding both replicas within 2 s, as the write guard sets it.
    const model = new ModelDriver();
    await model.start();
    try {
      const a = model.cluster.servers.get("a");
      if (!a) throw new Error("no server a");
      await model.command("a", ["CONFIG", "SET", "min-replicas-max-lag", "2"]);
      await model.command("a", ["CONFIG", "SET", "min-replicas-to-write", "2"]);
      await model.sleep(1500);
      const before = a.acceptsWrites();
      // Act: a hangs 12 s; its replicas follow another node meanwhile; a wakes.
      await model.pause("a");
      await model.replicaOf("c", "b");
      await model.command("b", ["REPLICAOF", "NO", "ONE"]);
      await model.sleep(12_000);
      await model.resume("a");
      // Assess: in the tick it resumes a fresh write is refused (before: its count of before the hang admitted it).
      expect(before).toBe(true);
      expect(a.acceptsWrites()).toBe(false);
    } finally {
      model.stop();
    }
  });
});

describe("the redis-server model: replication info in an RDB", () => {
  it("saves none for a master that never had a replica: restarted from it, a new id, no replid2, offset 0 (seed 420283's analysis)", async () => {
    // Act: c comes back empty as a master, takes 5 writes, SAVE, kill -9, restart from the RDB.
    const observed = await onModel("an RDB of a master that never had a replica carries no replication id");

    // Assess: what redis-server 7.0.15 answers (rdbPopulateSaveInfo: no backlog, no repl-id/repl-offset).
    expect(observed).toEqual({
      backlogBefore: false,
      role: "primary",
      newReplid: true,
      noReplid2: true,
      offset: 0,
      backlogAfter: false,
      keys: 5,
    });
  });

  it("saves its id and offset for a master a replica attached to once: restarted from it, the RDB's id is its replid2", async () => {
    // Act: a replica attaches to c's empty process and leaves; 5 writes, SAVE, kill -9, restart from the RDB (twice).
    const observed = await onModel("an RDB of a master a replica attached to carries its replication id");

    // Assess: what redis-server 7.0.15 answers (the backlog outlives the replica; loadDataFromDisk keeps one).
    expect(observed).toEqual({
      backlogBefore: true,
      role: "primary",
      newReplid: true,
      replid2IsOld: true,
      replid2UpToSavedOffset: true,
      keepsOffset: true,
      backlogAfter: true,
      keys: 5,
      againReplid2IsPrevious: true,
      againKeys: 7,
    });
  });
});
