import { randomUUID } from "node:crypto";
import {
  type DynamoDBDocumentClient,
  GetCommand,
  PutCommand,
  QueryCommand,
  type QueryCommandOutput,
  TransactWriteCommand,
  UpdateCommand,
} from "@aws-sdk/lib-dynamodb";
import { z } from "zod";
import { describeIssues } from "../core/config.ts";
import { MAX_CLOCK_SKEW_MS } from "../core/decide.ts";
import { ConfigurationError, CoordinationUnavailable, MalformedRecord } from "../core/errors.ts";
import {
  type Heartbeat,
  type HeartbeatInput,
  type HistoryRecord,
  heartbeatSchema,
  historyRecordSchema,
  idSchema,
  type Lock,
  lockSchema,
  type Topology,
  topologySchema,
} from "../core/model.ts";
import type { Logger } from "../core/observability.ts";
import {
  type Clock,
  type CoordinationStore,
  type HeartbeatStore,
  type HistoryStore,
  type LockLease,
  LockLost,
  type LockStore,
  type MalformedItem,
  type ReplicaSetStore,
  type ShardIndex,
  type ShardSnapshot,
  type TopologyStore,
  type WriteFence,
} from "../core/ports.ts";
import { keys, SHARD_INDEX, TTL_ATTRIBUTE } from "../core/table.ts";
import { classifyAwsError, toCoordinationError } from "./aws-errors.ts";
import { stderrLogger } from "./observability.ts";

/** What every DynamoDB adapter shares. */
export interface DynamoTableContext {
  readonly documents: DynamoDBDocumentClient;
  readonly tableName: string;
  /** AWS-aligned clock: lock expiry and TTLs are computed on it. */
  readonly clock: Clock;
  readonly logger?: Logger;
  /** Heartbeats and replica sets of nodes that stopped writing are garbage-collected after this. @default 7 days */
  readonly heartbeatTtlSeconds?: number;
  /** History records are garbage-collected after this. @default 365 days */
  readonly historyTtlSeconds?: number;
}

const DAY_SECONDS = 86_400;

/** Replica set item: the seed's `<primary_id>_replicas` SET. DynamoDB drops an emptied set attribute. */
const replicaSetItemSchema = z.object({
  replicas: z.set(idSchema).optional(),
  /** Bumped by every change; absent on items written before the replica-set guard. */
  version: z.number().int().nonnegative().optional(),
});

const shardIndexItemSchema = z.object({ shard: idSchema });

/**
 * The opaque page token of `ShardIndex.list`: in the shard index, the last shard partition listed
 * (`after`); in the legacy index partition, its LastEvaluatedKey (`legacy`, or `{}` for its start).
 */
const pageTokenSchema = z.union([
  z.strictObject({ after: z.string().startsWith("SHARD#") }),
  z.strictObject({
    legacy: z.union([
      z.strictObject({}),
      z.strictObject({ pk: z.literal(keys.shardIndexPk), sk: z.string().startsWith("SHARD#") }),
    ]),
  }),
]);
type PageToken = z.output<typeof pageTokenSchema>;

/** Base of the DynamoDB adapters: one place for error mapping, validation and TTLs. */
class DynamoTable {
  protected readonly documents: DynamoDBDocumentClient;
  protected readonly tableName: string;
  protected readonly clock: Clock;
  protected readonly logger: Logger;
  protected readonly heartbeatTtlSeconds: number;
  protected readonly historyTtlSeconds: number;

  constructor(context: DynamoTableContext) {
    this.documents = context.documents;
    this.tableName = context.tableName;
    this.clock = context.clock;
    this.logger = context.logger ?? stderrLogger;
    this.heartbeatTtlSeconds = context.heartbeatTtlSeconds ?? 7 * DAY_SECONDS;
    this.historyTtlSeconds = context.historyTtlSeconds ?? 365 * DAY_SECONDS;
  }

  /** Runs one SDK call; unreachable, refusing or missing table -> CoordinationUnavailable. */
  protected async call<T>(operation: string, send: () => Promise<T>): Promise<T> {
    try {
      return await send();
    } catch (error) {
      throw toCoordinationError(error, {
        operation: `DynamoDB ${operation} on table "${this.tableName}"`,
        missingHint:
          "deploy Shardguard (cdk deploy) or start `shardguard local-stack` and export the environment it prints (SHARDGUARD_TABLE, AWS_ENDPOINT_URL_DYNAMODB)",
      });
    }
  }

  /** Like `call`, but a failed condition returns false instead of throwing. */
  protected async conditional(operation: string, send: () => Promise<unknown>): Promise<boolean> {
    try {
      await this.call(operation, send);
      return true;
    } catch (error) {
      if (classifyAwsError(error) === "conditional") return false;
      throw error;
    }
  }

