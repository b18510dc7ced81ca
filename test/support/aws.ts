import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { SQSClient } from "@aws-sdk/client-sqs";
import { inject } from "vitest";

/** The endpoints and credentials the global setup started (or found in the environment). */
export function awsEnv(): Record<string, string> {
  return inject("awsEnv");
}

/** SDK clients configured only through the standard variables, as a user's tool would be. */
export function dynamoClient(): DynamoDBClient {
  const env = awsEnv();
  return new DynamoDBClient({
    region: env.AWS_REGION,
    endpoint: env.AWS_ENDPOINT_URL_DYNAMODB,
    credentials: {
      accessKeyId: env.AWS_ACCESS_KEY_ID ?? "",
      secretAccessKey: env.AWS_SECRET_ACCESS_KEY ?? "",
    },
  });
}

export function sqsClient(): SQSClient {
  const env = awsEnv();
  return new SQSClient({
    region: env.AWS_REGION,
    endpoint: env.AWS_ENDPOINT_URL_SQS,
    credentials: {
      accessKeyId: env.AWS_ACCESS_KEY_ID ?? "",
      secretAccessKey: env.AWS_SECRET_ACCESS_KEY ?? "",
    },
  });
}

export function tableName(): string {
  return awsEnv().SHARDGUARD_TABLE ?? "shardguard";
}

/** A unique name per test so tests sharing one emulator never see each other's data. */
export function uniqueName(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}
