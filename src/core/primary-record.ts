import { z } from "zod";
import { idSchema } from "./model.ts";

/**
 * The optional DNS record per shard that follows the primary (docs/clients.md#dns): for clients
 * that take a host name and nothing else. The controller writes it once the topology names a primary
 * online (after the confirm phase), fenced by epoch: a TXT record beside it carries the epoch the
 * address belongs to, and every change deletes that exact TXT value in the same atomic batch, so a
 * controller holding an older epoch, or one that read the records before another wrote them, has its
 * whole batch refused by Route 53 and cannot point the name back.
 */

export const primaryRecordSchema = z.object({
  /** The Route 53 hosted zone (its id, `Z...`, without `/hostedzone/`). */
  hostedZoneId: z.string().regex(/^[A-Z0-9]{1,32}$/, "a hosted zone id such as Z0123456789ABCDEFGHIJ"),
  /** The record's name, in that zone (e.g. `orders.redis.example.com`). */
  name: z
    .string()
    .min(1)
    .max(200)
    .regex(/^[A-Za-z0-9_.-]+$/, "a DNS name of letters, digits, '-', '_' and '.'")
    .transform((name) => name.toLowerCase().replace(/\.$/, "")),
  /** Seconds clients may cache the answer. @default 5 */
  ttl: z.number().int().min(1).max(86_400).default(5),
});
export type PrimaryRecordConfig = z.output<typeof primaryRecordSchema>;
export type PrimaryRecordInput = z.input<typeof primaryRecordSchema>;

/** Shard id → its record (`SHARDGUARD_PRIMARY_RECORDS`, the construct's `primaryRecords`). */
export const primaryRecordsSchema = z.record(idSchema, primaryRecordSchema);
export type PrimaryRecords = z.output<typeof primaryRecordsSchema>;

/** The TXT record that fences the name: `_shardguard.<name>` (a CNAME allows no other record beside it). */
export function epochRecordName(name: string): string {
  return `_shardguard.${name}`;
}

const EPOCH_TXT = /^"shardguard-epoch=(\d+)"$/;

/** A TXT value as Route 53 stores it: quoted. */
export function epochTxtValue(epoch: number): string {
  return `"shardguard-epoch=${epoch}"`;
}

export type AddressRecordType = "A" | "AAAA" | "CNAME";

/** A for an IPv4 host, AAAA for IPv6, CNAME for a host name. The port is not in DNS: clients know it. */
export function addressRecord(host: string): { type: AddressRecordType; value: string } {
  if (/^\d{1,3}(\.\d{1,3}){3}$/.test(host)) return { type: "A", value: host };
  if (host.includes(":")) return { type: "AAAA", value: host.replace(/^\[|\]$/g, "") };
  return { type: "CNAME", value: host.toLowerCase().replace(/\.$/, "") };
}

/** One record set as read: type, TTL, values. */
export interface RecordSet {
  readonly type: string;
  readonly ttl: number;
  readonly values: readonly string[];
}

/** What the zone holds now at the record's name and at its epoch record's name. */
export interface CurrentRecords {
  readonly address: readonly RecordSet[];
  readonly epoch: RecordSet | undefined;
}

export interface RecordChange {
  readonly action: "CREATE" | "DELETE" | "UPSERT";
  readonly name: string;
  readonly type: string;
  readonly ttl: number;
  readonly values: readonly string[];
}

export type RecordPlan =
  | { readonly kind: "current"; readonly reason: string }
  | { readonly kind: "stale"; readonly reason: string }
  | { readonly kind: "change"; readonly changes: readonly RecordChange[]; readonly reason: string };

/** The epoch a TXT record set carries, or undefined when it is not one of ours. */
export function epochOf(txt: RecordSet | undefined): number | undefined {
  const match = txt?.type === "TXT" && txt.values.length === 1 ? EPOCH_TXT.exec(txt.values[0] ?? "") : null;
  return match ? Number(match[1]) : undefined;
}

/**
 * What to change so that `config.name` points at `host` for `epoch`: nothing when the records
 * already say so (`current`) or carry a newer epoch (`stale`: the name belongs to a later primary);
 * else one batch: DELETE the exact epoch TXT read (its absence: CREATE, which fails if another
 * writer created it since), CREATE the new one, DELETE an address record of another type (a CNAME
 * replaced by an A), UPSERT the address record.
 */
export function planPrimaryRecord(
  config: PrimaryRecordConfig,
  current: CurrentRecords,
  wanted: { readonly epoch: number; readonly host: string },
): RecordPlan {
  const published = epochOf(current.epoch);
  if (published !== undefined && published > wanted.epoch) {
    return {
      kind: "stale",
      reason: `${config.name} carries epoch ${published}, newer than ${wanted.epoch}: left as it is`,
    };
  }
  const target = addressRecord(wanted.host);
  const same = current.address.find((set) => set.type === target.type);
  const matches =
    same !== undefined &&
    same.ttl === config.ttl &&
    same.values.length === 1 &&
    same.values[0] === target.value;
  const others = current.address.filter((set) => set.type !== target.type);
  if (published === wanted.epoch && matches && others.length === 0) {
    return {
      kind: "current",
      reason: `${config.name} ${target.type} ${target.value} at epoch ${wanted.epoch}`,
    };
  }
  const epochName = epochRecordName(config.name);
  const changes: RecordChange[] = [
    ...(current.epoch ? [{ action: "DELETE" as const, name: epochName, ...current.epoch }] : []),
    {
      action: "CREATE",
      name: epochName,
      type: "TXT",
      ttl: config.ttl,
      values: [epochTxtValue(wanted.epoch)],
    },
    ...others.map((set) => ({ action: "DELETE" as const, name: config.name, ...set })),
    { action: "UPSERT", name: config.name, type: target.type, ttl: config.ttl, values: [target.value] },
  ];
  return {
    kind: "change",
    changes,
    reason: `${config.name} -> ${target.type} ${target.value} at epoch ${wanted.epoch} (was ${published ?? "unset"})`,
  };
}

/** The controller's side: make a shard's record name its online primary (adapters implement it). */
export interface PrimaryRecordPublisher {
  /** Whether `shard` has a record at all. */
  has(shard: string): boolean;
  /**
   * Brings the record up to `epoch` and the primary's `host`. Never throws: an error is logged and
   * retried on a later cycle.
   */
  sync(shard: string, epoch: number, host: string): Promise<void>;
}
