import { parseReplicationInfo, type ReplicationInfo } from "../../agent/redis-info.ts";
import { Network } from "./network.ts";
import { SimConnection } from "./redis-client.ts";
import { REDIS_PORT, RedisCluster, RedisServer, type Reply } from "./redis-model.ts";
import { Scheduler } from "./scheduler.ts";

/**
 * Conformance scenarios: scripted steps run against real redis-server processes
 * (test/integration/sim-conformance.test.ts) and against the model, each returning what a client
 * observes (roles, relations between replication ids and offsets, which writes exist, sync counters,
 * which commands were refused). A difference is a bug in the model. Observations are relations
 * (equal offsets, a replid carried as replid2), never raw byte offsets, which differ by design (the
 * model counts 48 bytes per write).
 */

/** Three nodes `a` (primary), `b` and `c` (replicas of `a`), as both worlds start them. */
export type NodeName = "a" | "b" | "c";

export interface Driver {
  command(node: NodeName, args: readonly string[]): Promise<Reply>;
  info(
    node: NodeName,
  ): Promise<ReplicationInfo & { syncFull: number; syncPartialOk: number; keys: number; backlog: boolean }>;
  /** REPLICAOF the other node, by name. */
  replicaOf(node: NodeName, primary: NodeName): Promise<void>;
  /** SIGSTOP / SIGCONT. */
  pause(node: NodeName): Promise<void>;
  resume(node: NodeName): Promise<void>;
  /** SAVE: the node's RDB (dump.rdb) as of now. */
  save(node: NodeName): Promise<void>;
  /** SIGKILL, then the process started again as a master (no `replicaof`): from its RDB, or with no data file. */
  restart(node: NodeName, from: "rdb" | "empty"): Promise<void>;
  /** SIGKILL: the process is gone until `startKilled`. */
  kill(node: NodeName): Promise<void>;
  /**
   * Starts a killed process from its RDB, as a master or with `replicaof` in its config: another
   * node, or an address nothing listens at (127.0.0.1 port 1).
   */
  startKilled(
    node: NodeName,
    from: "rdb",
    options?: { readonly replicaOf?: NodeName | "unreachable" },
  ): Promise<void>;
  /**
   * Sends a command on a second connection to the node and returns at once: `reply` settles when
   * the answer arrives (in the model, while later calls run the world), for a command held by the
   * server (`CLIENT PAUSE`) while the scenario goes on.
   */
  send(node: NodeName, args: readonly string[]): Promise<{ readonly reply: Promise<Reply> }>;
  sleep(ms: number): Promise<void>;
}

async function until(
  driver: Driver,
  what: string,
  test: () => Promise<boolean>,
  timeoutMs = 10_000,
): Promise<void> {
  for (let waited = 0; waited < timeoutMs; waited += 50) {
    if (await test()) return;
    await driver.sleep(50);
  }
  throw new Error(`conformance scenario: ${what} did not happen within ${timeoutMs} ms`);
}

async function linked(driver: Driver, ...nodes: NodeName[]): Promise<void> {
  await until(driver, `${nodes.join(", ")} linked`, async () => {
    for (const node of nodes) if ((await driver.info(node)).primary?.link !== "up") return false;
    return true;
  });
}

async function write(
  driver: Driver,
  node: NodeName,
  from: number,
  count: number,
  replicas: number,
): Promise<number> {
  let acked = 0;
  for (let seq = from; seq < from + count; seq++) {
    await driver.command(node, ["SET", `k:${seq}`, String(seq)]);
    acked = Number(await driver.command(node, ["WAIT", String(replicas), "1000"]));
  }
  return acked;
}

export type Observation = Record<string, unknown>;

