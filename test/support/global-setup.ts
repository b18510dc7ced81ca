import type { TestProject } from "vitest/node";
import { type LocalStack, startLocalStack } from "../../src/dev/local-stack/stack.ts";

let stack: LocalStack | undefined;

/**
 * Starts DynamoDB Local and the SQS emulator once for the integration project, unless
 * endpoints are already set (LocalStack: AWS_ENDPOINT_URL=http://localhost:4566), and hands
 * the standard SDK variables to the test workers.
 */
export async function setup(project: TestProject): Promise<void> {
  stack = await startLocalStack({ onProgress: (line) => console.log(`[local-stack] ${line}`) });
  Object.assign(process.env, stack.env);
  project.provide("awsEnv", { ...stack.env });
}

export async function teardown(): Promise<void> {
  await stack?.stop();
}

declare module "vitest" {
  export interface ProvidedContext {
    awsEnv: Record<string, string>;
  }
}
