import {
  ChangeResourceRecordSetsCommand,
  InvalidChangeBatch,
  ListResourceRecordSetsCommand,
  type ResourceRecordSet,
  type Route53Client,
} from "@aws-sdk/client-route-53";
import { errorMessage } from "../core/errors.ts";
import type { Logger } from "../core/observability.ts";
import {
  type CurrentRecords,
  epochRecordName,
  type PrimaryRecordConfig,
  type PrimaryRecordPublisher,
  type PrimaryRecords,
  planPrimaryRecord,
  type RecordSet,
} from "../core/primary-record.ts";

/** After a failed sync, how long a shard waits before it asks Route 53 again (its API allows 5 requests/s per account). */
export const RETRY_AFTER_MS = 30_000;

export interface Route53PrimaryRecordsOptions {
  readonly client: Route53Client;
  readonly records: PrimaryRecords;
  readonly logger: Logger;
  /** @default Date.now */
  readonly now?: () => number;
}

/**
 * The primary's DNS record in Route 53 (src/core/primary-record.ts plans it). Per process, what was
 * synced is remembered per shard and epoch, so a shard costs Route 53 two reads and at most one
 * change per epoch, not one per tick; a failure waits RETRY_AFTER_MS before the next try.
 */
export class Route53PrimaryRecords implements PrimaryRecordPublisher {
  readonly #client: Route53Client;
  readonly #records: PrimaryRecords;
  readonly #logger: Logger;
  readonly #now: () => number;
  /** shard → the epoch its record is known to name (or a newer one). */
  readonly #synced = new Map<string, number>();
  readonly #retryAt = new Map<string, number>();

  constructor(options: Route53PrimaryRecordsOptions) {
    this.#client = options.client;
    this.#records = options.records;
    this.#logger = options.logger;
    this.#now = options.now ?? Date.now;
  }

  has(shard: string): boolean {
    return this.#records[shard] !== undefined;
  }

  async sync(shard: string, epoch: number, host: string): Promise<void> {
    const config = this.#records[shard];
    if (!config) return;
    if ((this.#synced.get(shard) ?? -1) >= epoch) return;
    if (this.#now() < (this.#retryAt.get(shard) ?? 0)) return;
    try {
      const current = await this.#read(config);
      const plan = planPrimaryRecord(config, current, { epoch, host });
      if (plan.kind === "change") {
        await this.#client.send(
          new ChangeResourceRecordSetsCommand({
            HostedZoneId: config.hostedZoneId,
            ChangeBatch: {
              Comment: `shardguard: shard ${shard} epoch ${epoch}`,
              Changes: plan.changes.map((change) => ({
                Action: change.action,
                ResourceRecordSet: {
                  Name: change.name,
                  Type: change.type as ResourceRecordSet["Type"],
                  TTL: change.ttl,
                  ResourceRecords: change.values.map((value) => ({ Value: value })),
                },
              })),
            },
          }),
        );
        this.#logger.info("primary record updated", { shard, epoch, change: plan.reason });
      } else {
        this.#logger.debug("primary record unchanged", { shard, epoch, reason: plan.reason });
      }
      this.#synced.set(shard, epoch);
      this.#retryAt.delete(shard);
    } catch (error) {
      this.#retryAt.set(shard, this.#now() + RETRY_AFTER_MS);
      // InvalidChangeBatch: the epoch record changed since it was read (another controller wrote
      // it): the next try reads again, and does nothing if that was a newer epoch.
      this.#logger.warn("primary record not updated; retried later", {
        shard,
        epoch,
        record: config.name,
        conflict: error instanceof InvalidChangeBatch,
        error: errorMessage(error),
        retry_in_ms: RETRY_AFTER_MS,
      });
    }
  }

  async #read(config: PrimaryRecordConfig): Promise<CurrentRecords> {
    const [address, epoch] = await Promise.all([
      this.#list(config.hostedZoneId, config.name, 3),
      this.#list(config.hostedZoneId, epochRecordName(config.name), 1),
    ]);
    return {
      address: address.filter((set) => ["A", "AAAA", "CNAME"].includes(set.type)),
      epoch: epoch.find((set) => set.type === "TXT"),
    };
  }

  /** The record sets named exactly `name` (ListResourceRecordSets starts there and goes on past it). */
  async #list(zone: string, name: string, maxItems: number): Promise<RecordSet[]> {
    const out = await this.#client.send(
      new ListResourceRecordSetsCommand({
        HostedZoneId: zone,
        StartRecordName: name,
        MaxItems: maxItems,
      }),
    );
    return (out.ResourceRecordSets ?? [])
      .filter((set) => normalize(set.Name ?? "") === name && set.SetIdentifier === undefined)
      .map((set) => ({
        type: String(set.Type),
        ttl: set.TTL ?? 0,
        values: (set.ResourceRecords ?? []).map((record) => record.Value ?? ""),
      }));
  }
}

/** Route 53 answers names fully qualified (`orders.example.com.`), lower case, `*` as `\052`. */
function normalize(name: string): string {
  return name.toLowerCase().replace(/\.$/, "");
}
