import { execFile } from "node:child_process";
import { appendFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { SqsCommandBus } from "../../src/adapters/sqs-command-bus.ts";
import { ensureTable } from "../../src/dev/local-stack/table.ts";
import { awsEnv, uniqueName } from "../support/aws.ts";

/**
 * Every command of docs/deploy.md's `sh` blocks, run where it can run (issue 17, item 10):
 * `cdk deploy` as `cdk synth` with the same context, the `jq` paths against that synth's outputs,
 * the operator commands with the profile the stack outputs against the local stack (STS and the
 * operator function stood in for by an HTTP server on 127.0.0.1), `shardguard decommission`
 * against the SQS emulator. A command the table below does not cover fails the test, so the page
 * cannot gain an untested command.
 */

const PACKAGE_ROOT = path.resolve(import.meta.dirname, "..", "..");
const BIN = path.join(PACKAGE_ROOT, "node_modules", ".bin");
const CLI = path.join(PACKAGE_ROOT, "src", "cli", "main.ts");
const DOC = readFileSync(path.join(PACKAGE_ROOT, "docs", "deploy.md"), "utf8");
const run = promisify(execFile);
/** The region of the page's examples, the deployer's and so the operator profile's. */
const OPERATOR_REGION = "eu-west-1";

/** The commands of every ```sh block: continuation lines joined, trailing comments dropped. */
function docCommands(): string[] {
  const commands: string[] = [];
  for (const [, block] of DOC.matchAll(/```sh\n([\s\S]*?)```/g)) {
    const joined = (block ?? "").replace(/\\\n\s*/g, "");
    for (const line of joined.split("\n")) {
      const command = line.replace(/\s+#.*$/, "").trim();
      if (command) commands.push(command);
    }
  }
  return commands;
}

type Coverage =
  | { readonly kind: "synth" }
  | { readonly kind: "operator" }
  | { readonly kind: "decommission" }
  | { readonly kind: "elsewhere"; readonly test: string }
  | { readonly kind: "needs an account or a host"; readonly why: string; readonly jq?: boolean };

/** How each command is covered. A new or changed command in the page must be added here. */
function coverage(command: string): Coverage | undefined {
  if (command === 'export PATH="$PWD/node_modules/.bin:$PATH"') return { kind: "synth" };
  if (command.startsWith("npx cdk deploy ")) return { kind: "synth" };
  if (command.startsWith("npx cdk bootstrap aws://123456789012/eu-west-1"))
    return {
      kind: "needs an account or a host",
      why: "bootstrap creates the CDK toolkit stack in an account",
    };
  if (command.startsWith("shardguard decommission ")) return { kind: "decommission" };
  if (command.startsWith("shardguard migrate-layout"))
    return { kind: "elsewhere", test: "test/integration/agent-credentials.test.ts" };
  if (command === "npm pack" || command === "sudo npm install -g ./shardguard-0.1.0.tgz")
    return { kind: "elsewhere", test: "test/integration/package-install.test.ts" };
  if (command.startsWith("aws iam attach-role-policy "))
    return { kind: "needs an account or a host", why: "IAM in an account", jq: true };
  if (command.startsWith("sudo systemctl ") || command.startsWith("journalctl "))
    return { kind: "needs an account or a host", why: "systemd on the node" };
  if (command.startsWith("jq ") || command.startsWith("export ") || command.startsWith("shardguard "))
    return { kind: "operator" };
  return undefined;
}

const workDir = mkdtempSync(path.join(tmpdir(), "shardguard-doc-"));
let template: { Outputs: Record<string, { Value: unknown }>; Resources: Record<string, unknown> };
let stand: { server: Server; url: string; invoked: unknown[]; assumed: string[] };
const table = uniqueName("doc").slice(0, 40);

/** A stand-in for STS (AssumeRole) and Lambda (Invoke) on 127.0.0.1. */
async function standIn() {
  const invoked: unknown[] = [];
  const assumed: string[] = [];
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (chunk) => {
      body += chunk;
    });
    req.on("end", () => {
      if (req.url?.startsWith("/2015-03-31/functions/")) {
        const request = JSON.parse(body) as { action: string; shard: string; to?: string };
        invoked.push(request);
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            ok: true,
            action: request.action,
            shard: request.shard,
            outcome: "completed",
            epoch: 2,
            primary: request.to,
            reason: `switchover to ${request.to}`,
          }),
        );
        return;
      }
      const form = new URLSearchParams(body);
      assumed.push(form.get("RoleArn") ?? "");
      res.writeHead(200, { "content-type": "text/xml" });
      res.end(
        `<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials>` +
          "<AccessKeyId>ASIAOPERATOR</AccessKeyId><SecretAccessKey>secret</SecretAccessKey><SessionToken>token</SessionToken>" +
          "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials><AssumedRoleUser>" +
          "<Arn>arn:aws:sts::123456789012:assumed-role/operator/cli</Arn><AssumedRoleId>AROAOPERATOR:cli</AssumedRoleId>" +
          "</AssumedRoleUser></AssumeRoleResult><ResponseMetadata><RequestId>1</RequestId></ResponseMetadata></AssumeRoleResponse>",
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, invoked, assumed };
}

