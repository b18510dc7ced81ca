import { setTimeout as sleep } from "node:timers/promises";
import { Logger } from "@aws-lambda-powertools/logger";
import type { Command } from "commander";
import { discardMetrics, powertoolsLogger } from "../../adapters/observability.ts";
import { createControllerRuntime } from "../../controller/runtime.ts";
import { errorMessage } from "../../core/errors.ts";
import { listAllShards, requireKnownShard, withOperatorSession } from "../aws-session.ts";
import { abortOnSignal } from "../signals.ts";
import { renderShardStatus, type ShardStatus, shardStatus } from "../status-view.ts";
import { ReportRequests } from "./report-requests.ts";

/** `status --watch` redraws this often, like `watch`'s default. */
export const WATCH_INTERVAL_MS = 1000;

/** The first line of every `status --watch` frame (a reader of the output splits frames on it). */
export const WATCH_HEADER = "Every 1.0 s: shardguard status";

interface StatusOptions {
  readonly shard?: string;
  readonly json?: boolean;
  readonly watch?: boolean;
  readonly fresh?: boolean;
}

/** The controller's parts `--fresh` sends REPORT with: the same path as an in-process switchover. */
function reportingRuntime() {
  const logger = new Logger({
    serviceName: "shardguard-cli",
    logLevel: (process.env.SHARDGUARD_LOG_LEVEL ?? "WARN") as "WARN",
  });
  return createControllerRuntime(process.env, { log: powertoolsLogger(logger), metrics: discardMetrics });
}

export function registerStatus(program: Command): void {
  program
    .command("status")
    .description(
      "per shard its status, epoch, primary and what the controller waits for; per node the role the " +
        "topology gives it, offset with its age, lag (when the reports compare), heartbeat age, link, priority",
    )
    .option("--shard <id>", "one shard instead of every registered shard, with the controller's line")
    .option("--json", "machine-readable output (one line per frame with --watch)")
    .option("--watch", `redraw every ${WATCH_INTERVAL_MS / 1000} s until interrupted (Ctrl-C)`)
    .option(
      "--fresh",
      "ask every replica's agent to report now (a REPORT command, as the controller sends) and show " +
        "current offsets; needs sqs:SendMessage on the nodes' queues",
    )
    .action(async (options: StatusOptions) => {
      await withOperatorSession(async ({ aws, config }) => {
        if (options.shard) await requireKnownShard(aws.store, options.shard);
        const runtime = options.fresh ? reportingRuntime() : undefined;
        const reports = runtime ? new ReportRequests(runtime.deps) : undefined;
        const read = async (): Promise<ShardStatus[]> => {
          const shards = options.shard ? [options.shard] : await listAllShards(aws.store);
          const statuses: ShardStatus[] = [];
          for (const shard of shards) {
            let snapshot = await aws.store.heartbeats.snapshot(shard);
            if (reports) {
              snapshot = options.watch
                ? (await reports.ask(snapshot))
                  ? await aws.store.heartbeats.snapshot(shard)
                  : snapshot
                : await reports.fresh(shard, snapshot);
            }
            statuses.push(
              shardStatus(snapshot, aws.clock.now(), config, { reportsAskedAt: reports?.askedAt(shard) }),
            );
          }
          return statuses;
        };
        const render = (statuses: readonly ShardStatus[]): string => {
          if (options.json) {
            return `${JSON.stringify({ at: new Date(aws.clock.now()).toISOString(), shards: statuses })}\n`;
          }
          if (statuses.length === 0) {
            return "no shard is registered yet (agents register their shard on their first heartbeat)\n";
          }
          const controllerLine = options.shard !== undefined;
          return `${statuses.map((status) => renderShardStatus(status, { controllerLine })).join("\n\n")}\n`;
        };
        try {
          if (!options.watch) {
            process.stdout.write(render(await read()));
            return;
          }
          await watch(options, read, render);
        } finally {
          runtime?.destroy();
        }
      });
    });
}

/**
 * Redraws every second until SIGINT or SIGTERM; a failed read shows its error in the frame and the
 * next frame reads again (the store may be what the incident is about). On a terminal each frame
 * replaces the last; otherwise frames follow one another, each opening with `WATCH_HEADER`.
 */
async function watch(
  options: StatusOptions,
  read: () => Promise<ShardStatus[]>,
  render: (statuses: readonly ShardStatus[]) => string,
): Promise<void> {
  const stop = abortOnSignal();
  await watchFrames({
    title: `${WATCH_HEADER}${options.shard ? ` --shard ${options.shard}` : ""}${options.fresh ? " --fresh" : ""}`,
    json: options.json === true,
    terminal: process.stdout.isTTY === true,
    frame: async () => render(await read()),
    write: (text) => process.stdout.write(text),
    signal: stop.signal,
  });
}

export interface WatchOptions {
  /** The first line of each frame (not in JSON frames). */
  readonly title: string;
  /** Each frame is one JSON line: written as it is, an error as `{"error": ...}`. */
  readonly json: boolean;
  /** Clear the screen before each frame (a terminal). */
  readonly terminal: boolean;
  readonly frame: () => Promise<string>;
  readonly write: (text: string) => void;
  readonly signal: AbortSignal;
  /** @default WATCH_INTERVAL_MS */
  readonly intervalMs?: number;
}

/** The `--watch` loop: a frame, a pause of `intervalMs`, until `signal` aborts (no frame after it). */
export async function watchFrames(options: WatchOptions): Promise<void> {
  const intervalMs = options.intervalMs ?? WATCH_INTERVAL_MS;
  while (!options.signal.aborted) {
    let body: string;
    try {
      body = await options.frame();
    } catch (error) {
      body = options.json
        ? `${JSON.stringify({ error: errorMessage(error) })}\n`
        : `status: ${errorMessage(error)}\n`;
    }
    if (options.signal.aborted) break;
    if (options.json) options.write(body);
    else {
      const frame = `${options.title}  ${new Date().toISOString()}\n\n${body}`;
      options.write(options.terminal ? `\x1b[H\x1b[J${frame}` : `${frame}\n`);
    }
    await sleep(intervalMs, undefined, { signal: options.signal }).catch(() => undefined);
  }
}