  /**
   * One TransactWriteItems: `items` after the lock check of `fence` (and its replica-set check).
   * Returns the indexes (into `items`) whose condition failed, empty when everything was
   * written. The lock check failing throws LockLost; a conflict with a concurrent transaction
   * is retried (nothing was written); the SDK's own retries reuse one ClientRequestToken, so a
   * retried request that had landed is not applied twice.
   */
  protected async fencedTransaction(
    operation: string,
    fence: WriteFence,
    items: readonly TransactItem[],
  ): Promise<number[]> {
    const checks = [lockCheck(this.tableName, fence.lease)];
    if (fence.replicaSet) checks.push(replicaSetCheck(this.tableName, fence.lease.shard, fence.replicaSet));
    for (let attempt = 1; ; attempt++) {
      const codes = await this.call(`TransactWriteItems (${operation})`, async () => {
        try {
          await this.documents.send(new TransactWriteCommand({ TransactItems: [...checks, ...items] }));
          return [];
        } catch (error) {
          const reasons = cancellationCodes(error);
          if (reasons === undefined) throw error;
          return reasons;
        }
      });
      if (codes[0] === "ConditionalCheckFailed") {
        throw new LockLost(
          `${operation}: the lock of shard ${fence.lease.shard} is no longer held by ${fence.lease.owner} (fence ${fence.lease.fence}); nothing written`,
        );
      }
      // -1: the replica-set check; 0..: the items.
      const failed = codes.flatMap((code, index) =>
        code === "ConditionalCheckFailed" ? [index - checks.length] : [],
      );
      if (failed.length > 0 || codes.length === 0) return failed;
      if (!codes.includes("TransactionConflict") || attempt >= TRANSACTION_CONFLICT_ATTEMPTS) {
        throw new CoordinationUnavailable(`TransactWriteItems (${operation}) cancelled: ${codes.join(", ")}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20 * attempt));
    }
  }

  /**
   * A node's member item: the id in its sort key is all a reader takes from it (any agent of the
   * shard can write the shard partition). TTL twice the heartbeat's (see DynamoHeartbeatStore).
   */
  protected memberItem(shard: string, node: string): Record<string, unknown> {
    return {
      pk: keys.shardPk(shard),
      sk: keys.member(node),
      [TTL_ATTRIBUTE]: this.ttlIn(2 * this.heartbeatTtlSeconds),
    };
  }

  /** Every item of partition `pk`, strongly consistent (more pages only past 1 MB). */
  protected async queryAll(operation: string, pk: string): Promise<Record<string, unknown>[]> {
    const items: Record<string, unknown>[] = [];
    let startKey: Record<string, unknown> | undefined;
    do {
      const page: QueryCommandOutput = await this.call(operation, () =>
        this.documents.send(
          new QueryCommand({
            TableName: this.tableName,
            KeyConditionExpression: "pk = :pk",
            ExpressionAttributeValues: { ":pk": pk },
            ConsistentRead: true,
            ExclusiveStartKey: startKey,
          }),
        ),
      );
      items.push(...(page.Items ?? []));
      startKey = page.LastEvaluatedKey;
    } while (startKey);
    return items;
  }

  /** TTL attribute value (epoch seconds) `seconds` from now. */
  protected ttlIn(seconds: number): number {
    return Math.ceil(this.clock.now() / 1000) + seconds;
  }

  protected requireId(what: string, value: string): void {
    const result = idSchema.safeParse(value);
    if (!result.success)
      throw new ConfigurationError(`invalid ${what} "${value}": ${result.error.issues[0]?.message}`);
  }
}

/** One item of a TransactWriteItems request (the document client's shape). */
type TransactItem = NonNullable<
  ConstructorParameters<typeof TransactWriteCommand>[0]["TransactItems"]
>[number];

/** Attempts of a fenced transaction that DynamoDB cancelled for a conflicting concurrent transaction. */
const TRANSACTION_CONFLICT_ATTEMPTS = 4;

/**
 * The ConditionCheck every fenced write carries: the lock is still held by this lease. Owner
 * tokens are unique per acquisition and the fence rises with each, so a controller whose lease
 * expired and was taken over fails here, however long it was paused.
 */
function lockCheck(tableName: string, lease: LockLease): TransactItem {
  return {
    ConditionCheck: {
      TableName: tableName,
      Key: { pk: keys.controlPk(lease.shard), sk: keys.lock },
      // expires_at 0 marks a released lock. An expired lease that nobody took over still passes:
      // the owner token and fence changing is what tells a stale holder.
      ConditionExpression: "#owner = :owner AND fence = :fence AND expires_at > :released",
      ExpressionAttributeNames: { "#owner": "owner" },
      ExpressionAttributeValues: { ":owner": lease.owner, ":fence": lease.fence, ":released": 0 },
    },
  };
}

/** The replica set of `primary` is still at the version the decision read. */
function replicaSetCheck(
  tableName: string,
  shard: string,
  replicaSet: NonNullable<WriteFence["replicaSet"]>,
): TransactItem {
  return {
    ConditionCheck: {
      TableName: tableName,
      Key: { pk: keys.nodePk(shard, replicaSet.primary), sk: keys.replicas(replicaSet.primary) },
      ...(replicaSet.version === undefined
        ? { ConditionExpression: "attribute_not_exists(version)" }
        : {
            ConditionExpression: "version = :version",
            ExpressionAttributeValues: { ":version": replicaSet.version },
          }),
    },
  };
}

/** The per-item codes of a cancelled transaction ("None", "ConditionalCheckFailed", "TransactionConflict", ...). */
function cancellationCodes(error: unknown): string[] | undefined {
  if (typeof error !== "object" || error === null) return undefined;
  const shape = error as { name?: string; CancellationReasons?: Array<{ Code?: string }> };
  if (shape.name !== "TransactionCanceledException") return undefined;
  return (shape.CancellationReasons ?? []).map((reason) => reason.Code ?? "None");
}

/** First failing field and every reason, for MalformedItem and MalformedRecord. */
function malformedFrom(sk: string, error: z.ZodError): MalformedItem {
  const first = error.issues[0];
  return {
    sk,
    field: first && first.path.length > 0 ? first.path.join(".") : "(item)",
    reason: describeIssues(error),
  };
}

/**
 * Types the items of one shard partition. Each item is parsed with its schema; one that fails is
 * left out and reported in `malformed` with its sort key, first failing field and every reason.
 */
export function snapshotFromItems(shard: string, items: readonly Record<string, unknown>[]): ShardSnapshot {
  const nodes: Heartbeat[] = [];
  const replicaSets: Record<string, readonly string[]> = {};
  const replicaSetVersions: Record<string, number> = {};
  const malformed: MalformedItem[] = [];
  let topology: Topology | undefined;
  let lock: Lock | undefined;
  for (const item of items) {
    const sk = String(item.sk);
    if (sk.startsWith("NODE#")) {
      const parsed = heartbeatSchema.safeParse(item);
      if (!parsed.success) malformed.push(malformedFrom(sk, parsed.error));
      else if (keys.node(parsed.data.node_id) !== sk || parsed.data.shard !== shard) {
        malformed.push({
          sk,
          field: "node_id",
          reason: `node_id/shard (${parsed.data.node_id}/${parsed.data.shard}) do not match the item's key`,
        });
      } else nodes.push(parsed.data);
    } else if (sk.startsWith("REPLICAS#")) {
      const parsed = replicaSetItemSchema.safeParse(item);
      if (!parsed.success) malformed.push(malformedFrom(sk, parsed.error));
      else {
        const primaryId = sk.slice("REPLICAS#".length);
        replicaSets[primaryId] = [...(parsed.data.replicas ?? [])].sort();
        if (parsed.data.version !== undefined) replicaSetVersions[primaryId] = parsed.data.version;
      }
    } else if (sk === keys.lock) {
      const parsed = lockSchema.safeParse(item);
      if (!parsed.success) malformed.push(malformedFrom(sk, parsed.error));
      else lock = parsed.data;
    } else if (sk === keys.topology) {
      const parsed = topologySchema.safeParse(item);
      if (!parsed.success) malformed.push(malformedFrom(sk, parsed.error));
      else topology = parsed.data;
    } else {
      malformed.push({ sk, field: "sk", reason: "unknown item type in a shard partition" });
    }
  }
  nodes.sort((a, b) => a.node_id.localeCompare(b.node_id));
  return { shard, nodes, replicaSets, replicaSetVersions, topology, lock, malformed };
}

/**
 * What a heartbeat put did: `written`, or `superseded` when the stored heartbeat is newer (an
 * older put, e.g. an SDK retry of a timed-out one, landed after a newer one). Superseded is no
 * failure: a newer heartbeat of the node is in the table.
 */
export type HeartbeatPutOutcome = "written" | "superseded";

/**
 * A heartbeat put replaces the stored one only if it is newer, so heartbeats never go backwards.
 * Order: `written_at` (µs, the heartbeat's `agent_updated`, else `last_updated`: the writer's
 * AWS-aligned time), then `write_seq` (this store's put counter) between puts of one instant; a
 * retry of the same put matches itself and is applied again. A stored heartbeat dated more than
 * MAX_CLOCK_SKEW_MS after the new one is replaced anyway: it came from a clock outside the design
 * (and no reader counts it as fresh), so a writer is never stuck behind it. A restarted agent
 * whose clock reads a few ms before its previous process's last write is superseded until its
 * clock passes that write, i.e. at most MAX_CLOCK_SKEW_MS, normally a few ms.
 */