/** What `cdk deploy --outputs-file` would write for the synthesized outputs, with made-up physical ids. */
function outputsFile(): Record<string, Record<string, string>> {
  const resolve = (value: unknown): string => {
    if (typeof value === "string") return value;
    const object = value as Record<string, unknown>;
    if ("Fn::Join" in object) {
      const [separator, parts] = object["Fn::Join"] as [string, unknown[]];
      return parts.map(resolve).join(separator);
    }
    if ("Ref" in object) {
      const ref = object.Ref as string;
      if (ref === "AWS::Region") return "eu-west-1";
      if (ref === "AWS::AccountId") return "123456789012";
      if (ref === "AWS::Partition") return "aws";
      const type = (template.Resources[ref] as { Type: string }).Type;
      return type === "AWS::DynamoDB::Table" ? table : `${ref}-physical`;
    }
    if ("Fn::GetAtt" in object) {
      const [ref] = object["Fn::GetAtt"] as [string];
      return `arn:aws:iam::123456789012:role/Shardguard-${ref}`;
    }
    throw new Error(`unresolvable output value ${JSON.stringify(value)}`);
  };
  return {
    Shardguard: Object.fromEntries(
      Object.entries(template.Outputs).map(([key, output]) => [key, resolve(output.Value)]),
    ),
  };
}

/** `jq -r '.A.B' cdk-outputs.json` as jq would answer it. */
function jqPath(expression: string, outputs: Record<string, Record<string, string>>): string {
  const match = /^jq -r '\.(\w+)\.(\w+)' cdk-outputs\.json/.exec(expression);
  const value = match ? outputs[match[1] as string]?.[match[2] as string] : undefined;
  if (value === undefined) throw new Error(`no output for ${expression}`);
  return value;
}

beforeAll(async () => {
  // Prepare: the stack as `npx cdk deploy` in the page would deploy it, synthesized offline.
  const deploy = docCommands().find((command) => command.startsWith("npx cdk deploy "));
  const context = [...(deploy ?? "").matchAll(/-c (\S+)/g)].flatMap(([, value]) => ["-c", value as string]);
  const outdir = path.join(workDir, "cdk.out");
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith("AWS_") && !key.startsWith("CDK_")) env[key] = value;
  }
  await run(path.join(BIN, "cdk"), ["synth", "--quiet", "--no-notices", "--output", outdir, ...context], {
    cwd: PACKAGE_ROOT,
    env: {
      ...env,
      PATH: `${BIN}${path.delimiter}${process.env.PATH ?? ""}`,
      AWS_EC2_METADATA_DISABLED: "true",
      // The deployer's region (their profile's): the stack's outputs carry it.
      AWS_REGION: OPERATOR_REGION,
      CDK_DISABLE_VERSION_CHECK: "1",
      CDK_DISABLE_CLI_TELEMETRY: "true",
      CDK_HOME: path.join(workDir, "cdk-home"),
    },
    timeout: 120_000,
  });
  template = JSON.parse(readFileSync(path.join(outdir, "Shardguard.template.json"), "utf8"));
  stand = await standIn();
  // In the region of the profile the stack outputs: LocalStack keeps tables per region.
  const local = awsEnv();
  const client = new DynamoDBClient({
    region: OPERATOR_REGION,
    endpoint: local.AWS_ENDPOINT_URL_DYNAMODB ?? local.AWS_ENDPOINT_URL,
    credentials: {
      accessKeyId: local.AWS_ACCESS_KEY_ID ?? "",
      secretAccessKey: local.AWS_SECRET_ACCESS_KEY ?? "",
    },
  });
  await ensureTable(client, table);
  client.destroy();
  const aws = createAwsAdapters({
    env: { ...awsEnv(), AWS_REGION: OPERATOR_REGION, SHARDGUARD_TABLE: table },
  });
  await aws.store.topology.compareAndSet("orders", undefined, {
    shard: "orders",
    epoch: 1,
    primary_node_id: "n1",
    primary_address: "10.0.1.11:6379",
    status: "online",
    updated_at: aws.clock.now(),
  });
  await aws.store.shards.register("orders");
  aws.destroy();
}, 180_000);

