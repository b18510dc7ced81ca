import { readFileSync } from "node:fs";
import { Duration } from "aws-cdk-lib";
import { Template } from "aws-cdk-lib/assertions";
import { describe, expect, it } from "vitest";
import { AGENT_TIMING_FIELDS } from "../../cdk/agent-environment.ts";
import { ShardguardStack } from "../../cdk/shardguard-stack.ts";
import { ENV } from "../../src/adapters/env.ts";
import { AGENT_SETTINGS, requireNodeIdAgainstAws, resolveAgentOptions } from "../../src/agent/options.ts";
import { buildProgram } from "../../src/cli/main.ts";
import { FENCED_MIN_REPLICAS, GUARD_MAX_LAG_S } from "../../src/core/write-guard.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

/**
 * What docs/ec2.md and the agent parts of docs/deploy.md and README.md tell an operator to run,
 * checked against the code (issue 37): the commands, the agent's flags, the systemd unit parsed by
 * the agent's own option parser with the stack's AgentEnvironment output, the node id the IAM
 * policy needs, the redis.conf lines.
 */

const read = (file: string) => readFileSync(new URL(`../../${file}`, import.meta.url), "utf8");
const EC2 = read("docs/ec2.md");
const DEPLOY = read("docs/deploy.md");
const README = read("README.md");
const VERSION = (JSON.parse(read("package.json")) as { version: string }).version;
const EXAMPLE_TABLE = "Shardguard-ShardguardTable0123ABCD-XYZ";

/** Fenced blocks of one language, in page order. */
function blocks(text: string, language: string): string[] {
  return [...text.matchAll(new RegExp(`\`\`\`${language}\\n([\\s\\S]*?)\`\`\``, "g"))].map(
    ([, body]) => body as string,
  );
}

/** The commands of every ```sh block: indentation and trailing comments dropped. */
function shCommands(text: string): string[] {
  return blocks(text, "sh")
    .flatMap((block) => block.split("\n"))
    .map((line) => line.replace(/\s+#.*$/, "").trim())
    .filter((line) => line.length > 0);
}

/** A deployed stack's outputs as `cdk deploy --outputs-file` writes them, the table named EXAMPLE_TABLE. */
function stackOutputs(controller: { failureTimeout?: Duration; fenceTimeout?: Duration } = {}) {
  const stack = new ShardguardStack(cdkApp({ bundle: false }), "Shardguard", {
    controller: { controllerEntry: FIXTURE_ENTRY, ...controller },
    nodes: [
      { shard: "orders", node: "n1" },
      { shard: "orders", node: "n2" },
      { shard: "orders", node: "n3" },
    ],
  });
  const outputs = Template.fromStack(stack).toJSON().Outputs as Record<string, { Value: unknown }>;
  const render = (value: unknown): string => {
    if (typeof value === "string") return value;
    const object = value as Record<string, unknown>;
    if ("Fn::Join" in object) {
      const [separator, parts] = object["Fn::Join"] as [string, unknown[]];
      return parts.map(render).join(separator);
    }
    if ("Ref" in object) return EXAMPLE_TABLE;
    // A role's ARN as the deployed stack's output shows it (the controller role: the command sender).
    if ("Fn::GetAtt" in object)
      return `arn:aws:iam::123456789012:role/${(object["Fn::GetAtt"] as string[])[0]}`;
    return JSON.stringify(value);
  };
  return {
    config: stack.controller.config,
    outputs: Object.fromEntries(Object.entries(outputs).map(([key, output]) => [key, render(output.Value)])),
  };
}

/** `KEY=value` lines into an environment. */
function environmentFile(text: string): Record<string, string> {
  return Object.fromEntries(
    text
      .split("\n")
      .filter((line) => line.includes("="))
      .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]),
  );
}

/** Runs commander's own parser of `shardguard <command>` over `args`: the flags the action would get. */
function parseCommand(line: string) {
  const [, name, ...args] = line.split(/\s+/);
  const command = buildProgram().commands.find((candidate) => candidate.name() === name);
  if (!command) throw new Error(`no command shardguard ${name}`);
  const { unknown } = command.parseOptions(args);
  return { flags: command.opts() as Record<string, string | boolean | undefined>, unknown };
}

/** The ExecStart of the page's systemd unit, and its Environment= and EnvironmentFile= lines. */
function unitOf(text: string) {
  const unit = blocks(text, "ini").find((block) => /ExecStart=.*shardguard agent/.test(block)) ?? "";
  const execStart = /^ExecStart=\/usr\/bin\/env (shardguard agent.*)$/m.exec(unit)?.[1] ?? "";
  const environment = Object.fromEntries(
    [...unit.matchAll(/^Environment=(.*)$/gm)].flatMap(([, pairs]) =>
      (pairs as string).split(/\s+/).map((pair) => pair.split("=") as [string, string]),
    ),
  );
  const environmentFiles = [...unit.matchAll(/^EnvironmentFile=(.*)$/gm)].map(([, file]) => file as string);
  return { unit, execStart, environment, environmentFiles };
}