const NEWER_HEARTBEAT_CONDITION =
  "attribute_not_exists(written_at) OR written_at < :written_at OR written_at > :ceiling" +
  " OR (written_at = :written_at AND (attribute_not_exists(write_seq) OR write_seq <= :write_seq))";

export class DynamoHeartbeatStore extends DynamoTable implements HeartbeatStore {
  /** Orders this store's puts made within one µs; other writers compare by time first. */
  #writeSeq = 0;
  /** `<shard>/<node>` -> when this store last wrote the node's member item (AWS-aligned ms). */
  readonly #memberWrittenAt = new Map<string, number>();
  /** Shard -> the member ids its last snapshot found, read alongside the membership (see snapshot). */
  readonly #knownMembers = new Map<string, readonly string[]>();

  /**
   * The port's put: resolves normally whether written or superseded, so a caller never backs off
   * or reports a failure because its older put lost to a newer one.
   */
  async put(heartbeat: HeartbeatInput): Promise<void> {
    await this.putIfNewer(heartbeat);
  }

  /** Writes the heartbeat unless a newer one of the node is stored; says which (never throws for that). */
  async putIfNewer(heartbeat: HeartbeatInput): Promise<HeartbeatPutOutcome> {
    const parsed = heartbeatSchema.safeParse(heartbeat);
    if (!parsed.success) {
      const bad = malformedFrom(keys.node(String(heartbeat.node_id)), parsed.error);
      throw new MalformedRecord(
        `refusing to write an invalid heartbeat: ${bad.reason}`,
        bad.field,
        bad.reason,
      );
    }
    const item = parsed.data;
    const writtenAt = item.agent_updated ?? item.last_updated;
    this.#writeSeq += 1;
    let previous: Record<string, unknown> | undefined;
    const written = await this.conditional(`PutItem (heartbeat ${item.shard}/${item.node_id})`, async () => {
      const out = await this.documents.send(
        new PutCommand({
          TableName: this.tableName,
          Item: {
            ...item,
            pk: keys.nodePk(item.shard, item.node_id),
            sk: keys.node(item.node_id),
            written_at: writtenAt,
            write_seq: this.#writeSeq,
            [TTL_ATTRIBUTE]: item.ttl ?? this.ttlIn(this.heartbeatTtlSeconds),
          },
          ConditionExpression: NEWER_HEARTBEAT_CONDITION,
          ExpressionAttributeValues: {
            ":written_at": writtenAt,
            ":ceiling": writtenAt + MAX_CLOCK_SKEW_MS * 1000,
            ":write_seq": this.#writeSeq,
          },
          // Free with a put: tells a first heartbeat (or one after a deletion) from a refresh.
          ReturnValues: "ALL_OLD",
        }),
      );
      previous = out.Attributes;
    }).catch((error: unknown) => {
      // Outcome unknown (a timeout, a lost answer): the put may have created the heartbeat after
      // the controller deleted the node, and the next put would then find it and skip the member
      // item for half a TTL, leaving the node out of every snapshot (simulator seed 44216: 204 s).
      // The next written put registers the member again.
      this.#memberWrittenAt.delete(`${item.shard}/${item.node_id}`);
      throw error;
    });
    if (written) await this.#ensureMember(item.shard, item.node_id, previous === undefined);
    return written ? "written" : "superseded";
  }

