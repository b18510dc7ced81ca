/**
 * The coordination table's shape: the one definition that the CDK app deploys and the
 * local stack creates, so keys and the TTL attribute cannot drift apart.
 */
export const TABLE_KEYS = { partitionKey: "pk", sortKey: "sk" } as const;

/** Attribute DynamoDB TTL reads. It only garbage-collects; no decision depends on it. */
export const TTL_ATTRIBUTE = "ttl";

export const DEFAULT_TABLE_NAME = "shardguard";
export const DEFAULT_QUEUE_PREFIX = "shardguard";

/** The table as a `CreateTable` input (on-demand billing, string keys). */
export function tableDefinition(tableName: string) {
  return {
    TableName: tableName,
    BillingMode: "PAY_PER_REQUEST" as const,
    AttributeDefinitions: [
      { AttributeName: TABLE_KEYS.partitionKey, AttributeType: "S" as const },
      { AttributeName: TABLE_KEYS.sortKey, AttributeType: "S" as const },
    ],
    KeySchema: [
      { AttributeName: TABLE_KEYS.partitionKey, KeyType: "HASH" as const },
      { AttributeName: TABLE_KEYS.sortKey, KeyType: "RANGE" as const },
    ],
  };
}

/** Key builders: the data model of docs/ARCHITECTURE.md in one place. */
export const keys = {
  /** The agents' partition of a shard: heartbeats (`NODE#`) and replica sets (`REPLICAS#`). */
  shardPk: (shard: string) => `SHARD#${shard}`,
  /**
   * The controller's partition of a shard: topology and lock. Apart from the agents' partition so
   * that IAM (`dynamodb:LeadingKeys`, which sees partition keys only) can let agents read it and
   * never write it: only the controller's role changes who is primary (docs/security.md).
   * Installations before it kept both in the shard partition; the store still reads them there
   * and the controller's first topology write moves them (docs/deploy.md#upgrading).
   */
  controlPk: (shard: string) => `CONTROL#${shard}`,
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
  shardIndexPk: "SHARDS",
  shardIndexSk: (shard: string) => `SHARD#${shard}`,
} as const;
