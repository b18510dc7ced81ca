import type { Command } from "commander";
import { ShardguardError } from "../../core/errors.ts";
import { listAllShards, withOperatorSession } from "../aws-session.ts";

/** Attempts per shard when the topology changes while it is being moved. */
const MIGRATE_ATTEMPTS = 3;

/**
 * Older installations kept in the shard partition `SHARD#<shard>`, where any node's credentials can
 * write, what only the controller (topology, lock) or only one node (its heartbeat and replica set)
 * should write. The controller takes no automatic action on such a shard (decision `legacy_layout`)
 * until this moves them: the topology to the controller's partition, each heartbeat and replica set to
 * its node's own partition, then marks the shard (docs/deploy.md#upgrading-to-node-partitions). Run it
 * with administrator or controller-role credentials once every agent is upgraded; it is idempotent.
 */
export function registerMigrateLayout(program: Command): void {
  program
    .command("migrate-layout")
    .description(
      "move each shard's topology, heartbeats and replica sets out of the shard partition (once, after upgrading every agent)",
    )
    .option("--shard <id>", "one shard instead of every registered shard")
    .option("--json", "machine-readable result")
    .action(async (options: { shard?: string; json?: boolean }) => {
      const results = await withOperatorSession(
        async ({ aws }) => {
          const shards = options.shard ? [options.shard] : await listAllShards(aws.store);
          const outcome: Record<string, string> = {};
          for (const shard of shards) {
            let result = await aws.store.topology.migrateLegacy(shard);
            for (let attempt = 1; result === "conflict" && attempt < MIGRATE_ATTEMPTS; attempt++) {
              result = await aws.store.topology.migrateLegacy(shard);
            }
            outcome[shard] = result;
            if (!options.json) process.stderr.write(`shard ${shard}: ${result}\n`);
          }
          return outcome;
        },
        // Writes the controller's items: not the operator role's to do.
        { principal: undefined },
      );
      if (options.json) process.stdout.write(`${JSON.stringify({ shards: results })}\n`);
      const conflicts = Object.entries(results).filter(([, result]) => result === "conflict");
      if (conflicts.length > 0) {
        throw new ShardguardError(
          `shard ${conflicts.map(([shard]) => shard).join(", ")}: an item kept changing while being moved (an agent of the previous release still writing? upgrade it); run migrate-layout again`,
        );
      }
    });
}
