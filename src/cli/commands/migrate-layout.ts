import type { Command } from "commander";
import { ShardguardError } from "../../core/errors.ts";
import { listAllShards, withOperatorSession } from "../aws-session.ts";

/** Attempts per shard when the topology changes while it is being moved. */
const MIGRATE_ATTEMPTS = 3;

/**
 * Installations before the controller's own partition (`CONTROL#<shard>`) kept each shard's topology
 * and lock in the agents' partition, where any node's credentials could overwrite them. The new
 * controller takes no automatic action on such a shard (decision `legacy_layout`) and agents follow
 * the old topology until this moves it: one transaction per shard (docs/deploy.md#upgrading). Run it
 * with administrator or controller-role credentials right after upgrading; it is idempotent.
 */
export function registerMigrateLayout(program: Command): void {
  program
    .command("migrate-layout")
    .description(
      "move each shard's topology to the controller's partition (once, after upgrading from an installation before it)",
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
          `the topology of ${conflicts.map(([shard]) => shard).join(", ")} kept changing while being moved; run migrate-layout again`,
        );
      }
    });
}