export const SCENARIOS: Record<string, (driver: Driver) => Promise<Observation>> = {
  /** REPLICAOF NO ONE keeps the offset and the old replid as replid2; the others continue from it (partial). */
  async "failover keeps the lineage and the others resync partially"(driver) {
    await linked(driver, "b", "c");
    const ackedBefore = await write(driver, "a", 0, 20, 2);
    const a0 = await driver.info("a");
    await until(driver, "b and c at a's offset", async () => {
      const [b, c] = [await driver.info("b"), await driver.info("c")];
      return b.offset === a0.offset && c.offset === a0.offset;
    });
    await driver.command("b", ["REPLICAOF", "NO", "ONE"]);
    const b1 = await driver.info("b");
    await driver.replicaOf("c", "b");
    await driver.replicaOf("a", "b");
    await linked(driver, "a", "c");
    const ackedAfter = await write(driver, "b", 20, 10, 2);
    const [a2, b2, c2] = [await driver.info("a"), await driver.info("b"), await driver.info("c")];
    return {
      ackedBefore,
      promotedRole: b1.role,
      promotedKeepsOffset: b1.offset === a0.offset,
      promotedNewReplid: b1.replId !== a0.replId,
      promotedReplid2IsOld: b1.prior?.replId === a0.replId,
      promotedSecondOffset: b1.prior?.offset === a0.offset,
      ackedAfter,
      partialSyncs: b2.syncPartialOk,
      fullSyncs: b2.syncFull,
      replicasAdoptReplid: a2.replId === b2.replId && c2.replId === b2.replId,
      replicasKeepOldAsReplid2: a2.prior?.replId === a0.replId && c2.prior?.replId === a0.replId,
      keys: [a2.keys, b2.keys, c2.keys],
    };
  },

  /**
   * A replica of a replica learns the new replid when its master is promoted: REPLICAOF NO ONE
   * disconnects it (replicationUnsetMaster) and it continues partially on the new id.
   */
  async "a chained replica adopts the replid of its promoted master"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 10, 2);
    const a0 = await driver.info("a");
    await driver.replicaOf("c", "b");
    await until(driver, "c chained at a's offset", async () => {
      const c = await driver.info("c");
      return c.primary?.link === "up" && c.offset === a0.offset;
    });
    await driver.command("b", ["REPLICAOF", "NO", "ONE"]);
    const b1 = await driver.info("b");
    let adopted = false;
    for (let waited = 0; waited <= 5000 && !adopted; waited += 100) {
      const c = await driver.info("c");
      adopted = c.primary?.link === "up" && c.replId === b1.replId;
      if (!adopted) await driver.sleep(100);
    }
    const ackedAfter = await write(driver, "b", 10, 5, 1);
    const [b2, c2] = [await driver.info("b"), await driver.info("c")];
    return {
      adopted,
      chainedKeepsOldAsReplid2: c2.prior?.replId === a0.replId,
      ackedAfter,
      fullSyncs: b2.syncFull,
      keys: [b2.keys, c2.keys],
    };
  },

  /**
   * Only a top-level master pings its replicas (replicationCron's PING every
   * `repl-ping-replica-period`; replicationFeedSlaves returns at once on a replica); a replica of a
   * replica hears what its master proxies from upstream, so nothing while the top master is silent
   * (the twenty-third session's real-process test demoted-unfed.test.ts: the model's replica pinged
   * its own replicas, keeping their links up for ever; real ones drop after repl-timeout).
   */
  async "a chained replica hears nothing while the top master is silent"(driver) {
    await linked(driver, "b", "c");
    for (const node of ["a", "b", "c"] as const)
      await driver.command(node, ["CONFIG", "SET", "repl-ping-replica-period", "1"]);
    await write(driver, "a", 0, 5, 2);
    const a0 = await driver.info("a");
    await driver.replicaOf("c", "b");
    await until(driver, "c chained at a's offset", async () => {
      const c = await driver.info("c");
      return c.primary?.link === "up" && c.offset >= a0.offset;
    });
    await driver.sleep(3000);
    const heard = (await driver.info("c")).primary?.lastIoSecondsAgo;
    await driver.pause("a");
    await driver.sleep(4500);
    const [b, c] = [await driver.info("b"), await driver.info("c")];
    await driver.resume("a");
    return {
      cHeardWhileTopAlive: heard !== undefined && heard <= 1,
      bSilentWhileTopPaused: (b.primary?.lastIoSecondsAgo ?? 0) >= 3,
      cSilentWhileTopPaused: (c.primary?.lastIoSecondsAgo ?? 0) >= 3,
      links: [b.primary?.link, c.primary?.link],
    };
  },

  /**
   * A replica not connected to its own master refuses a sync ("-NOMASTERLINK Can't SYNC while not
   * connected with my master"): its would-be replica keeps its replid and data, its link down
   * (simulator seed 7008: the model let a parked replica serve one).
   */
  async "a replica cut from its master refuses its own replica's sync"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 10, 2);
    const a0 = await driver.info("a");
    // b parks: nothing listens at port 1.
    await driver.command("b", ["REPLICAOF", "127.0.0.1", "1"]);
    await driver.replicaOf("c", "b");
    await driver.sleep(2500);
    const [b, c] = [await driver.info("b"), await driver.info("c")];
    return {
      cLink: c.primary?.link,
      cKeepsReplid: c.replId === a0.replId,
      served: b.syncFull + b.syncPartialOk,
      cKeys: c.keys,
    };
  },

  /** A replica with writes the promoted node never had resyncs fully and loses them. */
  async "a replica ahead of the promoted node resyncs fully"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 10, 2);
    await driver.command("b", ["REPLICAOF", "NO", "ONE"]);
    // The old primary goes on taking writes: c receives five that b never had.
    await write(driver, "a", 10, 5, 1);
    const cKeysBefore = (await driver.info("c")).keys;
    await driver.replicaOf("c", "b");
    await linked(driver, "c");
    const [b, c] = [await driver.info("b"), await driver.info("c")];
    return {
      cKeysBefore,
      fullSyncs: b.syncFull,
      partialSyncs: b.syncPartialOk,
      bKeys: b.keys,
      cKeys: c.keys,
    };
  },

  /**
   * A master that never had a replica has no replication backlog, so its RDB carries no replication
   * id (Redis 7.0 rdbPopulateSaveInfo): restarted from it, it has a new id, no replid2, offset 0, and
   * the data (simulator seed 420283's analysis assumed the RDB carried the id).
   */
  async "an RDB of a master that never had a replica carries no replication id"(driver) {
    await linked(driver, "b", "c");
    // c comes back empty as a master: a process no replica ever attached to.
    await driver.restart("c", "empty");
    await write(driver, "c", 0, 5, 0);
    const c1 = await driver.info("c");
    await driver.save("c");
    await driver.restart("c", "rdb");
    const c2 = await driver.info("c");
    return {
      backlogBefore: c1.backlog,
      role: c2.role,
      newReplid: c2.replId !== c1.replId,
      noReplid2: c2.prior === undefined,
      offset: c2.offset,
      backlogAfter: c2.backlog,
      keys: c2.keys,
    };
  },

  /**
   * A master a replica attached to once has a backlog, kept after the replica left: its RDB carries
   * its id and offset, and restarted from it the master takes a new id with the RDB's as replid2,
   * continuable up to the RDB's offset, and keeps a backlog (Redis 7 loadDataFromDisk).
   */
  async "an RDB of a master a replica attached to carries its replication id"(driver) {
    await linked(driver, "b", "c");
    await driver.restart("c", "empty");
    await driver.replicaOf("b", "c");
    await linked(driver, "b");
    // The replica goes away (back to a); c keeps its backlog.
    await driver.replicaOf("b", "a");
    await until(driver, "b gone from c", async () => (await driver.info("c")).replicas.length === 0);
    await write(driver, "c", 0, 5, 0);
    const c1 = await driver.info("c");
    await driver.save("c");
    await driver.restart("c", "rdb");
    const c2 = await driver.info("c");
    // Restarted again from an RDB the restarted process saves: it carries that process's id.
    await write(driver, "c", 5, 2, 0);
    const c3 = await driver.info("c");
    await driver.save("c");
    await driver.restart("c", "rdb");
    const c4 = await driver.info("c");
    return {
      backlogBefore: c1.backlog,
      role: c2.role,
      newReplid: c2.replId !== c1.replId,
      replid2IsOld: c2.prior?.replId === c1.replId,
      replid2UpToSavedOffset: c2.prior?.offset === c1.offset,
      keepsOffset: c2.offset === c1.offset,
      backlogAfter: c2.backlog,
      keys: c2.keys,
      againReplid2IsPrevious: c4.prior?.replId === c3.replId && c4.prior?.offset === c3.offset,
      againKeys: c4.keys,
    };
  },

  /** A promoted replica keeps its backlog: its RDB carries the new id, which a restart from it keeps as replid2. */
  async "an RDB of a promoted replica carries its new replication id"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 5, 2);
    await driver.command("b", ["REPLICAOF", "NO", "ONE"]);
    const b1 = await driver.info("b");
    await driver.save("b");
    await driver.restart("b", "rdb");
    const b2 = await driver.info("b");
    return {
      backlogBefore: b1.backlog,
      replid2IsPromotedId: b2.prior?.replId === b1.replId,
      keepsOffset: b2.offset === b1.offset,
      backlogAfter: b2.backlog,
      keys: b2.keys,
    };
  },

  /** WAIT counts only replicas that acknowledged: a stalled replica is not counted. */
  async "WAIT does not count a stalled replica"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 3, 2);
    await driver.pause("b");
    await driver.command("a", ["SET", "k:100", "100"]);
    const waited = Number(await driver.command("a", ["WAIT", "2", "300"]));
    await driver.resume("b");
    await until(driver, "b caught up", async () => (await driver.info("b")).keys === 4);
    const afterResume = Number(await driver.command("a", ["WAIT", "2", "1000"]));
    return { waited, afterResume };
  },

  /** min-replicas-to-write refuses writes once a replica stops acknowledging for max-lag, and accepts again after. */
  async "min-replicas refuses after a replica stops acknowledging"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 2, 2);
    await driver.command("a", ["CONFIG", "SET", "min-replicas-max-lag", "1"]);
    await driver.command("a", ["CONFIG", "SET", "min-replicas-to-write", "2"]);
    const acceptedFirst = await accepts(driver, "a", 1000);
    await driver.pause("b");
    let refusedWithin: number | undefined;
    for (let ms = 0; ms <= 6000; ms += 250) {
      if (!(await accepts(driver, "a", 1001 + ms))) {
        refusedWithin = ms;
        break;
      }
      await driver.sleep(250);
    }
    await driver.resume("b");
    let acceptsAgain = false;
    for (let ms = 0; ms <= 4000 && !acceptsAgain; ms += 250) {
      acceptsAgain = await accepts(driver, "a", 2000 + ms);
      if (!acceptsAgain) await driver.sleep(250);
    }
    return {
      acceptedFirst,
      // Redis compares whole seconds, once a second: refused between 1 and 3.5 s after the stall.
      refusedBetween1And3500ms: refusedWithin !== undefined && refusedWithin >= 1000 && refusedWithin <= 3500,
      acceptsAgain,
    };
  },

  /**
   * SIGKILL of a master: the kernel closes its sockets, and each replica reads the close at once
   * ("Connection with master lost"): its link is down while the master is gone (measured on
   * redis-server 7.0.15: down 20 ms after the kill).
   */
  async "a replica's link goes down at once when its master is killed"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 3, 2);
    await driver.kill("a");
    await driver.sleep(300);
    const [b, c] = [await driver.info("b"), await driver.info("c")];
    return { links: [b.primary?.link, c.primary?.link], keys: [b.keys, c.keys] };
  },

  /**
   * A replica's RDB carries its master's id and offset (rdbPopulateSaveInfo: a connected master):
   * started from it with `replicaof`, it keeps them (loadDataFromDisk: a cached master synthesized
   * from itself) and continues partially from the saved offset.
   */
  async "a replica restarted from its RDB with replicaof resyncs partially"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 10, 2);
    const a0 = await driver.info("a");
    await until(driver, "b at a's offset", async () => (await driver.info("b")).offset === a0.offset);
    await driver.save("b");
    await driver.kill("b");
    const ackedWhileDown = await write(driver, "a", 10, 5, 1);
    const before = await driver.info("a");
    await driver.startKilled("b", "rdb", { replicaOf: "a" });
    await linked(driver, "b");
    const a1 = await driver.info("a");
    await until(driver, "b at a's offset", async () => (await driver.info("b")).offset === a1.offset);
    const b1 = await driver.info("b");
    return {
      ackedWhileDown,
      partialSyncs: a1.syncPartialOk - before.syncPartialOk,
      fullSyncs: a1.syncFull - before.syncFull,
      sameReplid: b1.replId === a1.replId,
      noReplid2: b1.prior === undefined,
      keys: [a1.keys, b1.keys],
    };
  },

  /**
   * An RDB without replication info (a master that never had a replica: rdbPopulateSaveInfo gives
   * nothing) started with `replicaof`: a new id, offset 0, no cached master, so a full sync that
   * replaces its own writes with the master's dataset.
   */
  async "an RDB without replication info restarted with replicaof resyncs fully"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 5, 2);
    await driver.restart("c", "empty");
    await write(driver, "c", 100, 3, 0);
    const c0 = await driver.info("c");
    await driver.save("c");
    await driver.kill("c");
    await write(driver, "a", 5, 5, 1);
    const before = await driver.info("a");
    await driver.startKilled("c", "rdb", { replicaOf: "a" });
    await linked(driver, "c");
    const a1 = await driver.info("a");
    await until(driver, "c at a's offset", async () => (await driver.info("c")).offset === a1.offset);
    const c1 = await driver.info("c");
    return {
      backlogBeforeSave: c0.backlog,
      partialSyncs: a1.syncPartialOk - before.syncPartialOk,
      fullSyncs: a1.syncFull - before.syncFull,
      sameReplid: c1.replId === a1.replId,
      noReplid2: c1.prior === undefined,
      keys: [a1.keys, c1.keys],
    };
  },

  /**
   * Started from its RDB with `replicaof` an address nothing listens at, a replica keeps the RDB's id
   * and offset with its link down; `REPLICAOF` a live primary then continues partially.
   */
  async "a replica restarted with an unreachable replicaof continues partially after REPLICAOF"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 10, 2);
    const a0 = await driver.info("a");
    await until(driver, "b at a's offset", async () => (await driver.info("b")).offset === a0.offset);
    const b0 = await driver.info("b");
    await driver.save("b");
    await driver.kill("b");
    await write(driver, "a", 10, 5, 1);
    await driver.startKilled("b", "rdb", { replicaOf: "unreachable" });
    await driver.sleep(1500);
    const b1 = await driver.info("b");
    const before = await driver.info("a");
    await driver.replicaOf("b", "a");
    await linked(driver, "b");
    const a2 = await driver.info("a");
    await until(driver, "b at a's offset", async () => (await driver.info("b")).offset === a2.offset);
    const b2 = await driver.info("b");
    return {
      parkedRole: b1.role,
      parkedLink: b1.primary?.link,
      parkedKeepsReplid: b1.replId === b0.replId,
      parkedKeepsOffset: b1.offset === b0.offset,
      parkedBacklog: b1.backlog,
      parkedKeys: b1.keys,
      partialSyncs: a2.syncPartialOk - before.syncPartialOk,
      fullSyncs: a2.syncFull - before.syncFull,
      sameReplid: b2.replId === a2.replId,
      keys: [a2.keys, b2.keys],
    };
  },

  /**
   * What a replica that is not linked saves (rdbPopulateSaveInfo: a master, or a cached master, or
   * nothing): one that never linked (from an RDB without replication info, `replicaof` unreachable)
   * saves no id; a master turned replica of an unreachable address saves its own (a cached master
   * synthesized from itself: replicationCacheMasterUsingMyself). Read back by restarting as a master.
   */
  async "an unlinked replica's RDB carries an id only from a cached master"(driver) {
    await linked(driver, "b", "c");
    await driver.restart("c", "empty");
    await write(driver, "c", 100, 3, 0);
    await driver.save("c");
    await driver.kill("c");
    // Never linked: an RDB without replication info, `replicaof` an address nothing listens at.
    await driver.startKilled("c", "rdb", { replicaOf: "unreachable" });
    await driver.sleep(1500);
    const c1 = await driver.info("c");
    await driver.save("c");
    await driver.restart("c", "rdb");
    const c2 = await driver.info("c");
    // A master (no backlog) turned replica of an unreachable address.
    await write(driver, "c", 103, 2, 0);
    const c3 = await driver.info("c");
    await driver.command("c", ["REPLICAOF", "127.0.0.1", "1"]);
    await driver.sleep(1500);
    await driver.save("c");
    await driver.restart("c", "rdb");
    const c4 = await driver.info("c");
    return {
      neverLinkedRole: c1.role,
      neverLinkedLink: c1.primary?.link,
      neverLinkedSavesNoId: c2.replId !== c1.replId && c2.prior === undefined,
      neverLinkedKeys: c2.keys,
      turnedBacklog: c3.backlog,
      turnedSavesOwnId: c4.prior?.replId === c3.replId && c4.prior?.offset === c3.offset,
      turnedKeepsOffset: c4.offset === c3.offset,
      turnedKeys: c4.keys,
    };
  },

  /**
   * A replica started from an RDB with replication info has a cached master but no backlog (Redis 7
   * creates one only on a sync); promoted before it links, it keeps none (REPLICAOF NO ONE discards
   * the cached master), so its RDB carries no id: restarted from it, a new id and no replid2.
   */
  async "a replica promoted before it links from its RDB saves no replication id"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 5, 2);
    const a0 = await driver.info("a");
    await until(driver, "b at a's offset", async () => (await driver.info("b")).offset === a0.offset);
    await driver.save("b");
    await driver.kill("b");
    await driver.startKilled("b", "rdb", { replicaOf: "unreachable" });
    await driver.sleep(1500);
    await driver.command("b", ["REPLICAOF", "NO", "ONE"]);
    const b1 = await driver.info("b");
    await driver.save("b");
    await driver.restart("b", "rdb");
    const b2 = await driver.info("b");
    return {
      promotedRole: b1.role,
      promotedBacklog: b1.backlog,
      promotedReplid2IsRdbs: b1.prior?.replId === a0.replId,
      promotedKeepsOffset: b1.offset === a0.offset,
      restartedNewReplid: b2.replId !== b1.replId,
      restartedNoReplid2: b2.prior === undefined,
      restartedBacklog: b2.backlog,
      keys: b2.keys,
    };
  },

  /**
   * `CLIENT PAUSE <ms> WRITE` holds a write (not refused) while reads answer; it runs when the pause
   * ends, or at `CLIENT UNPAUSE`, and reaches the replicas.
   */
  async "CLIENT PAUSE WRITE holds writes until the pause ends"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 3, 2);
    await driver.command("a", ["CLIENT", "PAUSE", "2000", "WRITE"]);
    const first = await driver.send("a", ["SET", "k:100", "100"]);
    let firstReply: unknown;
    void first.reply.then(
      (value) => (firstReply = value),
      (error: unknown) => (firstReply = String(error)),
    );
    await driver.sleep(500);
    const heldWhilePaused = firstReply === undefined;
    const readWhilePaused = (await driver.command("a", ["KEYS", "*"])) as string[];
    const infoWhilePaused = await driver.info("a");
    await until(driver, "the held write answered", async () => firstReply !== undefined);
    const keysAfterPause = (await driver.info("a")).keys;
    // A long pause ended early by CLIENT UNPAUSE.
    await driver.command("a", ["CLIENT", "PAUSE", "60000", "WRITE"]);
    const second = await driver.send("a", ["SET", "k:101", "101"]);
    let secondReply: unknown;
    void second.reply.then(
      (value) => (secondReply = value),
      (error: unknown) => (secondReply = String(error)),
    );
    await driver.sleep(500);
    const heldUntilUnpause = secondReply === undefined;
    await driver.command("a", ["CLIENT", "UNPAUSE"]);
    await until(driver, "the second held write answered", async () => secondReply !== undefined);
    const a1 = await driver.info("a");
    await until(driver, "b and c at a's offset", async () => {
      const [b, c] = [await driver.info("b"), await driver.info("c")];
      return b.offset === a1.offset && c.offset === a1.offset;
    });
    return {
      heldWhilePaused,
      readWhilePaused: readWhilePaused.length,
      keysWhilePaused: infoWhilePaused.keys,
      firstReply,
      keysAfterPause,
      heldUntilUnpause,
      secondReply,
      keys: [a1.keys, (await driver.info("b")).keys, (await driver.info("c")).keys],
    };
  },

  /**
   * A replica away while fewer writes than the backlog happen continues partially; away while more
   * happen than `repl-backlog-size` (CONFIG SET to Redis's 16 KB minimum), it resyncs fully. It
   * goes away by `REPLICAOF` an address nothing listens at, which keeps its master cached.
   */
  async "a replica away past the backlog resyncs fully"(driver) {
    await linked(driver, "b", "c");
    await write(driver, "a", 0, 10, 2);
    await driver.command("a", ["CONFIG", "SET", "repl-backlog-size", "16384"]);
    const rejoin = async () => {
      const before = await driver.info("a");
      await driver.replicaOf("b", "a");
      await linked(driver, "b");
      const a = await driver.info("a");
      await until(driver, "b at a's offset", async () => (await driver.info("b")).offset === a.offset);
      const b = await driver.info("b");
      return {
        partialSyncs: a.syncPartialOk - before.syncPartialOk,
        fullSyncs: a.syncFull - before.syncFull,
        keys: [a.keys, b.keys],
      };
    };
    const away = async (from: number, count: number) => {
      await driver.command("b", ["REPLICAOF", "127.0.0.1", "1"]);
      await until(driver, "b gone from a", async () => (await driver.info("a")).replicas.length === 1);
      // 2,000 writes of about 130 bytes: over 16 KB in either world (the model counts 48 bytes a write).
      for (let seq = from; seq < from + count; seq++)
        await driver.command("a", ["SET", `k:${seq}`, String(seq).padStart(100, "0")]);
      await driver.sleep(1500);
    };
    await away(10, 10);
    const withinBacklog = await rejoin();
    await away(20, 2000);
    const pastBacklog = await rejoin();
    return { withinBacklog, pastBacklog };
  },
};

