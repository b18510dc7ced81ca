import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { SQSClient } from "@aws-sdk/client-sqs";
import { DynamoDBDocumentClient } from "@aws-sdk/lib-dynamodb";
import type { ApiCallCounter } from "./api-call-counter.ts";
import type { AwsCallJournal } from "./aws-call-journal.ts";
import type { AwsClock } from "./clock.ts";

/** Timeouts and retries of the SDK clients. Short by default: a failover decision cannot wait long. */
export interface AwsClientOptions {
  /** Attempts per call, first one included (standard retry mode with jittered back-off). @default 3 */
  readonly maxAttempts?: number;
  /** TCP connect timeout in ms. @default 1000 */
  readonly connectionTimeoutMs?: number;
  /** Per-attempt timeout of a DynamoDB request in ms. @default 2000 */
  readonly dynamoRequestTimeoutMs?: number;
  /** Per-attempt timeout of an SQS request other than a long poll, in ms. @default 5000 */
  readonly sqsRequestTimeoutMs?: number;
}

export interface AwsClients {
  readonly dynamo: DynamoDBClient;
  readonly documents: DynamoDBDocumentClient;
  readonly sqs: SQSClient;
  /** The SDK's measured offset to AWS (ms); see AwsClock. */
  sdkClockOffset(): number;
  destroy(): void;
}

/** Endpoint of a service from the standard SDK variables (service-specific first). */
export function endpointFromEnv(env: NodeJS.ProcessEnv, service: "DYNAMODB" | "SQS"): string | undefined {
  return env[`AWS_ENDPOINT_URL_${service}`] || env.AWS_ENDPOINT_URL || undefined;
}

/**
 * The DynamoDB and SQS clients, configured from the standard SDK variables of `env`
 * (`AWS_ENDPOINT_URL_DYNAMODB`, `AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`, `AWS_REGION`;
 * credentials through the default provider chain), with the API-call counter and the clock
 * attached. Endpoints and region are read from `env` explicitly so that a caller-provided
 * environment (tests, the local stack) wins over `process.env`.
 */
export function createAwsClients(
  env: NodeJS.ProcessEnv,
  counter: ApiCallCounter,
  clock: AwsClock,
  options: AwsClientOptions = {},
  journal?: AwsCallJournal,
): AwsClients {
  const region = env.AWS_REGION || env.AWS_DEFAULT_REGION || undefined;
  const common = {
    region,
    maxAttempts: options.maxAttempts ?? 3,
    retryMode: "standard",
    credentials: explicitCredentials(env),
  };
  const connectionTimeout = options.connectionTimeoutMs ?? 1000;
  const dynamo = new DynamoDBClient({
    ...common,
    endpoint: endpointFromEnv(env, "DYNAMODB"),
    requestHandler: {
      connectionTimeout,
      requestTimeout: options.dynamoRequestTimeoutMs ?? 2000,
      throwOnRequestTimeout: true,
    },
  });
  const sqs = new SQSClient({
    ...common,
    endpoint: endpointFromEnv(env, "SQS"),
    requestHandler: {
      connectionTimeout,
      requestTimeout: options.sqsRequestTimeoutMs ?? 5000,
      throwOnRequestTimeout: true,
    },
  });
  dynamo.middlewareStack.use(counter.plugin("DynamoDB"));
  dynamo.middlewareStack.use(clock.plugin());
  sqs.middlewareStack.use(counter.plugin("SQS"));
  sqs.middlewareStack.use(clock.plugin());
  if (journal) {
    dynamo.middlewareStack.use(journal.plugin("dynamodb"));
    sqs.middlewareStack.use(journal.plugin("sqs"));
  }
  const documents = DynamoDBDocumentClient.from(dynamo, {
    marshallOptions: { removeUndefinedValues: true, convertClassInstanceToMap: false },
  });
  return {
    dynamo,
    documents,
    sqs,
    sdkClockOffset: () => dynamo.config.systemClockOffset ?? 0,
    destroy: () => {
      dynamo.destroy();
      sqs.destroy();
    },
  };
}

/**
 * Keys given in `env` itself (a test or the local stack handing its own environment); otherwise
 * undefined, so the SDK's default provider chain (env, SSO, profile, container, instance) applies.
 */
function explicitCredentials(env: NodeJS.ProcessEnv) {
  if (env === process.env || !env.AWS_ACCESS_KEY_ID || !env.AWS_SECRET_ACCESS_KEY) return undefined;
  return {
    accessKeyId: env.AWS_ACCESS_KEY_ID,
    secretAccessKey: env.AWS_SECRET_ACCESS_KEY,
    ...(env.AWS_SESSION_TOKEN ? { sessionToken: env.AWS_SESSION_TOKEN } : {}),
  };
}
