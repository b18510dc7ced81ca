import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { runSimulation, type Simulation } from "@cloud-copilot/iam-simulate";
import { Template } from "aws-cdk-lib/assertions";
import type { AgentIdentity } from "../../cdk/agent-policy.ts";
import { MAX_STACK_NODES, ShardguardStack } from "../../cdk/shardguard-stack.ts";
import {
  type AwsCallRecord,
  type AwsPrincipal,
  GENERATED_NODE_ID,
} from "../../src/adapters/aws-call-journal.ts";
import { cdkApp, FIXTURE_ENTRY } from "../fixtures/cdk-app.ts";

/**
 * Checks recorded AWS calls (src/adapters/aws-call-journal.ts) against the IAM policies the CDK app
 * synthesizes, with an IAM policy simulator (@cloud-copilot/iam-simulate: actions, resources,
 * `dynamodb:LeadingKeys` conditions as AWS evaluates them). DynamoDB Local and the SQS emulator do not
 * evaluate IAM; this is what stands in for a real account.
 *
 * Names: tests use their own table names and queue prefixes; each call is mapped onto the
 * synthesized stack's table and prefix (a queue keeps the part after its prefix), so resource
 * scoping (own queue only, own shard partition only) is still what is checked.
 */

const ACCOUNT = "123456789012";
const REGION = "eu-west-1";
const TABLE = "shardguard-iam";
const PREFIX = "sgiam";

type PolicyDocument = { Version?: string; Statement: Record<string, unknown>[] };

export interface Denial {
  readonly call: AwsCallRecord;
  /** The action IAM checks (a transaction's item action for a transaction). */
  readonly action: string;
  readonly resource: string;
  readonly leadingKey?: string;
  readonly result: string;
}

export interface PermissionReport {
  readonly calls: number;
  /** Distinct (principal kind, action) pairs seen, e.g. `agent dynamodb:GetItem`. */
  readonly actionsSeen: readonly string[];
  readonly denials: readonly Denial[];
  /**
   * Calls of agents started without `--node-id` (a generated id, for local use): no policy can name
   * them, so they are counted, not checked; a deployment must give each node its id (docs/deploy.md).
   */
  readonly generatedIdCalls: number;
}

/** Every record of every `calls-*.jsonl` file under `directory`. */
export function readJournal(directory: string): AwsCallRecord[] {
  if (!existsSync(directory)) return [];
  return readdirSync(directory)
    .filter((file) => file.endsWith(".jsonl"))
    .flatMap((file) =>
      readFileSync(path.join(directory, file), "utf8")
        .split("\n")
        .filter((line) => line.trim().length > 0)
        .map((line) => JSON.parse(line) as AwsCallRecord),
    );
}

/** Policies of the stack `cdk deploy` would create, with one node policy per agent identity seen. */
export class SynthesizedPolicies {
  readonly #resources: Record<string, { Type: string; Properties?: Record<string, unknown> }>;
  readonly #controller: PolicyDocument[];
  readonly #operator: PolicyDocument[];
  readonly #agents = new Map<string, PolicyDocument[]>();

  constructor(nodes: readonly AgentIdentity[]) {
    // One stack holds at most MAX_STACK_NODES nodes (CloudFormation's 200 outputs): the suite's
    // agents are synthesized in as many stacks as they need; the shared resources' logical ids are
    // the same in each (the same construct paths), the node policies' differ.
    const chunks: AgentIdentity[][] = [];
    for (let from = 0; from < nodes.length || chunks.length === 0; from += MAX_STACK_NODES)
      chunks.push(nodes.slice(from, from + MAX_STACK_NODES));
    const stacks = chunks.map(
      (chunk, index) =>
        new ShardguardStack(cdkApp({ bundle: false }), `ShardguardIam${index}`, {
          env: { account: ACCOUNT, region: REGION },
          controller: { controllerEntry: FIXTURE_ENTRY, tableName: TABLE, queuePrefix: PREFIX },
          nodes: chunk,
        }),
    );
    this.#resources = Object.assign(
      {},
      ...stacks.map(
        (stack) =>
          (
            Template.fromStack(stack).toJSON() as {
              Resources: Record<string, { Type: string; Properties?: Record<string, unknown> }>;
            }
          ).Resources,
      ),
    );
    const stack = stacks[0] as ShardguardStack;
    const logicalId = (construct: { node: { defaultChild?: unknown } }) =>
      stack.getLogicalId(construct.node.defaultChild as never);
    this.#controller = this.#rolePolicies(logicalId(stack.controller.controllerRole));
    this.#operator = this.#rolePolicies(logicalId(stack.operatorRole));
    for (const [id, resource] of Object.entries(this.#resources)) {
      if (resource.Type !== "AWS::IAM::ManagedPolicy") continue;
      const description = String(resource.Properties?.Description ?? "");
      const match = description.match(/agent of node (\S+) in shard (\S+)$/);
      if (!match) continue;
      this.#agents.set(`${match[2]}/${match[1]}`, [this.#document(id)]);
    }
  }