/** How each command of docs/ec2.md is checked; a new or changed command must be added here. */
function coverage(command: string, outputs: Record<string, string>): string | undefined {
  if (command === "npm pack" || command === `sudo npm install -g ./shardguard-${VERSION}.tgz`)
    return "packed and installed by test/integration/package-install.test.ts";
  if (command === "shardguard agent --help") return "run on the installed package by package-install.test.ts";
  if (command === "sudo mkdir -p /etc/shardguard") return "needs a host";
  if (command.startsWith("sudo systemctl ") || command.startsWith("journalctl -u shardguard-agent"))
    return "systemd on the node";
  if (command.startsWith("redis-cli ")) return "the database on the node";
  const jq = [...command.matchAll(/jq -r '\.Shardguard\.(\w+)' cdk-outputs\.json/g)].map(([, key]) => key);
  if (jq.length > 0 && jq.every((key) => outputs[key as string] !== undefined)) {
    if (command.startsWith("aws iam attach-role-policy ")) return "IAM in an account";
    if (command.endsWith("| sudo tee /etc/shardguard/agent.env")) return "the output, written on the node";
  }
  if (command.startsWith("shardguard ")) {
    const { unknown } = parseCommand(command);
    return unknown.length === 0 ? "parsed by the CLI's own commander program" : undefined;
  }
  return undefined;
}

describe("docs/ec2.md", () => {
  const { outputs, config } = stackOutputs();

  it("has no command this test does not cover, and each parses or reads a real output", () => {
    // Act
    const commands = shCommands(EC2);
    const uncovered = commands.filter((command) => coverage(command, outputs) === undefined);

    // Assess
    expect(commands.length).toBeGreaterThanOrEqual(8);
    expect(uncovered).toEqual([]);
  });

  it("names only agent flags the agent has", () => {
    // Prepare: every `--flag` the page shows in an agent context.
    const known = new Set<string>([
      ...AGENT_SETTINGS.flatMap((setting) => ("flag" in setting ? [setting.flag] : [])),
      "--config",
      "--help",
    ]);
    const agentLines = EC2.split("\n").filter((line) =>
      /shardguard agent|--sentinel-port|--node-id/.test(line),
    );

    // Act
    const flags = agentLines.flatMap((line) => [...line.matchAll(/(--[a-z][a-z-]*)/g)].map(([flag]) => flag));

    // Assess
    expect(flags).toEqual(expect.arrayContaining(["--node-id", "--redis", "--address", "--sentinel-port"]));
    expect(flags.filter((flag) => !known.has(flag as string))).toEqual([]);
  });

  it("starts the agent of its unit with the stack's AgentEnvironment: the controller's timings, the node id", () => {
    // Prepare
    const { execStart, environment, environmentFiles } = unitOf(EC2);
    const agentEnv = environmentFile(outputs.AgentEnvironment ?? "");
    const env = { ...agentEnv, ...environment };
    const { flags, unknown } = parseCommand(execStart);

    // Act
    const resolved = resolveAgentOptions({ flags, env });

    // Assess
    expect(environmentFiles).toEqual(["/etc/shardguard/agent.env"]);
    expect(unknown).toEqual([]);
    expect(resolved.table).toBe(EXAMPLE_TABLE);
    expect(resolved.queuePrefix).toBe(outputs.QueuePrefix);
    for (const field of AGENT_TIMING_FIELDS) expect(resolved.agent[field], field).toBe(config[field]);
    expect(resolved.agent).toMatchObject({ shard: "orders", nodeId: "n1", address: "10.0.1.11:6379" });
    expect(() => requireNodeIdAgainstAws(resolved.agent, env)).not.toThrow();
    // The node id is a `nodes` entry, so its policy exists.
    expect(Object.keys(outputs)).toContain(`AgentPolicyArn${resolved.agent.shard}${resolved.agent.nodeId}`);
  });

  it("needs the unit's --node-id: without it the agent refuses to start against AWS, not on the local stack", () => {
    // Prepare
    const { execStart, environment } = unitOf(EC2);
    const env = { ...environmentFile(outputs.AgentEnvironment ?? ""), ...environment };
    const withoutId = parseCommand(execStart.replace(/ --node-id \S+/, "")).flags;

    // Act
    const resolved = resolveAgentOptions({ flags: withoutId, env });
    const local = {
      ...env,
      AWS_ENDPOINT_URL_DYNAMODB: "http://127.0.0.1:8000",
      AWS_ENDPOINT_URL_SQS: "http://127.0.0.1:9324",
    };

    // Assess
    expect(resolved.agent.nodeId).toBeUndefined();
    expect(() => requireNodeIdAgainstAws(resolved.agent, env)).toThrowError(
      /--node-id \(SHARDGUARD_NODE_ID\) is required against AWS.*orders:<node-id>/,
    );
    expect(() => requireNodeIdAgainstAws(resolved.agent, local)).not.toThrow();
  });

  it("puts the fenced start, repl-timeout and replica-announce-ip in redis.conf, and no replicaof", () => {
    // Prepare
    const conf = blocks(EC2, "conf").find((block) => block.includes("min-replicas-to-write")) ?? "";
    const directives = conf
      .split("\n")
      .filter((line) => line.trim() && !line.trim().startsWith("#"))
      .map((line) => line.trim().split(/\s+/) as [string, ...string[]]);
    const value = (name: string) => directives.find(([directive]) => directive === name)?.[1];
    const { execStart } = unitOf(EC2);

    // Assess
    expect(value("min-replicas-to-write")).toBe(String(FENCED_MIN_REPLICAS));
    expect(value("min-replicas-max-lag")).toBe(String(GUARD_MAX_LAG_S));
    expect(Number(value("repl-timeout"))).toBeGreaterThan(Number(value("repl-ping-replica-period")));
    // The replica announces the host its agent advertises.
    expect(execStart).toContain(`--address ${value("replica-announce-ip")}:6379`);
    expect(directives.filter(([directive]) => /^(replicaof|slaveof)$/i.test(directive))).toEqual([]);
  });

  it("is linked from the README", () => {
    expect(README).toContain("(docs/ec2.md)");
  });
});