  /**
   * Writes the node's member item when this store has not (since it started, or for half the
   * heartbeat TTL), or when the heartbeat had to be created (the controller deletes both when it
   * removes a node; a node that comes back registers again). Its TTL is twice the heartbeat's, so
   * it outlives the last heartbeat of a node that stopped; the snapshot reads nothing for a member
   * without a heartbeat. After the heartbeat: a failed member put is retried on the next heartbeat.
   */
  async #ensureMember(shard: string, node: string, created: boolean): Promise<void> {
    const key = `${shard}/${node}`;
    const now = this.clock.now();
    const last = this.#memberWrittenAt.get(key);
    if (!created && last !== undefined && now - last < (this.heartbeatTtlSeconds * 1000) / 2) return;
    await this.call(`PutItem (member ${shard}/${node})`, () =>
      this.documents.send(new PutCommand({ TableName: this.tableName, Item: this.memberItem(shard, node) })),
    );
    this.#memberWrittenAt.set(key, now);
  }

  /**
   * The shard's state from strongly consistent Queries: the shard partition (who the members are),
   * the controller's partition (topology, lock, layout marker) and each member's own partition
   * (heartbeat, replica set). The member partitions a previous snapshot of this store found are read
   * in the same round as the other two, so a snapshot costs one round trip unless the membership
   * changed (then one more, for the new members). History lives in its own partition, never read here.
   *
   * Heartbeats and replica sets are taken from their node's own partition only, and only the
   * node's own items (`NODE#<node>`, `REPLICAS#<node>` there): IAM lets no other node write there.
   * A shard not yet migrated (no layout marker) with a topology is also read the older way: its
   * heartbeats and replica sets in the shard partition, the newer heartbeat of a node winning, and
   * the snapshot says `legacyTopology` so that the controller takes no automatic action. A migrated
   * shard ignores every item of the shard partition but member sort keys.
   */
  async snapshot(shard: string): Promise<ShardSnapshot> {
    this.requireId("shard id", shard);
    const nodeReads = new Map<string, Promise<Record<string, unknown>[]>>();
    const readNode = (node: string) => {
      const read = this.queryAll(`Query (partition of node ${shard}/${node})`, keys.nodePk(shard, node));
      // Awaited below, or dropped when the node is no longer a member: never an unhandled rejection.
      read.catch(() => undefined);
      nodeReads.set(node, read);
    };
    for (const node of this.#knownMembers.get(shard) ?? []) readNode(node);
    const [shardItems, controlItems] = await Promise.all([
      this.queryAll(`Query (members of shard ${shard})`, keys.shardPk(shard)),
      this.queryAll(`Query (topology and lock of shard ${shard})`, keys.controlPk(shard)),
    ]);
    const members = memberIds(shardItems);
    for (const node of members) if (!nodeReads.has(node)) readNode(node);
    const perNode = await Promise.all(
      members.map((node) => nodeReads.get(node) as Promise<Record<string, unknown>[]>),
    );
    this.#knownMembers.set(shard, members);

    const malformed: MalformedItem[] = [];
    const current = new Map<string, Record<string, unknown>>();
    members.forEach((node, index) => {
      for (const item of perNode[index] ?? []) {
        const sk = String(item.sk);
        if (sk === keys.node(node) || sk === keys.replicas(node)) current.set(sk, item);
        else
          malformed.push({
            sk,
            field: "sk",
            reason: `in the partition of node ${node}, which holds only that node's heartbeat and replica set`,
          });
      }
    });

    const marked = controlItems.some((item) => item.sk === keys.layout);
    const controlled = controlItems.some((item) => item.sk === keys.topology);
    const shardTopology =
      marked || controlled ? undefined : shardItems.find((item) => item.sk === keys.topology);
    const legacyNodeItems =
      marked || !(controlled || shardTopology)
        ? []
        : shardItems.filter(
            (item) => String(item.sk).startsWith("NODE#") || String(item.sk).startsWith("REPLICAS#"),
          );
    for (const item of legacyNodeItems) {
      const sk = String(item.sk);
      const mine = current.get(sk);
      // A node upgraded before the migration writes its own partition; its older copy is stale.
      if (mine === undefined || (sk.startsWith("NODE#") && writtenAt(item) > writtenAt(mine)))
        current.set(sk, item);
    }
    const legacyTopology = shardTopology !== undefined || legacyNodeItems.length > 0;
    const parsed = snapshotFromItems(shard, [
      ...current.values(),
      ...(shardTopology ? [shardTopology] : []),
      ...controlItems.filter((item) => item.sk !== keys.layout),
    ]);
    const snapshot: ShardSnapshot = {
      ...parsed,
      malformed: [...malformed, ...parsed.malformed],
      ...(legacyTopology ? { legacyTopology } : {}),
    };
    for (const bad of snapshot.malformed) {
      this.logger.warn("malformed item left out of the shard snapshot", { shard, ...bad });
    }
    return snapshot;
  }

  /**
   * Deletes the node's heartbeat, replica set and member item (and their copies of an older
   * layout, in a shard not yet migrated), across partitions in one transaction.
   */
  async deleteNode(shard: string, nodeId: string, fence?: WriteFence): Promise<void> {
    this.requireId("shard id", shard);
    this.requireId("node id", nodeId);
    const deletes = this.#nodeItemKeys(shard, nodeId).map((Key) => ({
      Delete: { TableName: this.tableName, Key },
    }));
    if (fence) {
      await this.fencedTransaction(`delete node ${shard}/${nodeId}`, fence, deletes);
      return;
    }
    await this.call(`TransactWriteItems (delete node ${shard}/${nodeId})`, () =>
      this.documents.send(new TransactWriteCommand({ TransactItems: deletes })),
    );
  }

  /**
   * An administrator retires a node for good (`shardguard decommission`): in one transaction, its
   * items as `deleteNode` deletes them, and its id from each stored replica set `judged.replicaSets`
   * names, only while the shard is as the refusals judged it: the topology at `judged.epoch` (none:
   * no topology), no heartbeat of the node written after `judged.heartbeatWrittenAt` (none: still
   * none), each set at the version read. A versioned set's version is bumped as an agent's own
   * change bumps it, so a controller's plan decided on the set before the removal fails its
   * replica-set check (PlanStale) and is decided again. False when a condition failed or a
   * concurrent transaction conflicted: nothing was written; read again and judge again.
   *
   * Why removing the id is safe, though only the primary's agent writes its set otherwise: the
   * operator declares the node's data gone (its database destroyed or never to serve again), so no
   * write exists that only it acknowledged, and a failover need not wait for it (gate
   * `member_unheard`, which would wait for good: a retired node's agent never reports again). The
   * primary's agent does not depend on the version: it adds and removes ids atomically, reads its set
   * back with every snapshot, and removing an id already gone is a no-op. A database still running
   * at the node's address has no heartbeat naming it once this ran: the primary's agent reports it
   * as an outsider (heartbeat `outsiders`) and a failover waits for it (gate `outsider_unheard`).
   */
  async retireNode(shard: string, nodeId: string, judged: NodeRetirement): Promise<boolean> {
    this.requireId("shard id", shard);
    this.requireId("node id", nodeId);
    const [heartbeat, ...others] = this.#nodeItemKeys(shard, nodeId);
    const items: TransactItem[] = [
      {
        ConditionCheck: {
          TableName: this.tableName,
          Key: { pk: keys.controlPk(shard), sk: keys.topology },
          ...(judged.epoch === undefined
            ? { ConditionExpression: "attribute_not_exists(pk)" }
            : {
                ConditionExpression: "epoch = :epoch",
                ExpressionAttributeValues: { ":epoch": judged.epoch },
              }),
        },
      },
      {
        Delete: {
          TableName: this.tableName,
          Key: heartbeat,
          ...(judged.heartbeatWrittenAt === undefined
            ? { ConditionExpression: "attribute_not_exists(pk)" }
            : {
                ConditionExpression: "attribute_not_exists(pk) OR written_at <= :written_at",
                ExpressionAttributeValues: { ":written_at": judged.heartbeatWrittenAt },
              }),
        },
      },
      ...others.map((Key) => ({ Delete: { TableName: this.tableName, Key } })),
      ...judged.replicaSets.map(({ primary, version }): TransactItem => {
        this.requireId("primary id", primary);
        return {
          Update: {
            TableName: this.tableName,
            Key: { pk: keys.nodePk(shard, primary), sk: keys.replicas(primary) },
            // A set written before the guard stays unversioned: a version would put it under the guard.
            ...(version === undefined
              ? {
                  UpdateExpression: "DELETE replicas :ids",
                  ConditionExpression: "attribute_exists(pk) AND attribute_not_exists(version)",
                  ExpressionAttributeValues: { ":ids": new Set([nodeId]) },
                }
              : {
                  UpdateExpression: "DELETE replicas :ids ADD version :one",
                  ConditionExpression: "version = :version",
                  ExpressionAttributeValues: { ":ids": new Set([nodeId]), ":one": 1, ":version": version },
                }),
          },
        };
      }),
    ];
    const codes = await this.call(`TransactWriteItems (retire node ${shard}/${nodeId})`, async () => {
      try {
        await this.documents.send(new TransactWriteCommand({ TransactItems: items }));
        return [];
      } catch (error) {
        const reasons = cancellationCodes(error);
        if (reasons === undefined) throw error;
        return reasons;
      }
    });
    if (codes.length === 0) return true;
    if (codes.every((code) => ["None", "ConditionalCheckFailed", "TransactionConflict"].includes(code)))
      return false;
    throw new CoordinationUnavailable(
      `TransactWriteItems (retire node ${shard}/${nodeId}) cancelled: ${codes.join(", ")}`,
    );
  }

  /** The node's heartbeat first, then its replica set and member item, and their copies of an older layout. */
  #nodeItemKeys(
    shard: string,
    nodeId: string,
  ): [{ pk: string; sk: string }, ...{ pk: string; sk: string }[]] {
    const own = keys.nodePk(shard, nodeId);
    const shared = keys.shardPk(shard);
    return [
      { pk: own, sk: keys.node(nodeId) },
      { pk: own, sk: keys.replicas(nodeId) },
      { pk: shared, sk: keys.member(nodeId) },
      { pk: shared, sk: keys.node(nodeId) },
      { pk: shared, sk: keys.replicas(nodeId) },
    ];
  }
}

