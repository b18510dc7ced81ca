import {
  ChangeResourceRecordSetsCommand,
  InvalidChangeBatch,
  ListResourceRecordSetsCommand,
  type ResourceRecordSet,
  Route53Client,
} from "@aws-sdk/client-route-53";
import { mockClient } from "aws-sdk-client-mock";
import { beforeEach, describe, expect, it } from "vitest";
import { primaryRecordsFromEnv } from "../../src/adapters/env.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { RETRY_AFTER_MS, Route53PrimaryRecords } from "../../src/adapters/route53-primary-record.ts";
import { runShardCycle } from "../../src/controller/cycle.ts";
import type { ControllerDeps } from "../../src/controller/deps.ts";
import { ConfigurationError } from "../../src/core/errors.ts";
import {
  type CurrentRecords,
  epochTxtValue,
  type PrimaryRecordConfig,
  type PrimaryRecordPublisher,
  planPrimaryRecord,
  primaryRecordSchema,
} from "../../src/core/primary-record.ts";
import { aConfig, aHealthyShard, NOW } from "../support/builders.ts";
import { MemoryEventPublisher, MemoryMetrics } from "../support/controller-fakes.ts";

const CONFIG: PrimaryRecordConfig = primaryRecordSchema.parse({
  hostedZoneId: "Z0123456789",
  name: "Orders.Redis.Example.com.",
  ttl: 5,
});
const NAME = "orders.redis.example.com";
const TXT = `_shardguard.${NAME}`;

const txt = (epoch: number, ttl = 5) => ({ type: "TXT", ttl, values: [epochTxtValue(epoch)] });
const a = (value: string, ttl = 5) => ({ type: "A", ttl, values: [value] });

describe("planPrimaryRecord: one atomic batch fenced by the epoch TXT", () => {
  it.each<{ name: string; current: CurrentRecords; epoch: number; host: string; plan: unknown }>([
    {
      name: "creates the epoch record and the A record on a zone that has neither",
      current: { address: [], epoch: undefined },
      epoch: 3,
      host: "10.0.0.2",
      plan: {
        kind: "change",
        changes: [
          { action: "CREATE", name: TXT, type: "TXT", ttl: 5, values: ['"shardguard-epoch=3"'] },
          { action: "UPSERT", name: NAME, type: "A", ttl: 5, values: ["10.0.0.2"] },
        ],
      },
    },
    {
      name: "deletes the exact epoch record it read, creates the new one, repoints the A record",
      current: { address: [a("10.0.0.1")], epoch: txt(3) },
      epoch: 4,
      host: "10.0.0.2",
      plan: {
        kind: "change",
        changes: [
          { action: "DELETE", name: TXT, type: "TXT", ttl: 5, values: ['"shardguard-epoch=3"'] },
          { action: "CREATE", name: TXT, type: "TXT", ttl: 5, values: ['"shardguard-epoch=4"'] },
          { action: "UPSERT", name: NAME, type: "A", ttl: 5, values: ["10.0.0.2"] },
        ],
      },
    },
    {
      name: "changes nothing when the records already name the primary at this epoch",
      current: { address: [a("10.0.0.2")], epoch: txt(4) },
      epoch: 4,
      host: "10.0.0.2",
      plan: { kind: "current" },
    },
    {
      name: "never points a name carrying a newer epoch back (a stale controller)",
      current: { address: [a("10.0.0.3")], epoch: txt(5) },
      epoch: 4,
      host: "10.0.0.2",
      plan: { kind: "stale" },
    },
    {
      name: "repairs an address changed by hand at the same epoch, still conditioned on the epoch record",
      current: { address: [a("192.0.2.9")], epoch: txt(4) },
      epoch: 4,
      host: "10.0.0.2",
      plan: {
        kind: "change",
        changes: [
          { action: "DELETE", name: TXT, type: "TXT", ttl: 5, values: ['"shardguard-epoch=4"'] },
          { action: "CREATE", name: TXT, type: "TXT", ttl: 5, values: ['"shardguard-epoch=4"'] },
          { action: "UPSERT", name: NAME, type: "A", ttl: 5, values: ["10.0.0.2"] },
        ],
      },
    },
    {
      name: "replaces an A record by a CNAME for a primary known by host name",
      current: { address: [a("10.0.0.1", 60)], epoch: txt(1) },
      epoch: 2,
      host: "Node-2.Internal.",
      plan: {
        kind: "change",
        changes: [
          { action: "DELETE", name: TXT, type: "TXT", ttl: 5, values: ['"shardguard-epoch=1"'] },
          { action: "CREATE", name: TXT, type: "TXT", ttl: 5, values: ['"shardguard-epoch=2"'] },
          { action: "DELETE", name: NAME, type: "A", ttl: 60, values: ["10.0.0.1"] },
          { action: "UPSERT", name: NAME, type: "CNAME", ttl: 5, values: ["node-2.internal"] },
        ],
      },
    },
  ])("$name", ({ current, epoch, host, plan }) => {
    // Act
    const planned = planPrimaryRecord(CONFIG, current, { epoch, host });

    // Assess
    expect(planned).toMatchObject(plan as object);
  });
});

