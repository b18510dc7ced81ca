import { DynamoDBClient } from "@aws-sdk/client-dynamodb";
import { SQSClient } from "@aws-sdk/client-sqs";
import { inject } from "vitest";

/** The endpoints and credentials the global setup started (or found in the environment). */
export function awsEnv(): Record<string, string> {
  return inject("awsEnv");
}

/** Plain SDK client settings from the standard variables, as a user's tool would build them. */
function clientConfig(endpointVariable: "AWS_ENDPOINT_URL_DYNAMODB" | "AWS_ENDPOINT_URL_SQS") {
  const env = awsEnv();
  return {
    region: env.AWS_REGION,
    endpoint: env[endpointVariable],
    credentials: {
      accessKeyId: env.AWS_ACCESS_KEY_ID ?? "",
      secretAccessKey: env.AWS_SECRET_ACCESS_KEY ?? "",
    },
  };
}

export function dynamoClient(): DynamoDBClient {
  return new DynamoDBClient(clientConfig("AWS_ENDPOINT_URL_DYNAMODB"));
}

export function sqsClient(): SQSClient {
  return new SQSClient(clientConfig("AWS_ENDPOINT_URL_SQS"));
}

export function tableName(): string {
  return awsEnv().SHARDGUARD_TABLE ?? "shardguard";
}

/** A unique name per test so tests sharing one emulator never see each other's data. */
export function uniqueName(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}