/** What `retireNode` was judged on (see there). */
export interface NodeRetirement {
  /** The topology's epoch read; undefined: the shard had no topology. */
  readonly epoch: number | undefined;
  /** The node's heartbeat as read (µs: its \`agent_updated\`, else \`last_updated\`); undefined: none stored. */
  readonly heartbeatWrittenAt: number | undefined;
  /** Every other node's stored set that lists the node, with the version read (undefined: written before the guard). */
  readonly replicaSets: ReadonlyArray<{ readonly primary: string; readonly version: number | undefined }>;
}

/** The node ids the member items of a shard partition name (by sort key; nothing else is read). */
function memberIds(items: readonly Record<string, unknown>[]): string[] {
  const ids = items
    .map((item) => String(item.sk))
    .filter((sk) => sk.startsWith("MEMBER#"))
    .map((sk) => sk.slice("MEMBER#".length))
    .filter((id) => idSchema.safeParse(id).success);
  return [...new Set(ids)].sort();
}

/**
 * The condition that `item` is still as read: it exists and each of `attributes` has the value read
 * (or is still absent).
 */
function unchangedSince(
  item: Record<string, unknown>,
  attributes: readonly string[],
): Pick<
  NonNullable<TransactItem["Delete"]>,
  "ConditionExpression" | "ExpressionAttributeNames" | "ExpressionAttributeValues"
> {
  const names: Record<string, string> = {};
  const values: Record<string, unknown> = {};
  const terms = ["attribute_exists(pk)"];
  attributes.forEach((attribute, index) => {
    names[`#a${index}`] = attribute;
    if (item[attribute] === undefined) terms.push(`attribute_not_exists(#a${index})`);
    else {
      values[`:a${index}`] = item[attribute];
      terms.push(`#a${index} = :a${index}`);
    }
  });
  return {
    ConditionExpression: terms.join(" AND "),
    ExpressionAttributeNames: names,
    ...(Object.keys(values).length > 0 ? { ExpressionAttributeValues: values } : {}),
  };
}

/** A stored heartbeat's write time (µs), for choosing the newer of two copies. */
function writtenAt(item: Record<string, unknown>): number {
  const value = item.written_at ?? item.agent_updated ?? item.last_updated;
  return typeof value === "number" ? value : Number(value ?? 0);
}

export class DynamoReplicaSetStore extends DynamoTable implements ReplicaSetStore {
  /** `<shard>/<node>` whose member item this store wrote. */
  readonly #members = new Set<string>();

  async add(shard: string, primaryId: string, nodeIds: readonly string[]): Promise<void> {
    return this.#update("ADD", shard, primaryId, nodeIds);
  }

  async remove(shard: string, primaryId: string, nodeIds: readonly string[]): Promise<void> {
    return this.#update("DELETE", shard, primaryId, nodeIds);
  }

  async removeWhilePrimary(
    shard: string,
    primaryId: string,
    nodeIds: readonly string[],
    epoch: number | undefined,
  ): Promise<boolean> {
    if (nodeIds.length === 0) return true;
    const update = this.#updateInput("DELETE", shard, primaryId, nodeIds);
    const topologyCondition =
      epoch === undefined
        ? { ConditionExpression: "attribute_not_exists(pk)" }
        : {
            ConditionExpression:
              "epoch = :epoch AND primary_node_id = :primary AND #status IN (:online, :paused)",
            ExpressionAttributeNames: { "#status": "status" },
            ExpressionAttributeValues: {
              ":epoch": epoch,
              ":primary": primaryId,
              ":online": "online",
              ":paused": "paused",
            },
          };
    return this.conditional(`TransactWriteItems (remove replicas of ${shard}/${primaryId})`, () =>
      this.documents.send(
        new TransactWriteCommand({
          TransactItems: [
            {
              ConditionCheck: {
                TableName: this.tableName,
                Key: { pk: keys.controlPk(shard), sk: keys.topology },
                ...topologyCondition,
              },
            },
            { Update: update },
          ],
        }),
      ),
    );
  }

  /** ADD/DELETE on a string set: atomic per id, no read-modify-write race between writers. */
  async #update(action: "ADD" | "DELETE", shard: string, primaryId: string, nodeIds: readonly string[]) {
    // DynamoDB rejects empty sets; adding or removing nothing is a no-op.
    if (nodeIds.length === 0) return;
    const input = this.#updateInput(action, shard, primaryId, nodeIds);
    await this.call(`UpdateItem (${action} replicas of ${shard}/${primaryId})`, () =>
      this.documents.send(new UpdateCommand(input)),
    );
    // A replica set is read only for a member (normally listed by its heartbeats already): once per store.
    const member = `${shard}/${primaryId}`;
    if (!this.#members.has(member)) {
      await this.call(`PutItem (member ${member})`, () =>
        this.documents.send(
          new PutCommand({ TableName: this.tableName, Item: this.memberItem(shard, primaryId) }),
        ),
      );
      this.#members.add(member);
    }
  }

  #updateInput(action: "ADD" | "DELETE", shard: string, primaryId: string, nodeIds: readonly string[]) {
    this.requireId("shard id", shard);
    this.requireId("primary id", primaryId);
    for (const id of nodeIds) this.requireId("node id", id);
    return {
      TableName: this.tableName,
      Key: { pk: keys.nodePk(shard, primaryId), sk: keys.replicas(primaryId) },
      // One ADD section at most: "ADD replicas :ids, version :one" or "DELETE replicas :ids ADD version :one".
      UpdateExpression:
        action === "ADD"
          ? "ADD replicas :ids, version :one SET #ttl = :ttl"
          : "DELETE replicas :ids ADD version :one SET #ttl = :ttl",
      ExpressionAttributeNames: { "#ttl": TTL_ATTRIBUTE },
      ExpressionAttributeValues: {
        ":ids": new Set(nodeIds),
        ":one": 1,
        ":ttl": this.ttlIn(this.heartbeatTtlSeconds),
      },
    };
  }
}