describe("SHARDGUARD_PRIMARY_RECORDS", () => {
  it("parses a map of shard to record, with a 5 s TTL by default and the name normalized", () => {
    const records = primaryRecordsFromEnv({
      SHARDGUARD_PRIMARY_RECORDS: JSON.stringify({
        orders: { hostedZoneId: "Z1", name: "Orders.Example.com." },
      }),
    });
    expect(records).toEqual({ orders: { hostedZoneId: "Z1", name: "orders.example.com", ttl: 5 } });
    expect(primaryRecordsFromEnv({})).toBeUndefined();
  });

  it.each(["{", JSON.stringify({ orders: { hostedZoneId: "/hostedzone/Z1", name: "x" } })])(
    "refuses %s with the variable's name",
    (text) => {
      expect(() => primaryRecordsFromEnv({ SHARDGUARD_PRIMARY_RECORDS: text })).toThrow(ConfigurationError);
      expect(() => primaryRecordsFromEnv({ SHARDGUARD_PRIMARY_RECORDS: text })).toThrow(
        /SHARDGUARD_PRIMARY_RECORDS/,
      );
    },
  );
});

const route53 = mockClient(Route53Client);

/** What Route 53 holds, as ListResourceRecordSets answers it (names fully qualified). */
function zoneHolds(sets: ResourceRecordSet[]) {
  route53.on(ListResourceRecordSetsCommand).callsFake((input: { StartRecordName: string }) => ({
    ResourceRecordSets: sets.filter((set) => (set.Name ?? "") >= `${input.StartRecordName}.`),
    IsTruncated: false,
    MaxItems: 3,
  }));
}

function publisher(now = () => NOW) {
  return new Route53PrimaryRecords({
    client: new Route53Client({ region: "us-east-1" }),
    records: { orders: CONFIG },
    logger: silentLogger,
    now,
  });
}

const changeBatches = () =>
  route53.commandCalls(ChangeResourceRecordSetsCommand).map((call) => call.args[0].input);