afterAll(async () => {
  await new Promise((resolve) => stand?.server.close(resolve));
  rmSync(workDir, { recursive: true, force: true });
});

/** The operator's machine: no AWS variables but the endpoints of the local stack and the stand-in. */
function operatorEnv(configFile: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith("AWS_") && !key.startsWith("SHARDGUARD_")) env[key] = value;
  }
  const local = awsEnv();
  return {
    ...env,
    AWS_CONFIG_FILE: configFile,
    AWS_SHARED_CREDENTIALS_FILE: path.join(workDir, "no-credentials"),
    AWS_EC2_METADATA_DISABLED: "true",
    AWS_ENDPOINT_URL_DYNAMODB: local.AWS_ENDPOINT_URL_DYNAMODB ?? local.AWS_ENDPOINT_URL,
    AWS_ENDPOINT_URL_SQS: local.AWS_ENDPOINT_URL_SQS ?? local.AWS_ENDPOINT_URL,
    AWS_ENDPOINT_URL_STS: stand.url,
    AWS_ENDPOINT_URL_LAMBDA: stand.url,
  };
}

/** Runs the page's operator lines in order, the way a shell would, against the stand-ins. */
async function runOperatorLines(lines: readonly string[], configFile: string) {
  const outputs = outputsFile();
  const env = operatorEnv(configFile);
  const results: { command: string; code: number; stdout: string; stderr: string }[] = [];
  for (const line of lines) {
    if (line.startsWith("jq ")) {
      const target = /'\s+cdk-outputs\.json >> ~\/\.aws\/config$/.test(line);
      if (!target) throw new Error(`unexpected jq line: ${line}`);
      appendFileSync(configFile, `${jqPath(line, outputs)}\n`);
    } else if (line.startsWith("export ")) {
      for (const [, name, raw] of line.slice("export ".length).matchAll(/(\w+)=("\$\(.*?\)"|\S+)/g)) {
        const value = raw?.startsWith('"$(') ? jqPath(raw.slice(3, -2), outputs) : (raw as string);
        env[name as string] = value;
      }
    } else {
      const args = line.split(/\s+/).slice(1);
      try {
        const { stdout, stderr } = await run(process.execPath, [CLI, ...args], { env, timeout: 60_000 });
        results.push({ command: line, code: 0, stdout, stderr });
      } catch (error) {
        const failed = error as { code?: number; stdout?: string; stderr?: string };
        results.push({
          command: line,
          code: failed.code ?? 1,
          stdout: failed.stdout ?? "",
          stderr: failed.stderr ?? "",
        });
      }
    }
  }
  return results;
}