  policiesOf(principal: AwsPrincipal): PolicyDocument[] {
    if (principal.component === "controller") return this.#controller;
    if (principal.component === "operator") return this.#operator;
    return this.#agents.get(`${principal.shard}/${principal.node}`) ?? [];
  }

  /** The ARN IAM evaluates for `call` in the synthesized stack. */
  resourceArn(call: AwsCallRecord): string {
    const service = call.action.split(":")[0];
    if (service === "dynamodb")
      return `arn:aws:dynamodb:${REGION}:${ACCOUNT}:table/${TABLE}${call.index ? `/index/${call.index}` : ""}`;
    if (service === "sqs") {
      const queue = call.queue ?? "";
      const prefix = call.queuePrefix ?? "";
      const mapped = prefix && queue.startsWith(prefix) ? `${PREFIX}${queue.slice(prefix.length)}` : queue;
      return `arn:aws:sqs:${REGION}:${ACCOUNT}:${mapped}`;
    }
    if (service === "events") {
      // The construct's default is the account's default bus (imported, not a resource of the stack).
      const bus = Object.values(this.#resources).some(
        (resource) => resource.Type === "AWS::Events::EventBus",
      );
      return bus
        ? this.#arnOfType("AWS::Events::EventBus")
        : `arn:aws:events:${REGION}:${ACCOUNT}:event-bus/default`;
    }
    if (service === "lambda") return this.#operatorFunctionArn();
    throw new Error(`no resource mapping for ${call.action}`);
  }

  #rolePolicies(roleLogicalId: string): PolicyDocument[] {
    return Object.entries(this.#resources)
      .filter(
        ([, resource]) =>
          resource.Type === "AWS::IAM::Policy" &&
          JSON.stringify(resource.Properties?.Roles ?? []).includes(`"${roleLogicalId}"`),
      )
      .map(([id]) => this.#document(id));
  }

  #document(policyLogicalId: string): PolicyDocument {
    const resource = this.#resources[policyLogicalId];
    return this.#resolve(resource?.Properties?.PolicyDocument) as PolicyDocument;
  }

  #arnOfType(type: string): string {
    const entry = Object.entries(this.#resources).find(([, resource]) => resource.Type === type);
    if (!entry) throw new Error(`no ${type} in the synthesized stack`);
    return this.#resolve({ "Fn::GetAtt": [entry[0], "Arn"] }) as string;
  }

