import type { Command } from "commander";
import { endpointOf } from "../../client/primary-resolver.ts";
import { requireKnownShard, withOperatorSession } from "../aws-session.ts";
import { parseIntegerOption } from "../options.ts";
import { renderHistory } from "../status-view.ts";
import { registerStatus } from "./status.ts";

/** Exit code of `primary` when the shard has no writable primary right now (failing over, offline). */
export const NO_PRIMARY_EXIT_CODE = 3;

/** Read-only commands: they read the table directly and never change a shard. */
export function registerInspectCommands(program: Command): void {
  registerStatus(program);

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
      `host:port of the shard's current primary, for scripts; exit ${NO_PRIMARY_EXIT_CODE} while it is failing over (until the new primary is confirmed) or offline`,
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