export class DynamoLockStore extends DynamoTable implements LockStore {
  /**
   * Conditional update: absent, expired (on the AWS-aligned clock), or already ours; raises
   * `fence` by one and returns the lease with the new fence. "Already ours" makes an SDK retry of
   * an update that did land return the lease instead of a false "lost" (with the fence raised
   * once more, which only invalidates our own earlier value).
   */
  async acquire(
    shard: string,
    owner: string,
    leaseMs: number,
    forPrimary?: string,
  ): Promise<LockLease | false> {
    this.requireId("shard id", shard);
    this.#requireOwner(owner);
    this.#requireLease(leaseMs);
    const now = this.clock.now();
    const expiresAt = now + leaseMs;
    let fence: number | undefined;
    const acquired = await this.conditional(`UpdateItem (lock acquire, shard ${shard})`, async () => {
      const out = await this.documents.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: keys.controlPk(shard), sk: keys.lock },
          UpdateExpression: `SET #owner = :owner, expires_at = :expires, #ttl = :ttl${forPrimary === undefined ? " REMOVE for_primary" : ", for_primary = :forPrimary"} ADD fence :one`,
          ConditionExpression: "attribute_not_exists(pk) OR expires_at < :now OR #owner = :owner",
          ExpressionAttributeNames: { "#owner": "owner", "#ttl": TTL_ATTRIBUTE },
          ExpressionAttributeValues: {
            ":now": now,
            ":owner": owner,
            ":expires": expiresAt,
            // Garbage collection only: expiry is decided by the condition.
            ":ttl": Math.ceil(expiresAt / 1000) + DAY_SECONDS,
            ":one": 1,
            ...(forPrimary === undefined ? {} : { ":forPrimary": forPrimary }),
          },
          ReturnValues: "ALL_NEW",
        }),
      );
      fence = Number(out.Attributes?.fence);
    });
    return acquired && fence !== undefined ? { shard, owner, fence } : false;
  }

  /** Extends a lease that `owner` still holds and that has not expired. */
  async renew(shard: string, owner: string, leaseMs: number): Promise<boolean> {
    this.requireId("shard id", shard);
    this.#requireLease(leaseMs);
    const now = this.clock.now();
    const expiresAt = now + leaseMs;
    return this.conditional(`UpdateItem (lock renew, shard ${shard})`, () =>
      this.documents.send(
        new UpdateCommand({
          TableName: this.tableName,
          Key: { pk: keys.controlPk(shard), sk: keys.lock },
          UpdateExpression: "SET expires_at = :expires, #ttl = :ttl",
          ConditionExpression: "#owner = :owner AND expires_at >= :now",
          ExpressionAttributeNames: { "#owner": "owner", "#ttl": TTL_ATTRIBUTE },
          ExpressionAttributeValues: {
            ":owner": owner,
            ":now": now,
            ":expires": expiresAt,
            ":ttl": Math.ceil(expiresAt / 1000) + DAY_SECONDS,
          },
        }),
      ),
    );
  }

  /**
   * Ends the lease if `owner` holds it: the item stays with `expires_at` 0, so its `fence` keeps
   * rising across acquisitions (a deleted item would start again at 1). An absent lock counts as
   * released (idempotent, so a retried release does not report a lost lock); another owner's lock
   * is left untouched -> false.
   */
  async release(shard: string, owner: string): Promise<boolean> {
    this.requireId("shard id", shard);
    try {
      await this.call(`UpdateItem (lock release, shard ${shard})`, () =>
        this.documents.send(
          new UpdateCommand({
            TableName: this.tableName,
            Key: { pk: keys.controlPk(shard), sk: keys.lock },
            UpdateExpression: "SET expires_at = :zero",
            ConditionExpression: "#owner = :owner",
            ExpressionAttributeNames: { "#owner": "owner" },
            ExpressionAttributeValues: { ":owner": owner, ":zero": 0 },
            ReturnValuesOnConditionCheckFailure: "ALL_OLD",
          }),
        ),
      );
      return true;
    } catch (error) {
      if (classifyAwsError(error) !== "conditional") throw error;
      // No item at all: nothing to release.
      return (error as { Item?: unknown }).Item === undefined;
    }
  }

  #requireOwner(owner: string): void {
    if (typeof owner !== "string" || owner.length === 0 || owner.length > 256) {
      throw new ConfigurationError("lock owner must be a non-empty token of at most 256 characters");
    }
  }

  #requireLease(leaseMs: number): void {
    if (!Number.isInteger(leaseMs) || leaseMs <= 0) {
      throw new ConfigurationError(`lock lease must be a positive integer of ms, got ${leaseMs}`);
    }
  }
}

export class DynamoTopologyStore extends DynamoTable implements TopologyStore {
  /** Strongly consistent read; a stored topology that fails its schema throws MalformedRecord. */
  async read(shard: string): Promise<Topology | undefined> {
    this.requireId("shard id", shard);
    const item =
      (await this.#get(shard, keys.controlPk(shard))) ?? (await this.#get(shard, keys.shardPk(shard)));
    if (!item) return undefined;
    const parsed = topologySchema.safeParse(item);
    if (!parsed.success) {
      const bad = malformedFrom(keys.topology, parsed.error);
      this.logger.warn("malformed topology", { shard, ...bad });
      throw new MalformedRecord(
        `topology of shard ${shard} is malformed: ${bad.reason}`,
        bad.field,
        bad.reason,
      );
    }
    return parsed.data;
  }

  /** The topology item under `pk` (the controller's partition, or an older installation's). */
  async #get(shard: string, pk: string): Promise<Record<string, unknown> | undefined> {
    const out = await this.call(`GetItem (topology of shard ${shard})`, () =>
      this.documents.send(
        new GetCommand({ TableName: this.tableName, Key: { pk, sk: keys.topology }, ConsistentRead: true }),
      ),
    );
    return out.Item;
  }