describe("agent timings (docs/deploy.md)", () => {
  it("hands the controller's timings to the agent: its construct example's, through AgentEnvironment", () => {
    // Prepare: the props of the page's construct example.
    const example =
      /```ts\nimport \{ agentTimingEnvironment, ShardguardController \}[\s\S]*?```/.exec(DEPLOY)?.[0] ?? "";
    const seconds = (prop: string) =>
      Number(new RegExp(`${prop}: Duration\\.seconds\\((\\d+)\\)`).exec(example)?.[1]);
    const { outputs, config } = stackOutputs({
      failureTimeout: Duration.seconds(seconds("failureTimeout")),
      fenceTimeout: Duration.seconds(seconds("fenceTimeout")),
    });
    const { execStart } = unitOf(EC2);

    // Act
    const resolved = resolveAgentOptions({
      flags: parseCommand(execStart).flags,
      env: environmentFile(outputs.AgentEnvironment ?? ""),
    });

    // Assess
    expect(config).toMatchObject({ failureTimeoutMs: 5000, fenceTimeoutMs: 3000 });
    for (const field of AGENT_TIMING_FIELDS) expect(resolved.agent[field], field).toBe(config[field]);
  });

  it("refuses a partial copy with the message the page quotes", () => {
    // Prepare
    const section = DEPLOY.slice(DEPLOY.indexOf("#### Agent timings"));
    const quoted = blocks(section, "text")[0]?.trim();
    const { execStart } = unitOf(EC2);

    // Act
    const act = () =>
      resolveAgentOptions({ flags: parseCommand(execStart).flags, env: { [ENV.fenceTimeoutMs]: "3000" } });

    // Assess
    expect(quoted).toMatch(/^invalid agent options: /);
    expect(act).toThrowError(quoted);
  });

  it("shows AgentEnvironment as the default stack outputs it", () => {
    // Prepare
    const section = DEPLOY.slice(DEPLOY.indexOf("#### Agent timings"));
    const shown = /```\n([\s\S]*?)```/.exec(section)?.[1] ?? "";

    // Assess
    expect(environmentFile(shown)).toEqual(environmentFile(stackOutputs().outputs.AgentEnvironment ?? ""));
  });
});

describe("agent command lines of README.md, docs/deploy.md and docs/ec2.md", () => {
  it("give every agent its node id", () => {
    // Act: command lines, the ECS command array and the units' environment.
    const lines = [README, DEPLOY, EC2].flatMap((text) =>
      text
        .split("\n")
        .filter((line) => /shardguard agent --|"shardguard", "agent"/.test(line) && !line.includes("--help")),
    );
    const units = [README, DEPLOY, EC2].flatMap((text) =>
      blocks(text, "ini").filter((block) => /ExecStart=.*shardguard agent/.test(block)),
    );

    // Assess
    expect(lines.length).toBeGreaterThanOrEqual(4);
    expect(lines.filter((line) => !/--node-id|"--node-id"/.test(line))).toEqual([]);
    expect(units.filter((unit) => !/--node-id \S+|SHARDGUARD_NODE_ID=\S+/.test(unit))).toEqual([]);
  });
});
