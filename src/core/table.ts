/**
 * The coordination table's shape: the one definition that the CDK app deploys and the
 * local stack creates, so keys and the TTL attribute cannot drift apart.
 */
export const TABLE_KEYS = { partitionKey: "pk", sortKey: "sk" } as const;

/** Attribute DynamoDB TTL reads. It only garbage-collects; no decision depends on it. */
export const TTL_ATTRIBUTE = "ttl";

export const DEFAULT_TABLE_NAME = "shardguard";
export const DEFAULT_QUEUE_PREFIX = "shardguard";

/**
 * The shard index: a sparse global secondary index over the items that carry `index_pk` (the
 * registration item `INDEX` of each shard partition), sorted by the item's own partition key. IAM
 * lets an agent write only its own shard's partition (`dynamodb:LeadingKeys` on `SHARD#<shard>`), and
 * the index's sort key *is* that partition key, so every entry an agent can make names its own shard:
 * a node's credentials cannot register other shards (docs/security.md). Keys only: listing reads
 * nothing but the shard ids.
 */
export const SHARD_INDEX = {
  indexName: "shards",
  partitionKey: "index_pk",
  /** The one value of `index_pk`: every registration lands in one index partition, listed by Query. */
  value: "SHARDS",
} as const;

/** The table as a `CreateTable` input (on-demand billing, string keys, the shard index). */
export function tableDefinition(tableName: string) {
  return {
    TableName: tableName,
    BillingMode: "PAY_PER_REQUEST" as const,
    AttributeDefinitions: [
      { AttributeName: TABLE_KEYS.partitionKey, AttributeType: "S" as const },
      { AttributeName: TABLE_KEYS.sortKey, AttributeType: "S" as const },
      { AttributeName: SHARD_INDEX.partitionKey, AttributeType: "S" as const },
    ],
    KeySchema: [
      { AttributeName: TABLE_KEYS.partitionKey, KeyType: "HASH" as const },
      { AttributeName: TABLE_KEYS.sortKey, KeyType: "RANGE" as const },
    ],
    GlobalSecondaryIndexes: [
      {
        IndexName: SHARD_INDEX.indexName,
        KeySchema: [
          { AttributeName: SHARD_INDEX.partitionKey, KeyType: "HASH" as const },
          { AttributeName: TABLE_KEYS.partitionKey, KeyType: "RANGE" as const },
        ],
        Projection: { ProjectionType: "KEYS_ONLY" as const },
      },
    ],
  };
}

/** Key builders: the data model of docs/ARCHITECTURE.md in one place. */
export const keys = {
  /**
   * The shard-wide partition: one membership item per node (`MEMBER#<node>`, nothing but the id in
   * its sort key), which tells a snapshot whose partitions to read. Every agent of the shard may
   * write here, so nothing in it is trusted beyond a sort key naming a node: a forged or overwritten
   * member item makes a reader look at a partition, never believe anything. Older layouts kept the
   * heartbeats and replica sets here (and before them the topology and lock); a reader honours them
   * only in a shard not yet migrated (`keys.layout`, docs/deploy.md#upgrading).
   */
  shardPk: (shard: string) => `SHARD#${shard}`,
  /**
   * One node's partition: its heartbeat (`NODE#<node>`) and its replica set as primary
   * (`REPLICAS#<node>`). IAM (`dynamodb:LeadingKeys`, which sees partition keys only) lets the
   * node's own agent write here and no other node's, so one node's credentials cannot report for a
   * peer (docs/security.md). Ids never contain `#`, so `NODE#<shard>#*` names one shard's nodes.
   */
  nodePk: (shard: string, node: string) => `NODE#${shard}#${node}`,
  /** Every node partition of a shard, as an IAM `StringLike` pattern (read access). */
  nodePkPattern: (shard: string) => `NODE#${shard}#*`,
  member: (node: string) => `MEMBER#${node}`,
  /**
   * The controller's partition of a shard: topology, lock and the layout marker. Apart from the
   * agents' partitions so that IAM can let agents read it and never write it: only the controller's
   * role changes who is primary (docs/security.md). Installations before it kept topology and lock in
   * the shard partition; the store still reads them there until `shardguard migrate-layout` moves
   * them (docs/deploy.md#upgrading).
   */
  controlPk: (shard: string) => `CONTROL#${shard}`,
  /**
   * The marker in the controller's partition that the shard's nodes write in their own partitions
   * (`keys.nodePk`): written by the controller's first topology write of a new shard and by
   * `shardguard migrate-layout`. Without it a shard is read the older way too (heartbeats in the
   * shard partition) and the controller takes no automatic action while any are there.
   */
  layout: "LAYOUT",
  node: (node: string) => `NODE#${node}`,
  replicas: (primary: string) => `REPLICAS#${primary}`,
  lock: "LOCK",
  topology: "TOPOLOGY",
  /**
   * History has its own partition so that a shard's snapshot query never reads it: the snapshot
   * stays one small Query however many failovers the shard has had.
   */
  historyPk: (shard: string) => `HISTORY#${shard}`,
  /** Zero-padded so that sort-key order is epoch order. */
  history: (epoch: number) => `HISTORY#${String(epoch).padStart(12, "0")}`,
  /**
   * A shard's registration in the shard index (`SHARD_INDEX`): an item in the shard partition that
   * carries `index_pk`. Written by the shard's agents (an idempotent put), each only in its own shard.
   */
  registration: "INDEX",
  /**
   * The shard index of installations before issue 38: one partition every agent could write, so any
   * agent could register any shard id. Agents no longer may; the controller still lists what is
   * there until an operator deletes it (docs/deploy.md#upgrading-the-shard-index).
   */
  shardIndexPk: "SHARDS",
  shardIndexSk: (shard: string) => `SHARD#${shard}`,
} as const;
