import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, describe, expect, it } from "vitest";

const PACKAGE_ROOT = path.resolve(import.meta.dirname, "..", "..");
const CDK = path.join(PACKAGE_ROOT, "node_modules", ".bin", "cdk");

const workDir = mkdtempSync(path.join(tmpdir(), "shardguard-cdk-"));
afterAll(() => rmSync(workDir, { recursive: true, force: true }));

/** The environment of an offline machine without AWS credentials: no IMDS, no notices, no telemetry. */
function offlineEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (!key.startsWith("AWS_") && !key.startsWith("CDK_")) env[key] = value;
  }
  return {
    ...env,
    PATH: `${path.join(PACKAGE_ROOT, "node_modules", ".bin")}${path.delimiter}${process.env.PATH ?? ""}`,
    AWS_EC2_METADATA_DISABLED: "true",
    CDK_DISABLE_VERSION_CHECK: "1",
    CDK_DISABLE_CLI_TELEMETRY: "true",
    CDK_HOME: path.join(workDir, "cdk-home"),
  };
}

interface Template {
  readonly Resources: Record<string, { Type: string; Properties: Record<string, unknown> }>;
  readonly Outputs: Record<string, unknown>;
}

/** `cdk synth` of the app with `context` (key=value) into its own directory; its output and template. */
async function synth(name: string, context: readonly string[]) {
  const outdir = path.join(workDir, name);
  const { stdout, stderr } = await promisify(execFile)(
    CDK,
    [
      "synth",
      "--quiet",
      "--no-notices",
      "--output",
      outdir,
      ...["controllerEntry=test/fixtures/controller-handler.ts", ...context].flatMap((pair) => [
        "--context",
        pair,
      ]),
    ],
    { cwd: PACKAGE_ROOT, env: offlineEnv(), timeout: 90_000 },
  );
  const template = JSON.parse(
    readFileSync(path.join(outdir, "Shardguard.template.json"), "utf8"),
  ) as Template;
  return { output: `${stdout}${stderr}`, template, resources: Object.values(template.Resources) };
}

describe("cdk synth from the project root", () => {
  it("synthesizes the app through cdk.json offline, with the AwsSolutions checks passing", async () => {
    // Act
    const { output, template, resources } = await synth("cdk.out", ["nodes=orders:n1"]);

    // Assess: a nag finding would have failed the command (and the promise) before this point.
    // The scheduled controller and the operator function: the same code, separate concurrency.
    const lambda = expect.objectContaining({
      Properties: expect.objectContaining({ Runtime: "nodejs24.x", Architectures: ["arm64"] }),
    });
    expect(resources.filter((resource) => resource.Type === "AWS::Lambda::Function")).toEqual([
      lambda,
      lambda,
    ]);
    expect(Object.keys(template.Outputs)).toEqual(
      expect.arrayContaining([
        "TableName",
        "QueuePrefix",
        "ControllerFunctionName",
        "OperatorFunctionName",
        "OperatorRoleArn",
        "OperatorProfile",
        "AgentPolicyArnordersn1",
      ]),
    );
    expect(output).not.toMatch(/AwsSolutions-/);
  }, 120_000);

  it("takes the billing mode, the fleet's size and the dashboard from context", async () => {
    // Act
    const { template, resources } = await synth("cdk.out.provisioned", [
      "billingMode=provisioned",
      "shards=100",
      "dashboard=false",
    ]);

    // Assess: sized as cdk/table-capacity.ts sizes 100 shards of 3 nodes (docs/cost.md).
    const table = resources.find((resource) => resource.Type === "AWS::DynamoDB::Table");
    // (CloudFormation's default billing mode is provisioned: the CDK leaves BillingMode out.)
    expect(table?.Properties).toMatchObject({
      ProvisionedThroughput: { ReadCapacityUnits: 103, WriteCapacityUnits: 86 },
    });
    expect(resources.filter((resource) => resource.Type === "AWS::CloudWatch::Dashboard")).toEqual([]);
    expect(
      resources.filter((resource) => resource.Type === "AWS::CloudWatch::Alarm").length,
    ).toBeGreaterThanOrEqual(9);
    expect(Object.keys(template.Outputs)).not.toContain("DashboardName");
  }, 120_000);
});
