import { Command } from "commander";
import { errorMessage } from "../core/errors.ts";
import { registerAgent } from "./commands/agent.ts";
import { registerController } from "./commands/controller.ts";
import { registerDecommission } from "./commands/decommission.ts";
import { registerDemo } from "./commands/demo.ts";
import { registerInspectCommands } from "./commands/inspect.ts";
import { registerLocalStack } from "./commands/local-stack.ts";
import { registerMigrateLayout } from "./commands/migrate-layout.ts";
import { registerOperatorActions } from "./commands/operator-actions.ts";

export function buildProgram(): Command {
  const program = new Command()
    .name("shardguard")
    .description("Automatic failover for Redis-protocol primary/replica shards, coordinated on AWS")
    .showHelpAfterError("(run with --help for usage)");
  registerLocalStack(program);
  registerAgent(program);
  registerController(program);
  registerInspectCommands(program);
  registerOperatorActions(program);
  registerDecommission(program);
  registerMigrateLayout(program);
  registerDemo(program);
  return program;
}

export async function main(argv: readonly string[]): Promise<void> {
  try {
    await buildProgram().parseAsync([...argv]);
  } catch (error) {
    process.stderr.write(`shardguard: ${errorMessage(error)}\n`);
    process.exitCode = 1;
  }
}

if (import.meta.main) {
  await main(process.argv);
}