describe("docs/deploy.md", () => {
  it("has no command that this test does not cover", () => {
    // Act
    const uncovered = docCommands().filter((command) => coverage(command) === undefined);

    // Assess
    expect(docCommands().length).toBeGreaterThan(10);
    expect(uncovered).toEqual([]);
  });

  it("deploys what `cdk synth` with the page's context synthesizes, with every output the page reads with jq", () => {
    // Act
    const paths = docCommands()
      .flatMap((command) => [...command.matchAll(/jq -r '\.Shardguard\.(\w+)'/g)])
      .map(([, output]) => output);

    // Assess
    expect(paths.length).toBeGreaterThanOrEqual(4);
    for (const output of paths) expect(Object.keys(template.Outputs)).toContain(output);
    expect(Object.keys(template.Outputs)).toEqual(
      expect.arrayContaining(["AgentPolicyArnordersn1", "AgentPolicyArnordersn2", "AgentPolicyArnordersn3"]),
    );
    // The region of the page's examples is the README's.
    const readme = readFileSync(path.join(PACKAGE_ROOT, "README.md"), "utf8");
    const regions = new Set(
      [...`${DOC}\n${readme}`.matchAll(/\b(?:eu|us|ap)-(?:west|east|north|south|central)-\d\b/g)].map(
        (m) => m[0],
      ),
    );
    expect([...regions]).toEqual(["eu-west-1"]);
  });

  it("runs the Operators section: profile with the stack's region, status, and a switchover through the operator function", async () => {
    // Prepare
    const configFile = path.join(workDir, "operator-config");
    writeFileSync(
      configFile,
      "[default]\naws_access_key_id = AKIAOPERATOR\naws_secret_access_key = secret\n",
    );
    const lines = docCommands().filter((command) => coverage(command)?.kind === "operator");

    // Act
    const results = await runOperatorLines(lines, configFile);

    // Assess
    expect(results.map((result) => [result.command, result.code, result.stderr])).toEqual([
      ["shardguard status", 0, ""],
      ["shardguard switchover --shard orders --to n2 --wait", 0, ""],
    ]);
    expect(results[0]?.stdout).toContain("orders");
    expect(results[1]?.stdout).toBe("switchover of shard orders: switchover to n2 (epoch 2; primary n2)\n");
    expect(stand.invoked).toEqual([{ action: "switchover", shard: "orders", to: "n2" }]);
    // The CLI assumed the operator role named by the OperatorRoleArn output.
    expect(new Set(stand.assumed)).toEqual(new Set([outputsFile().Shardguard?.OperatorRoleArn]));
  }, 90_000);

  it("needs the profile's region: the same commands without it fail with Region is missing", async () => {
    // Prepare: the profile as it was before the stack output it, without `region`.
    const configFile = path.join(workDir, "operator-config-no-region");
    writeFileSync(
      configFile,
      "[default]\naws_access_key_id = AKIAOPERATOR\naws_secret_access_key = secret\n",
    );
    const lines = docCommands()
      .filter((command) => coverage(command)?.kind === "operator")
      .filter((command) => command === "shardguard status" || !command.startsWith("shardguard "));
    const outputs = outputsFile();
    const profile = outputs.Shardguard?.OperatorProfile ?? "";
    expect(profile).toMatch(/^region = eu-west-1$/m);

    // Act
    appendFileSync(configFile, `${profile.replace(/^region = .*\n/m, "")}\n`);
    const results = await runOperatorLines(
      lines.filter((line) => !line.startsWith("jq ")),
      configFile,
    );

    // Assess
    expect(results).toHaveLength(1);
    expect(results[0]?.code).toBe(1);
    expect(results[0]?.stderr).toMatch(/[Rr]egion is missing/);
  }, 60_000);

  it("runs the decommission commands against the SQS emulator", async () => {
    // Prepare
    const prefix = `doc${Math.random().toString(36).slice(2, 8)}`;
    const aws = createAwsAdapters({ env: awsEnv() });
    const bus = new SqsCommandBus({ sqs: aws.clients.sqs, queuePrefix: prefix, logger: silentLogger });
    await bus.ensureQueue("orders", "n3");
    await bus.ensureQueue("orders", "n4");
    aws.destroy();
    const lines = docCommands().filter((command) => coverage(command)?.kind === "decommission");

    // Act
    const outputs: string[] = [];
    for (const line of lines) {
      const { stdout } = await run(process.execPath, [CLI, ...line.split(/\s+/).slice(1)], {
        env: { ...process.env, ...awsEnv(), SHARDGUARD_QUEUE_PREFIX: prefix },
      });
      outputs.push(stdout);
    }

    // Assess
    expect(lines).toEqual([
      "shardguard decommission --shard orders --node n3",
      "shardguard decommission --all-queues",
    ]);
    expect(outputs).toEqual([
      `deleted ${prefix}_orders_n3\n`,
      `deleted ${prefix}_dlq\ndeleted ${prefix}_orders_n4\n`,
    ]);
  }, 60_000);

  it("installs the tarball npm pack names", () => {
    const version = (
      JSON.parse(readFileSync(path.join(PACKAGE_ROOT, "package.json"), "utf8")) as { version: string }
    ).version;

    expect(docCommands()).toContain(`sudo npm install -g ./shardguard-${version}.tgz`);
  });
});
