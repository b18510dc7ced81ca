import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { DEFAULT_TABLE_NAME } from "../../core/table.ts";
import { LOCAL_CREDENTIALS, LOCAL_REGION } from "./credentials.ts";
import { type DynamoDbLocal, startDynamoDbLocal } from "./dynamodb-local.ts";
import { freePort } from "./processes.ts";
import { type RedisNode, startRedisNodes } from "./redis-nodes.ts";
import { type SqsEmulator, startSqsEmulator } from "./sqs-emulator.ts";
import { ensureTable } from "./table.ts";

export interface LocalStackOptions {
  /** How many redis-server nodes to start (first primary, rest replicas). @default 0 */
  readonly redis?: number;
  /** @default SHARDGUARD_TABLE or "shardguard" */
  readonly tableName?: string;
  /** Environment to read existing endpoints from. @default process.env */
  readonly env?: NodeJS.ProcessEnv;
  /** Progress lines for humans (stderr in the CLI). */
  readonly onProgress?: (line: string) => void;
}

/** The standard SDK variables that point any AWS tool at this stack. */
export interface LocalStackEnv {
  AWS_ENDPOINT_URL_DYNAMODB: string;
  AWS_ENDPOINT_URL_SQS: string;
  AWS_REGION: string;
  AWS_ACCESS_KEY_ID: string;
  AWS_SECRET_ACCESS_KEY: string;
  /** Only with endpoints from the environment and temporary credentials (a real account, docs/testing.md). */
  AWS_SESSION_TOKEN?: string;
  SHARDGUARD_TABLE: string;
}

export interface LocalStack {
  readonly env: LocalStackEnv;
  readonly redis: RedisNode[];
  /** True when endpoints came from the environment (e.g. LocalStack) and no emulator was started. */
  readonly external: boolean;
  /** Stops everything this stack started; safe to call twice. */
  stop(): Promise<void>;
}

/** Endpoints already configured by the caller (LocalStack or a running `shardguard local-stack`). */
export function externalEndpoints(env: NodeJS.ProcessEnv): { dynamodb: string; sqs: string } | undefined {
  const dynamodb = env.AWS_ENDPOINT_URL_DYNAMODB ?? env.AWS_ENDPOINT_URL;
  const sqs = env.AWS_ENDPOINT_URL_SQS ?? env.AWS_ENDPOINT_URL;
  return dynamodb && sqs ? { dynamodb, sqs } : undefined;
}

/**
 * Brings up DynamoDB Local, the SQS emulator and optional redis-server nodes on free
 * 127.0.0.1 ports, each waited for until it answers a real request, and creates the table.
 * When endpoints are already set in the environment, starts no emulator and uses them.
 */
export async function startLocalStack(options: LocalStackOptions = {}): Promise<LocalStack> {
  const env = options.env ?? process.env;
  const progress = options.onProgress ?? (() => {});
  const tableName = options.tableName ?? env.SHARDGUARD_TABLE ?? DEFAULT_TABLE_NAME;
  const started: Array<{ stop(): Promise<void> }> = [];
  let redis: RedisNode[] = [];
  const stop = async () => {
    const all = [...redis.map((node) => ({ stop: () => node.destroy() })), ...started];
    redis = [];
    started.length = 0;
    await Promise.all(all.map((item) => item.stop()));
  };
  try {
    const external = externalEndpoints(env);
    let endpoints: { dynamodb: string; sqs: string };
    let region = env.AWS_REGION ?? LOCAL_REGION;
    let credentials = {
      accessKeyId: env.AWS_ACCESS_KEY_ID ?? LOCAL_CREDENTIALS.accessKeyId,
      secretAccessKey: env.AWS_SECRET_ACCESS_KEY ?? LOCAL_CREDENTIALS.secretAccessKey,
    };
    if (external) {
      progress(`using endpoints from the environment: ${external.dynamodb}, ${external.sqs}`);
      endpoints = external;
    } else {
      progress("starting DynamoDB Local and the SQS emulator");
      const [dynamodb, sqs] = await Promise.allSettled([
        freePort().then((port) => startDynamoDbLocal(port)),
        freePort().then((port) => startSqsEmulator(port)),
      ]);
      for (const result of [dynamodb, sqs]) {
        if (result.status === "fulfilled") started.push(result.value.process);
      }
      if (dynamodb.status === "rejected") throw dynamodb.reason;
      if (sqs.status === "rejected") throw sqs.reason;
      endpoints = {
        dynamodb: (dynamodb.value as DynamoDbLocal).endpoint,
        sqs: (sqs.value as SqsEmulator).endpoint,
      };
      region = LOCAL_REGION;
      credentials = { ...LOCAL_CREDENTIALS };
    }
    const sessionToken = external ? env.AWS_SESSION_TOKEN : undefined;
    const client = new DynamoDBClient({
      endpoint: endpoints.dynamodb,
      region,
      credentials: sessionToken ? { ...credentials, sessionToken } : credentials,
    });
    try {
      await ensureTable(client, tableName);
    } finally {
      client.destroy();
    }
    progress(`table ${tableName} ready`);
    if ((options.redis ?? 0) > 0) {
      progress(`starting ${options.redis} redis-server node(s)`);
      redis = await startRedisNodes(options.redis ?? 0);
    }
    return {
      env: {
        AWS_ENDPOINT_URL_DYNAMODB: endpoints.dynamodb,
        AWS_ENDPOINT_URL_SQS: endpoints.sqs,
        AWS_REGION: region,
        AWS_ACCESS_KEY_ID: credentials.accessKeyId,
        AWS_SECRET_ACCESS_KEY: credentials.secretAccessKey,
        ...(external && env.AWS_SESSION_TOKEN ? { AWS_SESSION_TOKEN: env.AWS_SESSION_TOKEN } : {}),
        SHARDGUARD_TABLE: tableName,
      },
      get redis() {
        return redis;
      },
      external: external !== undefined,
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
