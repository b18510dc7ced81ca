import { describe, expect, it } from "vitest";
import { parseReplicationInfo, syncedReplicaAddresses } from "../../src/agent/redis-info.ts";

/** Captured from redis-server 7.0 (CRLF line ends as on the wire). */
const PRIMARY_INFO = [
  "# Replication",
  "role:master",
  "connected_slaves:2",
  "slave0:ip=127.0.0.1,port=7782,state=online,offset=1234,lag=0",
  "slave1:ip=127.0.0.1,port=7783,state=wait_bgsave,offset=0,lag=1",
  "master_failover_state:no-failover",
  "master_replid:2773d60a8bf0a9c4e4586080a5b744ea19f73474",
  "master_replid2:0000000000000000000000000000000000000000",
  "master_repl_offset:1234",
  "second_repl_offset:-1",
  "repl_backlog_active:1",
  "",
].join("\r\n");

const REPLICA_INFO = [
  "# Replication",
  "role:slave",
  "master_host:127.0.0.1",
  "master_port:7781",
  "master_link_status:up",
  "master_last_io_seconds_ago:2",
  "master_sync_in_progress:0",
  "slave_read_repl_offset:1234",
  "slave_repl_offset:1234",
  "slave_priority:100",
  "slave_read_only:1",
  "connected_slaves:0",
  "master_replid:2773d60a8bf0a9c4e4586080a5b744ea19f73474",
  "master_repl_offset:1230",
  "",
].join("\n");

describe("INFO replication parsing", () => {
  it("reads a primary's role, offset, lineage and replicas", () => {
    // Act
    const info = parseReplicationInfo(PRIMARY_INFO);

    // Assess
    expect(info).toMatchObject({
      role: "primary",
      offset: 1234,
      replId: "2773d60a8bf0a9c4e4586080a5b744ea19f73474",
      primary: undefined,
    });
    expect(info.replicas).toEqual([
      { address: "127.0.0.1:7782", state: "online", offset: 1234, lagSeconds: 0 },
      { address: "127.0.0.1:7783", state: "wait_bgsave", offset: 0, lagSeconds: 1 },
    ]);
  });

  it("reads no prior lineage while master_replid2 is all zeros", () => {
    expect(parseReplicationInfo(PRIMARY_INFO).prior).toBeUndefined();
  });

  it("reads the lineage a primary restarted from its RDB continues (master_replid2 up to second_repl_offset - 1)", () => {
    // Prepare: what redis-server 7.0.15 printed after kill -9 and a restart from an RDB saved at offset 50
    const restarted = [
      "# Replication",
      "role:master",
      "connected_slaves:0",
      "master_replid:7af24ad8f2756a6a809113ade1c67bc8725615ce",
      "master_replid2:c02ece86d304cf209b822a1d5b497c551a20fc5c",
      "master_repl_offset:50",
      "second_repl_offset:51",
      "",
    ].join("\r\n");

    // Act
    const info = parseReplicationInfo(restarted);

    // Assess
    expect(info.replId).toBe("7af24ad8f2756a6a809113ade1c67bc8725615ce");
    expect(info.prior).toEqual({ replId: "c02ece86d304cf209b822a1d5b497c551a20fc5c", offset: 50 });
  });

  it("counts only replicas whose full sync completed as synced", () => {
    expect(syncedReplicaAddresses(parseReplicationInfo(PRIMARY_INFO))).toEqual(["127.0.0.1:7782"]);
  });

  it("reads a replica's primary, link state and silence", () => {
    // Act
    const info = parseReplicationInfo(REPLICA_INFO);

    // Assess
    expect(info.role).toBe("replica");
    expect(info.offset).toBe(1230);
    expect(info.primary).toEqual({
      host: "127.0.0.1",
      port: 7781,
      link: "up",
      lastIoSecondsAgo: 2,
      syncInProgress: false,
    });
  });

  it("reports a replica whose link never came up as down with no last contact", () => {
    // Prepare
    const text = REPLICA_INFO.replace("master_link_status:up", "master_link_status:down").replace(
      "master_last_io_seconds_ago:2",
      "master_last_io_seconds_ago:-1",
    );

    // Act
    const info = parseReplicationInfo(text);

    // Assess
    expect(info.primary?.link).toBe("down");
    expect(info.primary?.lastIoSecondsAgo).toBeUndefined();
  });

  it("accepts the primary/replica spelling of newer forks", () => {
    // Prepare
    const text =
      "role:replica\nprimary_host:10.0.0.5\nprimary_port:6380\nprimary_link_status:up\nprimary_repl_offset:77\n";

    // Act
    const info = parseReplicationInfo(text);

    // Assess
    expect(info).toMatchObject({
      role: "replica",
      offset: 77,
      primary: { host: "10.0.0.5", port: 6380, link: "up" },
    });
  });

  it("reads the good-replica count a primary prints while min-replicas-to-write is set, none otherwise", () => {
    const guarded =
      "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmin_slaves_good_slaves:1\r\nmaster_repl_offset:42\r\n";
    expect(parseReplicationInfo(guarded).goodReplicas).toBe(1);
    expect(parseReplicationInfo(PRIMARY_INFO).goodReplicas).toBeUndefined();
  });

  it("rejects text without a role instead of guessing one", () => {
    expect(() => parseReplicationInfo("# Replication\nconnected_slaves:0\n")).toThrowError(/no usable role/);
  });
});
