import { type AwsAdapters, createAwsAdapters } from "../adapters/aws-adapters.ts";
import type { AwsPrincipal } from "../adapters/aws-call-journal.ts";
import { failoverConfigFromEnv } from "../adapters/env.ts";
import { silentLogger } from "../adapters/observability.ts";
import type { FailoverConfig } from "../core/config.ts";
import { ShardguardError } from "../core/errors.ts";
import type { CoordinationStore } from "../core/ports.ts";

/** An operator command that names a shard the table knows nothing about. */
export class UnknownShard extends ShardguardError {
  override name = "UnknownShard";
}

export interface OperatorSession {
  readonly aws: AwsAdapters;
  readonly config: FailoverConfig;
}

/**
 * Runs `action` with adapters built from the standard SDK variables and SHARDGUARD_* settings,
 * the same way against an account, LocalStack or `shardguard local-stack`, and closes them after.
 * Operator commands fail fast (two attempts) rather than retrying for long at 3 a.m.
 */
export async function withOperatorSession<T>(
  action: (session: OperatorSession) => Promise<T>,
  options: {
    /**
     * The principal the session's calls need (the journal's label): the operator role for reads.
     * `undefined` for commands that need administrator rights (decommission deletes items and queues).
     * @default operator
     */
    readonly principal?: AwsPrincipal | undefined;
  } = { principal: { component: "operator" } },
): Promise<T> {
  const config = failoverConfigFromEnv(process.env);
  const aws = createAwsAdapters({
    env: process.env,
    principal: options.principal,
    maxAttempts: 2,
    // Malformed items are shown in the status output; keep stderr for real errors.
    logger: silentLogger,
  });
  try {
    return await action({ aws, config });
  } finally {
    aws.destroy();
  }
}

/** Fails with the list of known shards when `shard` has neither a topology nor heartbeats. */
export async function requireKnownShard(store: CoordinationStore, shard: string): Promise<void> {
  const snapshot = await store.heartbeats.snapshot(shard);
  if (snapshot.topology || snapshot.nodes.length > 0) return;
  const known = await listAllShards(store);
  const list = known.length > 0 ? `known shards: ${known.join(", ")}` : "no shard is registered yet";
  throw new UnknownShard(`unknown shard "${shard}" (${list})`);
}

/** Every registered shard, following the index's pages. */
export async function listAllShards(store: CoordinationStore): Promise<string[]> {
  // Each id once: a shard of an older installation is in the legacy index partition too.
  const shards = new Set<string>();
  let pageToken: string | undefined;
  do {
    const page = await store.shards.list(pageToken);
    for (const shard of page.shards) shards.add(shard);
    pageToken = page.nextPageToken;
  } while (pageToken);
  return [...shards];
}
