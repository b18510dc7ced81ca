import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);
const CLI = "src/cli/main.ts";

/** What one run of the CLI printed and how it exited. */
export interface CliResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/**
 * Runs the real `shardguard` CLI (a child process, as an operator's shell does) against the stack
 * `cluster.env` points at; never throws on a non-zero exit.
 */
export async function shardguard(
  cluster: { readonly env: NodeJS.ProcessEnv },
  ...args: string[]
): Promise<CliResult> {
  try {
    const { stdout, stderr } = await run(process.execPath, [CLI, ...args], {
      env: cluster.env,
      timeout: 60_000,
    });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const failed = error as { code?: number; stdout?: string; stderr?: string };
    return { code: failed.code ?? 1, stdout: failed.stdout ?? "", stderr: failed.stderr ?? "" };
  }
}
