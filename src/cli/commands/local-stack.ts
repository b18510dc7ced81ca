import type { Command } from "commander";
import { startLocalStack } from "../../dev/local-stack/stack.ts";
import { parseIntegerOption } from "../options.ts";
import { untilSignal } from "../signals.ts";

export function registerLocalStack(program: Command): void {
  program
    .command("local-stack")
    .description(
      "run DynamoDB Local, the SQS emulator and optional redis-server nodes in the foreground; " +
        "the first stdout line is the JSON environment for any AWS SDK tool",
    )
    .option(
      "--redis <count>",
      "redis-server nodes to start (first primary, rest replicas)",
      parseIntegerOption(0, 16),
      0,
    )
    .option("--json", "print only the JSON line on stdout (progress still goes to stderr)")
    .action(async (options: { redis: number; json?: boolean }) => {
      const progress = (line: string) => process.stderr.write(`local-stack: ${line}\n`);
      // Listen before starting: a SIGINT/SIGTERM during start-up must still stop what was started
      // (without a listener Node dies at once and the exit hooks never run).
      let signalled: NodeJS.Signals | undefined;
      const signal = untilSignal().then((received) => {
        signalled = received;
        progress(`${received} received, stopping`);
        return received;
      });
      const stack = await startLocalStack({ redis: options.redis, onProgress: progress });
      if (signalled) {
        await stack.stop();
        return;
      }
      const line = { ...stack.env, redis: stack.redis.map((node) => node.address) };
      process.stdout.write(`${JSON.stringify(line)}\n`);
      if (!options.json) {
        progress("ready; the line above holds the environment for any AWS SDK tool (see the README)");
        progress("press Ctrl-C to stop");
      }
      await signal;
      await stack.stop();
    });
}
