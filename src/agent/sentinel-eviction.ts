import { Redis, type RedisOptions } from "ioredis";
import { parseAddress } from "../core/address.ts";

/** Shardguard's own connections (agent, probes, this one) are named with this prefix and kept. */
const OWN_PREFIX = "shardguard";

/**
 * Ids of the application connections in a `CLIENT LIST` reply: every line whose `name` does not
 * start with "shardguard".
 */
export function applicationClientIds(clientList: string): string[] {
  const ids: string[] = [];
  for (const line of clientList.split("\n")) {
    const fields = new Map<string, string>();
    for (const pair of line.trim().split(" ")) {
      const equals = pair.indexOf("=");
      if (equals > 0) fields.set(pair.slice(0, equals), pair.slice(equals + 1));
    }
    const id = fields.get("id");
    if (id === undefined || (fields.get("name") ?? "").startsWith(OWN_PREFIX)) continue;
    ids.push(id);
  }
  return ids;
}

export interface EvictionTarget {
  /** host:port of the database. */
  readonly address: string;
  /** Credentials and TLS, as every agent connection has them (`redisConnectSettings`). */
  readonly connection?: Pick<RedisOptions, "username" | "password" | "tls" | "disableClientInfo">;
  readonly timeoutMs: number;
}

/**
 * Closes the application connections (normal and pub/sub) of a database that stopped being the
 * primary clients were given, as Sentinel does after a failover (CLIENT KILL TYPE normal/pubsub):
 * Sentinel clients only rediscover the primary when their connection drops; a client left on a
 * demoted node would get READONLY until it reconnects. Returns how many were closed.
 */
export async function evictApplicationClients(target: EvictionTarget): Promise<number> {
  const { host, port } = parseAddress(target.address);
  const client = new Redis({
    host,
    port,
    ...target.connection,
    connectionName: `${OWN_PREFIX}-sentinel-eviction`,
    lazyConnect: true,
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    connectTimeout: target.timeoutMs,
    commandTimeout: target.timeoutMs,
  });
  client.on("error", () => {
    // The failure surfaces as the rejected command below.
  });
  try {
    await client.connect();
    const lists = await Promise.all(
      ["normal", "pubsub"].map((type) => client.call("CLIENT", "LIST", "TYPE", type) as Promise<string>),
    );
    const ids = lists.flatMap(applicationClientIds);
    const killed = await Promise.all(
      ids.map((id) => client.call("CLIENT", "KILL", "ID", id) as Promise<number>),
    );
    return killed.reduce((sum, count) => sum + Number(count), 0);
  } finally {
    client.disconnect();
  }
}
