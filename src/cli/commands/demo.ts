import type { Command } from "commander";
import { runDemo } from "../../dev/demo.ts";
import { parseIntegerOption } from "../options.ts";
import { abortOnSignal } from "../signals.ts";

export function registerDemo(program: Command): void {
  program
    .command("demo")
    .description(
      "live failover on the embedded local stack: 3 redis-server nodes with agents and a controller, a " +
        "writer, SIGKILL of the primary, the failover phase by phase, the old primary rejoining",
    )
    .option("--json", "print one machine-readable summary on stdout (progress goes to stderr)")
    .option("--failure-timeout-ms <ms>", "controller failure timeout", parseIntegerOption(500, 60_000), 3000)
    .option("--heartbeat-interval-ms <ms>", "agent heartbeat interval", parseIntegerOption(100, 10_000), 1000)
    .option("--warmup-ms <ms>", "steady writes before the kill", parseIntegerOption(0, 60_000), 3000)
    .action(
      async (options: {
        json?: boolean;
        failureTimeoutMs: number;
        heartbeatIntervalMs: number;
        warmupMs: number;
      }) => {
        const abort = abortOnSignal();
        const live = !options.json && process.stdout.isTTY === true;
        const summary = await runDemo({
          nodes: 3,
          config: {
            failureTimeoutMs: options.failureTimeoutMs,
            heartbeatIntervalMs: options.heartbeatIntervalMs,
            fenceTimeoutMs: Math.max(
              options.heartbeatIntervalMs + 100,
              Math.round(options.failureTimeoutMs * 0.66),
            ),
            tickIntervalMs: Math.min(1000, options.heartbeatIntervalMs),
          },
          warmupMs: options.warmupMs,
          live,
          out: (text) => (options.json ? process.stderr : process.stdout).write(text),
          signal: abort.signal,
        });
        if (options.json) {
          process.stdout.write(`${JSON.stringify(summary)}\n`);
        } else {
          process.stdout.write(`\n${JSON.stringify(summary, null, 2)}\n`);
        }
      },
    );
}
