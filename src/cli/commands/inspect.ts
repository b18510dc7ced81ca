import type { Command } from "commander";
import { endpointOf } from "../../client/primary-resolver.ts";
import { listAllShards, requireKnownShard, withOperatorSession } from "../aws-session.ts";
import { parseIntegerOption } from "../options.ts";
import { renderHistory, renderShardStatus, shardStatus } from "../status-view.ts";

/** Exit code of `primary` when the shard has no writable primary right now (failing over, offline). */
export const NO_PRIMARY_EXIT_CODE = 3;

/** Read-only commands: they read the table directly and never change a shard. */
export function registerInspectCommands(program: Command): void {
  program
    .command("status")
    .description(
      "per shard its status, epoch and primary; per node role, offset, lag, heartbeat age, link, priority",
    )
    .option("--shard <id>", "one shard instead of every registered shard")
    .option("--json", "machine-readable output")
    .action(async (options: { shard?: string; json?: boolean }) => {
      await withOperatorSession(async ({ aws, config }) => {
        if (options.shard) await requireKnownShard(aws.store, options.shard);
        const shards = options.shard ? [options.shard] : await listAllShards(aws.store);
        const statuses = [];
        for (const shard of shards) {
          const snapshot = await aws.store.heartbeats.snapshot(shard);
          statuses.push(shardStatus(snapshot, aws.clock.now(), config.failureTimeoutMs));
        }
        if (options.json) {
          process.stdout.write(
            `${JSON.stringify({ at: new Date(aws.clock.now()).toISOString(), shards: statuses })}\n`,
          );
        } else if (statuses.length === 0) {
          process.stdout.write(
            "no shard is registered yet (agents register their shard on their first heartbeat)\n",
          );
        } else {
          process.stdout.write(`${statuses.map(renderShardStatus).join("\n\n")}\n`);
        }
      });
    });

  program
    .command("history")
    .description(
      "failovers and switchovers of a shard, newest first, with reasons, candidates and phase timings",
    )
    .requiredOption("--shard <id>", "the shard")
    .option("--limit <n>", "at most this many records", parseIntegerOption(1, 1000), 50)
    .option("--json", "machine-readable output")
    .action(async (options: { shard: string; limit: number; json?: boolean }) => {
      await withOperatorSession(async ({ aws }) => {
        await requireKnownShard(aws.store, options.shard);
        const records = await aws.store.history.list(options.shard, options.limit);
        process.stdout.write(
          options.json
            ? `${JSON.stringify({ shard: options.shard, history: records })}\n`
            : `${renderHistory(options.shard, records)}\n`,
        );
      });
    });

  program
    .command("primary")
    .description(
      `host:port of the shard's current primary, for scripts; exit ${NO_PRIMARY_EXIT_CODE} while it is failing over or offline`,
    )
    .requiredOption("--shard <id>", "the shard")
    .action(async (options: { shard: string }) => {
      await withOperatorSession(async ({ aws }) => {
        const topology = await aws.store.topology.read(options.shard);
        if (!topology) await requireKnownShard(aws.store, options.shard);
        const endpoint = topology ? endpointOf(topology) : undefined;
        if (endpoint) {
          process.stdout.write(`${endpoint.address}\n`);
          return;
        }
        const state = topology
          ? `${topology.status}${topology.phase ? ` (phase ${topology.phase})` : ""}`
          : "not initialized";
        process.stderr.write(`shardguard: shard ${options.shard} has no primary right now: ${state}\n`);
        process.exitCode = NO_PRIMARY_EXIT_CODE;
      });
    });
}