  #operatorFunctionArn(): string {
    const entry = Object.entries(this.#resources).find(
      ([id, resource]) => resource.Type === "AWS::Lambda::Function" && id.includes("Operator"),
    );
    if (!entry) throw new Error("no operator function in the synthesized stack");
    return this.#resolve({ "Fn::GetAtt": [entry[0], "Arn"] }) as string;
  }

  /** Resolves the intrinsic functions CDK puts in policies (Ref, Fn::GetAtt, Fn::Join) to literals. */
  #resolve(value: unknown): unknown {
    if (Array.isArray(value)) return value.map((entry) => this.#resolve(entry));
    if (!value || typeof value !== "object") return value;
    const object = value as Record<string, unknown>;
    if ("Ref" in object) return this.#ref(String(object.Ref));
    if ("Fn::GetAtt" in object) {
      const [id, attribute] = object["Fn::GetAtt"] as [string, string];
      if (attribute !== "Arn") throw new Error(`unsupported Fn::GetAtt ${id}.${attribute}`);
      return this.#arnOf(id);
    }
    if ("Fn::Join" in object) {
      const [separator, parts] = object["Fn::Join"] as [string, unknown[]];
      return parts.map((part) => this.#resolve(part)).join(separator);
    }
    const intrinsic = Object.keys(object).find((key) => key.startsWith("Fn::"));
    if (intrinsic) throw new Error(`unsupported intrinsic ${intrinsic} in a policy`);
    return Object.fromEntries(Object.entries(object).map(([key, entry]) => [key, this.#resolve(entry)]));
  }

  #ref(name: string): string {
    if (name === "AWS::Partition") return "aws";
    if (name === "AWS::Region") return REGION;
    if (name === "AWS::AccountId") return ACCOUNT;
    if (name === "AWS::URLSuffix") return "amazonaws.com";
    const resource = this.#resources[name];
    if (resource?.Type === "AWS::DynamoDB::Table") return TABLE;
    throw new Error(`unsupported Ref ${name}`);
  }

  #arnOf(id: string): string {
    const resource = this.#resources[id];
    const props = resource?.Properties ?? {};
    switch (resource?.Type) {
      case "AWS::DynamoDB::Table":
        return `arn:aws:dynamodb:${REGION}:${ACCOUNT}:table/${String(props.TableName ?? TABLE)}`;
      case "AWS::SQS::Queue":
        return `arn:aws:sqs:${REGION}:${ACCOUNT}:${String(props.QueueName ?? id)}`;
      case "AWS::Events::EventBus":
        return `arn:aws:events:${REGION}:${ACCOUNT}:event-bus/${String(props.Name ?? id)}`;
      case "AWS::Lambda::Function":
        return `arn:aws:lambda:${REGION}:${ACCOUNT}:function:${id}`;
      case "AWS::Logs::LogGroup":
        return `arn:aws:logs:${REGION}:${ACCOUNT}:log-group:${id}:*`;
      default:
        throw new Error(`unsupported Fn::GetAtt of ${resource?.Type ?? id}`);
    }
  }
}

/** The principal's ARN, for the simulator's request. */
function principalArn(principal: AwsPrincipal): string {
  const name =
    principal.component === "agent" ? `agent-${principal.shard}-${principal.node}` : principal.component;
  return `arn:aws:iam::${ACCOUNT}:role/${name}`;
}

/** Checks each recorded call (each transaction item on its own) against the synthesized policies. */
export async function checkCalls(calls: readonly AwsCallRecord[]): Promise<PermissionReport> {
  const generated = (call: AwsCallRecord) =>
    call.principal.component === "agent" && call.principal.node === GENERATED_NODE_ID;
  const checked = calls.filter((call) => !call.provisioning && !generated(call));
  const nodes = new Map<string, AgentIdentity>();
  for (const call of checked) {
    const principal = call.principal;
    if (principal.component === "agent") {
      nodes.set(`${principal.shard}/${principal.node}`, { shard: principal.shard, node: principal.node });
    }
  }
  const validNodes = [...nodes.values()].filter((identity) => /^[A-Za-z0-9-]{1,64}$/.test(identity.node));
  const policies = new SynthesizedPolicies(validNodes);
  const denials: Denial[] = [];
  const seen = new Set<string>();
  const decided = new Map<string, string>();
  for (const call of checked) {
    const resource = policies.resourceArn(call);
    const checks = call.action.startsWith("dynamodb:Transact")
      ? call.items.length > 0
        ? call.items
        : [{ action: call.action, pk: undefined }]
      : [{ action: call.action, pk: call.items[0]?.pk }];
    for (const check of checks) {
      seen.add(`${call.principal.component} ${check.action}`);
      const key = JSON.stringify([call.principal, check.action, resource, check.pk]);
      let result = decided.get(key);
      if (result === undefined && check.action.startsWith("dynamodb:") && check.pk === undefined) {
        // Without the key, a `ForAllValues` condition would pass vacuously: fail closed instead.
        result = "no partition key recorded";
      }
      if (result === undefined) {
        result = await simulate(
          policies.policiesOf(call.principal),
          call.principal,
          check.action,
          resource,
          check.pk,
        );
        decided.set(key, result);
      }
      if (result !== "Allowed") {
        denials.push({ call, action: check.action, resource, leadingKey: check.pk, result });
      }
    }
  }
  return {
    calls: checked.length,
    actionsSeen: [...seen].sort(),
    denials,
    generatedIdCalls: calls.filter(generated).length,
  };
}

async function simulate(
  policies: readonly PolicyDocument[],
  principal: AwsPrincipal,
  action: string,
  resource: string,
  leadingKey: string | undefined,
): Promise<string> {
  const simulation: Simulation = {
    identityPolicies: policies.map((policy, index) => ({ name: `policy-${index}`, policy })),
    serviceControlPolicies: [],
    resourceControlPolicies: [],
    request: {
      action,
      principal: principalArn(principal),
      resource: { resource, accountId: ACCOUNT },
      contextVariables: leadingKey === undefined ? {} : { "dynamodb:LeadingKeys": [leadingKey] },
    },
  };
  const response = await runSimulation(simulation, {});
  if (response.resultType === "error") return `error: ${JSON.stringify(response.errors)}`;
  return response.overallResult;
}

/** One line per denial, for a test's failure message. */
export function describeDenials(denials: readonly Denial[]): string {
  const lines = new Set(
    denials.map((denial) => {
      const who =
        denial.call.principal.component === "agent"
          ? `agent ${denial.call.principal.shard}/${denial.call.principal.node}`
          : denial.call.principal.component;
      const key = denial.leadingKey ? ` (LeadingKeys ${denial.leadingKey})` : "";
      const via = denial.action === denial.call.action ? "" : ` in ${denial.call.action}`;
      return `${who}: ${denial.action}${via} on ${denial.resource}${key}: ${denial.result}`;
    }),
  );
  return [...lines].join("\n");
}