async function accepts(driver: Driver, node: NodeName, seq: number): Promise<boolean> {
  try {
    await driver.command(node, ["SET", `k:${seq}`, String(seq)]);
    return true;
  } catch (error) {
    if (/NOREPLICAS/.test(String(error))) return false;
    throw error;
  }
}

/** The model's side: three servers on virtual time, driven until each call settles. */
export class ModelDriver implements Driver {
  readonly sched: Scheduler;
  readonly cluster: RedisCluster;
  readonly #connections = new Map<NodeName, SimConnection>();

  constructor(seed = 1) {
    this.sched = new Scheduler(seed);
    this.cluster = new RedisCluster(this.sched, new Network(this.sched));
  }

  /** Installs virtual time and starts the servers: `a` primary, `b` and `c` its replicas, default config. */
  async start(): Promise<void> {
    this.sched.install();
    const config = new Map([
      ["min-replicas-to-write", "0"],
      ["min-replicas-max-lag", "10"],
    ]);
    for (const name of ["a", "b", "c"])
      new RedisServer(this.cluster, { machine: name, backlogBytes: 1024 * 1024, configFile: config });
    await this.replicaOf("b", "a");
    await this.replicaOf("c", "a");
  }

  stop(): void {
    this.sched.uninstall();
  }

  #server(node: NodeName): RedisServer {
    return this.cluster.servers.get(node) as RedisServer;
  }

  #connection(node: NodeName): SimConnection {
    let connection = this.#connections.get(node);
    if (!connection) {
      connection = new SimConnection(this.cluster, () => "client/test", `${node}:${REDIS_PORT}`, {
        name: "conformance",
        connectTimeoutMs: 60_000,
        reconnectMs: 100,
      });
      this.#connections.set(node, connection);
    }
    return connection;
  }

  async #drive<T>(promise: Promise<T>): Promise<T> {
    let settled = false;
    const done = promise.finally(() => {
      settled = true;
    });
    // Handled by the caller once the scheduler stops; not an unhandled rejection meanwhile.
    done.catch(() => {});
    await this.sched.runUntil(this.sched.now + 600_000, () => settled);
    return done;
  }

  async command(node: NodeName, args: readonly string[]): Promise<Reply> {
    const connection = this.#connection(node);
    if (!connection.ready) await this.#drive(connection.connect());
    return this.#drive(connection.call(args));
  }

  async info(node: NodeName) {
    const text = String(await this.command(node, ["INFO"]));
    const server = this.#server(node);
    return {
      ...parseReplicationInfo(text),
      syncFull: server.syncFull,
      syncPartialOk: server.syncPartialOk,
      keys: server.data.size,
      backlog: /^repl_backlog_active:1$/m.test(text),
    };
  }

  async replicaOf(node: NodeName, primary: NodeName): Promise<void> {
    await this.command(node, ["REPLICAOF", primary, String(REDIS_PORT)]);
  }

  async pause(node: NodeName): Promise<void> {
    this.sched.pause(this.#server(node).host);
  }

  async resume(node: NodeName): Promise<void> {
    this.sched.resume(this.#server(node).host);
  }

  async save(node: NodeName): Promise<void> {
    this.#server(node).save();
  }

  async restart(node: NodeName, from: "rdb" | "empty"): Promise<void> {
    // A new connection to the new process, as the real driver's.
    this.#connections.get(node)?.disconnect();
    this.#connections.delete(node);
    this.#server(node).restart(from);
  }

  async kill(node: NodeName): Promise<void> {
    this.#connections.get(node)?.disconnect();
    this.#connections.delete(node);
    this.#asides.get(node)?.disconnect();
    this.#asides.delete(node);
    this.#server(node).crash();
  }

  async startKilled(
    node: NodeName,
    from: "rdb",
    options: { readonly replicaOf?: NodeName | "unreachable" } = {},
  ): Promise<void> {
    const { replicaOf } = options;
    if (replicaOf === undefined) this.#server(node).restart(from);
    else
      this.#server(node).restart(
        "replicaof",
        replicaOf === "unreachable" ? "127.0.0.1:1" : `${replicaOf}:${REDIS_PORT}`,
      );
  }

  readonly #asides = new Map<NodeName, SimConnection>();

  async send(node: NodeName, args: readonly string[]): Promise<{ readonly reply: Promise<Reply> }> {
    let connection = this.#asides.get(node);
    if (!connection) {
      connection = new SimConnection(this.cluster, () => "client/test", `${node}:${REDIS_PORT}`, {
        name: "conformance-aside",
        connectTimeoutMs: 60_000,
        reconnectMs: 100,
      });
      this.#asides.set(node, connection);
    }
    if (!connection.ready) await this.#drive(connection.connect());
    const reply = connection.call(args);
    // Handled by the scenario when it awaits it; not an unhandled rejection meanwhile.
    reply.catch(() => {});
    return { reply };
  }

  async sleep(ms: number): Promise<void> {
    await this.sched.runUntil(this.sched.now + ms);
  }
}