  /**
   * Moves a shard written by an older installation to the current layout, each step idempotent:
   * 1. the topology and lock from the shard partition (the layout before the controller's
   *    partition) into the controller's: put the topology there only if it has none, delete the old
   *    topology only if unchanged since read, and the old lock; one transaction;
   * 2. each heartbeat and replica set from the shard partition into its node's own partition, with
   *    the node's member item; a heartbeat the node already wrote there (an upgraded agent) is kept
   *    when newer, a replica set there is kept; the old copy is deleted only if unchanged since read;
   *    one transaction per item;
   * 3. the layout marker (keys.layout), after which readers ignore the shard partition's old items.
   * `moved` (something moved), `current` (nothing to move), `conflict` (an item changed while being
   * moved, e.g. an agent of the older release still writing; nothing more moved, run again). A
   * marked shard is `current` and left alone: a heartbeat in its shard partition is a leftover or a
   * forgery, never moved into a node's partition.
   */
  async migrateLegacy(shard: string): Promise<"moved" | "current" | "conflict"> {
    this.requireId("shard id", shard);
    const marker = await this.call(`GetItem (layout of shard ${shard})`, () =>
      this.documents.send(
        new GetCommand({
          TableName: this.tableName,
          Key: { pk: keys.controlPk(shard), sk: keys.layout },
          ConsistentRead: true,
        }),
      ),
    );
    if (marker.Item) return "current";
    const topology = await this.#migrateTopology(shard);
    if (topology === "conflict") return "conflict";
    let moved = topology === "moved";
    for (const item of await this.queryAll(`Query (old layout of shard ${shard})`, keys.shardPk(shard))) {
      const result = await this.#migrateNodeItem(shard, item);
      if (result === "conflict") return "conflict";
      moved ||= result === "moved";
    }
    await this.call(`PutItem (layout marker, shard ${shard})`, () =>
      this.documents.send(new PutCommand(this.#layoutMarker(shard))),
    );
    return moved ? "moved" : "current";
  }

  /** Step 1 of migrateLegacy: the topology and lock of the layout before the controller's partition. */
  async #migrateTopology(shard: string): Promise<"moved" | "current" | "conflict"> {
    const legacy = await this.#get(shard, keys.shardPk(shard));
    if (!legacy) return "current";
    const parsed = topologySchema.safeParse(legacy);
    if (!parsed.success) {
      const bad = malformedFrom(keys.topology, parsed.error);
      throw new MalformedRecord(
        `legacy topology of shard ${shard} is malformed: ${bad.reason}`,
        bad.field,
        bad.reason,
      );
    }
    const codes = await this.#transact(`move the topology of shard ${shard}`, [
      {
        Put: {
          TableName: this.tableName,
          Item: { ...parsed.data, pk: keys.controlPk(shard), sk: keys.topology, write_id: randomUUID() },
          ConditionExpression: "attribute_not_exists(pk)",
        },
      },
      {
        Delete: {
          TableName: this.tableName,
          Key: { pk: keys.shardPk(shard), sk: keys.topology },
          ConditionExpression: "epoch = :epoch AND updated_at = :updated",
          ExpressionAttributeValues: { ":epoch": parsed.data.epoch, ":updated": parsed.data.updated_at },
        },
      },
      { Delete: { TableName: this.tableName, Key: { pk: keys.shardPk(shard), sk: keys.lock } } },
    ]);
    return codes.length === 0 ? "moved" : "conflict";
  }

  /** Step 2 of migrateLegacy for one item of the shard partition (members and others are skipped). */
  async #migrateNodeItem(
    shard: string,
    item: Record<string, unknown>,
  ): Promise<"moved" | "current" | "conflict"> {
    const sk = String(item.sk);
    const heartbeat = sk.startsWith("NODE#");
    if (!heartbeat && !sk.startsWith("REPLICAS#")) return "current";
    const node = sk.slice(sk.indexOf("#") + 1);
    if (!idSchema.safeParse(node).success) return "current";
    const removeOld: TransactItem = {
      Delete: {
        TableName: this.tableName,
        Key: { pk: keys.shardPk(shard), sk },
        ...unchangedSince(item, heartbeat ? ["last_updated", "written_at", "write_seq"] : ["version"]),
      },
    };
    const { pk: _pk, ...attributes } = item;
    let copy: TransactItem;
    if (heartbeat) {
      const at = writtenAt(item);
      copy = {
        Put: {
          TableName: this.tableName,
          Item: { ...attributes, pk: keys.nodePk(shard, node), written_at: at },
          // Older than what the node wrote itself: keep the node's (no clock bound: both are real writes).
          ConditionExpression: "attribute_not_exists(written_at) OR written_at < :written_at",
          ExpressionAttributeValues: { ":written_at": at },
        },
      };
    } else {
      copy = {
        Put: {
          TableName: this.tableName,
          Item: { ...attributes, pk: keys.nodePk(shard, node) },
          ConditionExpression: "attribute_not_exists(pk)",
        },
      };
    }
    const member: TransactItem[] = heartbeat
      ? [{ Put: { TableName: this.tableName, Item: this.memberItem(shard, node) } }]
      : [];
    const operation = `move ${sk} of shard ${shard} to its node's partition`;
    let codes = await this.#transact(operation, [copy, ...member, removeOld]);
    // The node already wrote a newer copy in its own partition: keep it, drop the old one.
    if (codes[0] === "ConditionalCheckFailed" && !codes.slice(1).includes("ConditionalCheckFailed")) {
      codes = await this.#transact(operation, [...member, removeOld]);
    }
    return codes.length === 0 ? "moved" : "conflict";
  }

  /** One TransactWriteItems: [] when written, else each item's cancellation code. */
  async #transact(operation: string, items: readonly TransactItem[]): Promise<string[]> {
    return this.call(`TransactWriteItems (${operation})`, async () => {
      try {
        await this.documents.send(new TransactWriteCommand({ TransactItems: [...items] }));
        return [];
      } catch (error) {
        const reasons = cancellationCodes(error);
        if (reasons === undefined) throw error;
        return reasons;
      }
    });
  }

  #requireFenceOf(shard: string, fence: WriteFence): void {
    if (fence.lease.shard !== shard) {
      throw new ConfigurationError(
        `a lease of shard ${fence.lease.shard} cannot fence a write to shard ${shard}`,
      );
    }
  }

  /**
   * Writes the whole topology if the stored epoch is `expectedEpoch` (or none exists when it is
   * undefined). Each write carries a fresh `write_id`; the condition also accepts our own
   * `write_id`, so an SDK retry of a write that did land is not misread as a lost race.
   */
  async compareAndSet(
    shard: string,
    expectedEpoch: number | undefined,
    next: Topology,
    fence?: WriteFence,
  ): Promise<boolean> {
    this.requireId("shard id", shard);
    const parsed = topologySchema.safeParse(next);
    if (!parsed.success) {
      const bad = malformedFrom(keys.topology, parsed.error);
      throw new MalformedRecord(
        `refusing to write an invalid topology: ${bad.reason}`,
        bad.field,
        bad.reason,
      );
    }
    if (parsed.data.shard !== shard) {
      throw new ConfigurationError(`topology for shard ${parsed.data.shard} written under shard ${shard}`);
    }
    const writeId = randomUUID();
    const expected =
      expectedEpoch === undefined
        ? { condition: "attribute_not_exists(pk) OR write_id = :writeId", values: {} }
        : { condition: "epoch = :expected OR write_id = :writeId", values: { ":expected": expectedEpoch } };
    // A shard's first topology marks it as laid out by node partitions (keys.layout).
    const marker = expectedEpoch === undefined ? [{ Put: this.#layoutMarker(shard) }] : [];
    if (fence) {
      this.#requireFenceOf(shard, fence);
      const failed = await this.fencedTransaction(`topology compare-and-set, shard ${shard}`, fence, [
        {
          Put: {
            TableName: this.tableName,
            Item: { ...parsed.data, pk: keys.controlPk(shard), sk: keys.topology, write_id: writeId },
            ConditionExpression: expected.condition,
            ExpressionAttributeValues: { ...expected.values, ":writeId": writeId },
          },
        },
        ...marker,
      ]);
      return failed.length === 0;
    }
    const written = await this.conditional(`PutItem (topology compare-and-set, shard ${shard})`, () =>
      this.documents.send(
        new PutCommand({
          TableName: this.tableName,
          Item: { ...parsed.data, pk: keys.controlPk(shard), sk: keys.topology, write_id: writeId },
          ConditionExpression: expected.condition,
          ExpressionAttributeValues: { ...expected.values, ":writeId": writeId },
        }),
      ),
    );
    if (written && marker.length > 0) {
      await this.call(`PutItem (layout marker, shard ${shard})`, () =>
        this.documents.send(new PutCommand(this.#layoutMarker(shard))),
      );
    }
    return written;
  }

  /** The layout marker's put (idempotent): the shard's nodes write in their own partitions. */
  #layoutMarker(shard: string): { TableName: string; Item: Record<string, unknown> } {
    return { TableName: this.tableName, Item: { pk: keys.controlPk(shard), sk: keys.layout, layout: 2 } };
  }
}

export class DynamoHistoryStore extends DynamoTable implements HistoryStore {
  /** Idempotent per epoch: the first record of an epoch wins, a resumed orchestration's append is a no-op. */
  async append(record: HistoryRecord, fence?: WriteFence): Promise<void> {
    const parsed = historyRecordSchema.safeParse(record);
    if (!parsed.success) {
      const bad = malformedFrom(keys.history(record.epoch), parsed.error);
      throw new MalformedRecord(
        `refusing to write an invalid history record: ${bad.reason}`,
        bad.field,
        bad.reason,
      );
    }
    const item = parsed.data;
    const put = {
      TableName: this.tableName,
      Item: {
        ...item,
        pk: keys.historyPk(item.shard),
        sk: keys.history(item.epoch),
        [TTL_ATTRIBUTE]: this.ttlIn(this.historyTtlSeconds),
      },
      ConditionExpression: "attribute_not_exists(pk)",
    };
    if (fence) {
      // A record already there for this epoch fails its condition: the append is a no-op.
      await this.fencedTransaction(`history of shard ${item.shard}, epoch ${item.epoch}`, fence, [
        { Put: put },
      ]);
      return;
    }
    await this.conditional(`PutItem (history of shard ${item.shard}, epoch ${item.epoch})`, () =>
      this.documents.send(new PutCommand(put)),
    );
  }

  /** Newest first; malformed records are left out and logged. */
  async list(shard: string, limit = 20): Promise<HistoryRecord[]> {
    this.requireId("shard id", shard);
    const out = await this.call(`Query (history of shard ${shard})`, () =>
      this.documents.send(
        new QueryCommand({
          TableName: this.tableName,
          KeyConditionExpression: "pk = :pk",
          ExpressionAttributeValues: { ":pk": keys.historyPk(shard) },
          ScanIndexForward: false,
          Limit: limit,
        }),
      ),
    );
    const records: HistoryRecord[] = [];
    for (const item of out.Items ?? []) {
      const parsed = historyRecordSchema.safeParse(item);
      if (parsed.success) records.push(parsed.data);
      else
        this.logger.warn("malformed history record left out", {
          shard,
          ...malformedFrom(String(item.sk), parsed.error),
        });
    }
    return records;
  }
}

/**
 * The shard index (`SHARD_INDEX`): each shard's agents put its registration item in the shard's own
 * partition, where IAM confines them; the controller lists the sparse index, whose sort key is that
 * partition key. Then, for installations before issue 38, the legacy index partition `SHARDS`, which
 * agents can no longer write. A shard in both is listed twice; callers take each id once.
 */
export class DynamoShardIndex extends DynamoTable implements ShardIndex {
  async register(shard: string): Promise<void> {
    this.requireId("shard id", shard);
    await this.call(`PutItem (register shard ${shard})`, () =>
      this.documents.send(
        new PutCommand({
          TableName: this.tableName,
          Item: {
            pk: keys.shardPk(shard),
            sk: keys.registration,
            [SHARD_INDEX.partitionKey]: SHARD_INDEX.value,
            shard,
          },
        }),
      ),
    );
  }

  /**
   * One page of shard ids. Eventually consistent: it costs half, and a shard registered a moment ago
   * is picked up on the next tick. The next page of the index starts after the last partition listed
   * (`pk > :after`), so every further entry of that shard is skipped unread: an agent that puts many
   * items carrying `index_pk` into its own shard partition costs a pass at most one page of them.
   */
  async list(pageToken?: string, pageSize = 1000): Promise<{ shards: string[]; nextPageToken?: string }> {
    const token: PageToken =
      pageToken === undefined ? { after: keys.shardPk("") } : decodePageToken(pageToken);
    if ("legacy" in token) return this.#listLegacy(token.legacy, pageSize);
    const out = await this.call("Query (shard index)", () =>
      this.documents.send(
        new QueryCommand({
          TableName: this.tableName,
          IndexName: SHARD_INDEX.indexName,
          KeyConditionExpression: "#index = :index AND pk > :after",
          ExpressionAttributeNames: { "#index": SHARD_INDEX.partitionKey },
          ExpressionAttributeValues: { ":index": SHARD_INDEX.value, ":after": token.after },
          Limit: pageSize,
        }),
      ),
    );
    const shards: string[] = [];
    let last: string | undefined;
    for (const item of out.Items ?? []) {
      const pk = String(item.pk);
      if (pk === last) continue;
      last = pk;
      const parsed = idSchema.safeParse(pk.slice(keys.shardPk("").length));
      if (pk.startsWith(keys.shardPk("")) && parsed.success) shards.push(parsed.data);
      else this.logger.warn("malformed shard index entry left out", { pk: pk.slice(0, 200) });
    }
    const next: PageToken = out.LastEvaluatedKey && last !== undefined ? { after: last } : { legacy: {} };
    return { shards, nextPageToken: encodePageToken(next) };
  }

  async #listLegacy(
    start: Record<string, unknown>,
    pageSize: number,
  ): Promise<{ shards: string[]; nextPageToken?: string }> {
    const out = await this.call("Query (legacy shard index)", () =>
      this.documents.send(
        new QueryCommand({
          TableName: this.tableName,
          KeyConditionExpression: "pk = :pk",
          ExpressionAttributeValues: { ":pk": keys.shardIndexPk },
          Limit: pageSize,
          ExclusiveStartKey: "pk" in start ? start : undefined,
        }),
      ),
    );
    const shards: string[] = [];
    for (const item of out.Items ?? []) {
      const parsed = shardIndexItemSchema.safeParse(item);
      if (parsed.success) shards.push(parsed.data.shard);
      else
        this.logger.warn("malformed shard index item left out", {
          ...malformedFrom(String(item.sk), parsed.error),
        });
    }
    return out.LastEvaluatedKey
      ? { shards, nextPageToken: encodePageToken({ legacy: out.LastEvaluatedKey }) }
      : { shards };
  }
}

export function encodePageToken(token: PageToken | Record<string, unknown>): string {
  return Buffer.from(JSON.stringify(token)).toString("base64url");
}

export function decodePageToken(token: string): PageToken {
  let decoded: unknown;
  try {
    decoded = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    throw new ConfigurationError("invalid shard list page token: not a token returned by list()");
  }
  const parsed = pageTokenSchema.safeParse(decoded);
  if (!parsed.success)
    throw new ConfigurationError("invalid shard list page token: not a token returned by list()");
  return parsed.data;
}

/** All DynamoDB adapters over one table. */
export function createDynamoCoordinationStore(context: DynamoTableContext): CoordinationStore {
  return {
    heartbeats: new DynamoHeartbeatStore(context),
    replicaSets: new DynamoReplicaSetStore(context),
    locks: new DynamoLockStore(context),
    topology: new DynamoTopologyStore(context),
    history: new DynamoHistoryStore(context),
    shards: new DynamoShardIndex(context),
  };
}
