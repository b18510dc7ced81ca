import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { ListQueuesCommand, SQSClient } from "@aws-sdk/client-sqs";
import { PrerequisiteError } from "../../core/errors.ts";
import { LOCAL_CREDENTIALS, LOCAL_REGION } from "./credentials.ts";
import { devDependencyMissing, type ManagedProcess, startProcess, waitUntilReady } from "./processes.ts";

export interface SqsEmulator {
  readonly endpoint: string;
  readonly process: ManagedProcess;
}

/**
 * fauxqs exports only its ESM library entry, so its CLI is found along the module search paths. It
 * is a development dependency (an installed agent does not need it), resolved only here.
 */
function fauxqsCli(): string {
  const searchPaths = createRequire(import.meta.url).resolve.paths("fauxqs") ?? [];
  const cli = searchPaths
    .map((dir) => join(dir, "fauxqs", "dist", "cli.js"))
    .find((path) => existsSync(path));
  if (!cli) throw new PrerequisiteError(devDependencyMissing("fauxqs", "the SQS emulator"));
  return cli;
}

/**
 * Starts fauxqs in its own Node process (it needs node:sqlite, Node >= 22.5) so that a busy
 * test worker cannot stall long polls, and waits until ListQueues answers.
 */
export async function startSqsEmulator(port: number, timeoutMs = 20_000): Promise<SqsEmulator> {
  const cli = fauxqsCli();
  const proc = startProcess("fauxqs (SQS emulator)", process.execPath, [cli], {
    env: {
      ...process.env,
      FAUXQS_PORT: String(port),
      FAUXQS_HOST: "localhost",
      FAUXQS_LOGGER: "false",
      FAUXQS_DEFAULT_REGION: LOCAL_REGION,
    },
  });
  const endpoint = `http://127.0.0.1:${port}`;
  const client = new SQSClient({
    endpoint,
    region: LOCAL_REGION,
    credentials: LOCAL_CREDENTIALS,
    maxAttempts: 1,
  });
  try {
    await waitUntilReady(
      proc,
      () => client.send(new ListQueuesCommand({})),
      timeoutMs,
      `port ${port}; is the port taken? fauxqs needs Node >= 22.5`,
    );
  } finally {
    client.destroy();
  }
  return { endpoint, process: proc };
}
