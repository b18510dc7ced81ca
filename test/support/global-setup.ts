import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";
import { ENV } from "../../src/adapters/env.ts";
import { type LocalStack, startLocalStack } from "../../src/dev/local-stack/stack.ts";
import { checkCalls, describeDenials, readJournal } from "./iam-check.ts";

let stack: LocalStack | undefined;
let journal: string | undefined;

/**
 * Starts DynamoDB Local and the SQS emulator once for the integration project, unless
 * endpoints are already set (LocalStack: AWS_ENDPOINT_URL=http://localhost:4566), and hands
 * the standard SDK variables to the test workers.
 *
 * Every agent, controller and operator the suite runs journals its AWS requests
 * (SHARDGUARD_AWS_CALL_LOG, inherited by workers and the processes they start); at the end each one
 * is checked against the synthesized IAM policies of the role it runs as, and a denied call fails
 * the run (vitest sets a failing exit code for a global teardown error).
 */
export async function setup(project: TestProject): Promise<void> {
  stack = await startLocalStack({ onProgress: (line) => console.log(`[local-stack] ${line}`) });
  journal = mkdtempSync(join(tmpdir(), "shardguard-suite-calls-"));
  Object.assign(process.env, stack.env, { [ENV.awsCallLog]: journal });
  project.provide("awsEnv", { ...stack.env });
}

export async function teardown(): Promise<void> {
  await stack?.stop();
  if (!journal) return;
  const report = await checkCalls(readJournal(journal));
  rmSync(journal, { recursive: true, force: true });
  console.log(
    `[iam] ${report.calls} recorded AWS calls checked against the synthesized policies` +
      ` (${report.generatedIdCalls} of agents with a generated node id not checked: no policy names them)`,
  );
  if (report.denials.length > 0) {
    throw new Error(
      `the synthesized IAM policies deny calls the suite made:\n${describeDenials(report.denials)}`,
    );
  }
}

declare module "vitest" {
  export interface ProvidedContext {
    awsEnv: Record<string, string>;
  }
}