describe("Route53PrimaryRecords: the requests it sends", () => {
  beforeEach(() => {
    route53.reset();
  });

  it("sends one batch on a new epoch, conditioned on the epoch record it read, and none again for that epoch", async () => {
    // Prepare
    zoneHolds([
      { Name: `${NAME}.`, Type: "A", TTL: 5, ResourceRecords: [{ Value: "10.0.0.1" }] },
      { Name: `${TXT}.`, Type: "TXT", TTL: 5, ResourceRecords: [{ Value: '"shardguard-epoch=3"' }] },
    ]);
    route53.on(ChangeResourceRecordSetsCommand).resolves({});
    const records = publisher();

    // Act
    await records.sync("orders", 4, "10.0.0.2");
    await records.sync("orders", 4, "10.0.0.2");

    // Assess
    expect(changeBatches()).toEqual([
      {
        HostedZoneId: "Z0123456789",
        ChangeBatch: {
          Comment: "shardguard: shard orders epoch 4",
          Changes: [
            {
              Action: "DELETE",
              ResourceRecordSet: {
                Name: TXT,
                Type: "TXT",
                TTL: 5,
                ResourceRecords: [{ Value: '"shardguard-epoch=3"' }],
              },
            },
            {
              Action: "CREATE",
              ResourceRecordSet: {
                Name: TXT,
                Type: "TXT",
                TTL: 5,
                ResourceRecords: [{ Value: '"shardguard-epoch=4"' }],
              },
            },
            {
              Action: "UPSERT",
              ResourceRecordSet: { Name: NAME, Type: "A", TTL: 5, ResourceRecords: [{ Value: "10.0.0.2" }] },
            },
          ],
        },
      },
    ]);
    // Two reads (the name, its epoch record) for the epoch, none for the repeat.
    expect(route53.commandCalls(ListResourceRecordSetsCommand)).toHaveLength(2);
  });

  it("sends no change when the zone carries a newer epoch (a stale controller cannot point it back)", async () => {
    // Prepare
    zoneHolds([
      { Name: `${NAME}.`, Type: "A", TTL: 5, ResourceRecords: [{ Value: "10.0.0.3" }] },
      { Name: `${TXT}.`, Type: "TXT", TTL: 5, ResourceRecords: [{ Value: '"shardguard-epoch=9"' }] },
    ]);

    // Act
    await publisher().sync("orders", 4, "10.0.0.2");

    // Assess
    expect(changeBatches()).toEqual([]);
  });

  it("reads again after a refused batch (another controller moved the epoch record), waiting 30 s first", async () => {
    // Prepare
    let now = NOW;
    zoneHolds([
      { Name: `${TXT}.`, Type: "TXT", TTL: 5, ResourceRecords: [{ Value: '"shardguard-epoch=3"' }] },
    ]);
    route53
      .on(ChangeResourceRecordSetsCommand)
      .rejectsOnce(
        new InvalidChangeBatch({
          message: "Tried to delete resource record set but it was not found",
          $metadata: {},
        }),
      )
      .resolves({});
    const records = publisher(() => now);

    // Act
    await records.sync("orders", 4, "10.0.0.2");
    await records.sync("orders", 4, "10.0.0.2");
    now += RETRY_AFTER_MS;
    await records.sync("orders", 4, "10.0.0.2");

    // Assess: the refused batch, nothing during the wait, then one more read and batch.
    expect(changeBatches()).toHaveLength(2);
    expect(route53.commandCalls(ListResourceRecordSetsCommand)).toHaveLength(4);
  });

  it("knows only the shards it was given records for", () => {
    expect(publisher().has("orders")).toBe(true);
    expect(publisher().has("carts")).toBe(false);
  });
});

describe("the controller cycle", () => {
  it("brings the record to an online primary's epoch and host after the failover is confirmed", async () => {
    // Prepare
    const synced: string[] = [];
    const primaryRecords: PrimaryRecordPublisher = {
      has: (shard) => shard === "s1",
      sync: async (shard, epoch, host) => {
        synced.push(`${shard} ${epoch} ${host}`);
      },
    };
    const snapshot = aHealthyShard().build();
    const deps = {
      store: { heartbeats: { snapshot: async () => snapshot } },
      config: aConfig(),
      clock: { now: () => NOW },
      log: silentLogger,
      metrics: new MemoryMetrics(),
      events: new MemoryEventPublisher(),
      primaryRecords,
    } as unknown as ControllerDeps;

    // Act
    const result = await runShardCycle(deps, "s1");
    const deferred = await runShardCycle(deps, "s1", { act: false });

    // Assess: once, for the cycle allowed to act.
    expect(result.outcome).toBe("no_action");
    expect(deferred.outcome).toBe("no_action");
    const topology = snapshot.topology;
    expect(synced).toEqual([`s1 ${topology?.epoch} ${topology?.primary_address?.split(":")[0]}`]);
  });
});
