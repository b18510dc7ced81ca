import { execFileSync, spawn, spawnSync } from "node:child_process";
import { createServer } from "node:net";
import { dirname } from "node:path";
import { createInterface } from "node:readline";
import { DynamoDBClient, ListTablesCommand } from "@aws-sdk/client-dynamodb";
import { ListQueuesCommand, SQSClient } from "@aws-sdk/client-sqs";
import { Redis } from "ioredis";
import { describe, expect, it } from "vitest";
import { startDynamoDbLocal } from "../../src/dev/local-stack/dynamodb-local.ts";

const CLI = "src/cli/main.ts";

/** The process environment without any AWS endpoint, so the CLI starts its own emulators. */
function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env = { ...process.env, ...extra };
  for (const key of Object.keys(env)) {
    if (key.startsWith("AWS_ENDPOINT_URL") || key === "SHARDGUARD_TABLE") delete env[key];
  }
  return env;
}

/** Child PIDs of `pid`; `ps` exits 1 when there are none. */
function descendants(pid: number): number[] {
  const listed = spawnSync("ps", ["-o", "pid=", "--ppid", String(pid)], { encoding: "utf8" });
  const out = listed.stdout.trim();
  return out ? out.split(/\s+/).map(Number) : [];
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("shardguard local-stack", () => {
  // The bound catches a start that hangs (each emulator has 30 s to answer); how fast the stack starts is
  // not a functional property: on two busy cores DynamoDB Local alone took 10–12 s (old and new code).
  it("prints its environment line within 40 s, serves the SDK, and leaves no process after SIGTERM", async () => {
    // Prepare
    const started = performance.now();
    const child = spawn(process.execPath, [CLI, "local-stack", "--redis", "2", "--json"], {
      env: cleanEnv(),
      stdio: ["ignore", "pipe", "pipe"],
    });
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const firstLine = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout }).once("line", resolve);
      child.once("exit", (code) => reject(new Error(`exited with ${code} before printing`)));
    });
    const elapsedMs = performance.now() - started;
    const env = JSON.parse(firstLine);
    const credentials = { accessKeyId: env.AWS_ACCESS_KEY_ID, secretAccessKey: env.AWS_SECRET_ACCESS_KEY };
    const dynamo = new DynamoDBClient({
      endpoint: env.AWS_ENDPOINT_URL_DYNAMODB,
      region: env.AWS_REGION,
      credentials,
    });
    const sqs = new SQSClient({ endpoint: env.AWS_ENDPOINT_URL_SQS, region: env.AWS_REGION, credentials });
    const [host, port] = String(env.redis[1]).split(":");
    const replica = new Redis(Number(port), host ?? "127.0.0.1", { lazyConnect: true });
    const startedPids = child.pid ? descendants(child.pid) : [];

    // Act
    const tables = await dynamo.send(new ListTablesCommand({}));
    const queues = await sqs.send(new ListQueuesCommand({}));
    await replica.connect();
    const replication = await replica.info("replication");
    replica.disconnect();
    dynamo.destroy();
    sqs.destroy();
    child.kill("SIGTERM");
    const code = await exited;

    // Assess
    expect(elapsedMs).toBeLessThan(40_000);
    expect(Object.keys(env).sort()).toEqual(
      [
        "AWS_ACCESS_KEY_ID",
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_ENDPOINT_URL_SQS",
        "AWS_REGION",
        "AWS_SECRET_ACCESS_KEY",
        "SHARDGUARD_TABLE",
        "redis",
      ].sort(),
    );
    expect(tables.TableNames).toContain(env.SHARDGUARD_TABLE);
    expect(queues.$metadata.httpStatusCode).toBe(200);
    expect(replication).toContain(`master_port:${String(env.redis[0]).split(":")[1]}`);
    expect(code).toBe(0);
    expect(startedPids.length).toBeGreaterThanOrEqual(4);
    expect(startedPids.filter(alive)).toEqual([]);
  });

  it("stops what it started when SIGTERM arrives during start-up", async () => {
    // Prepare
    const child = spawn(process.execPath, [CLI, "local-stack", "--redis", "1", "--json"], {
      env: cleanEnv(),
      stdio: ["ignore", "pipe", "pipe"],
    });
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const seen = new Set<number>();
    const watch = setInterval(() => {
      if (child.pid) for (const pid of descendants(child.pid)) seen.add(pid);
    }, 50);

    // Act: signal as soon as the first emulator process exists, long before the stack is ready.
    await new Promise<void>((resolve) => {
      const check = setInterval(() => {
        if (seen.size > 0) {
          clearInterval(check);
          resolve();
        }
      }, 20);
    });
    child.kill("SIGTERM");
    const code = await exited;
    clearInterval(watch);

    // Assess
    expect(code).toBe(0);
    expect([...seen].filter(alive)).toEqual([]);
  });

  it("fails within seconds with a one-line hint when java is missing", () => {
    // Prepare: a PATH with node only.
    const env = cleanEnv({ PATH: dirname(process.execPath) });

    // Act
    const run = () =>
      execFileSync(process.execPath, [CLI, "local-stack", "--json"], {
        env,
        encoding: "utf8",
        stdio: "pipe",
        timeout: 20_000,
      });

    // Assess
    expect(run).toThrowError(/java not found or not working: install Java 17\+/);
  });

  it("fails with a one-line hint when redis-server is missing", () => {
    const javaDir = dirname(
      execFileSync("sh", ["-c", "readlink -f $(command -v java)"], { encoding: "utf8" }).trim(),
    );
    const env = cleanEnv({ PATH: `${dirname(process.execPath)}:${javaDir}` });

    const run = () =>
      execFileSync(process.execPath, [CLI, "local-stack", "--redis", "1"], {
        env,
        encoding: "utf8",
        stdio: "pipe",
        timeout: 40_000,
      });

    expect(run).toThrowError(
      /redis-server not found or not working: install it with: apt-get install -y redis-server/,
    );
  });

  it("reports a taken port as an error naming the service instead of hanging", async () => {
    // Prepare: hold a port on all interfaces, as DynamoDB Local would bind it.
    const blocker = createServer();
    await new Promise<void>((resolve) => blocker.listen(0, resolve));
    const address = blocker.address();
    const port = typeof address === "object" && address ? address.port : 0;

    // Act
    const attempt = startDynamoDbLocal(port, 20_000);

    // Assess
    await expect(attempt).rejects.toThrowError(
      /DynamoDB Local (exited before it was ready|did not answer).*port \d+/,
    );
    blocker.close();
  });
});
