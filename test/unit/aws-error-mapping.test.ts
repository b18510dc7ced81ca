import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { classifyAwsError, toCoordinationError } from "../../src/adapters/aws-errors.ts";
import { CoordinationUnavailable } from "../../src/core/errors.ts";

/** SDK-shaped errors as the clients raise them. */
function sdkError(name: string, status?: number, fault?: "client" | "server") {
  return Object.assign(new Error(`${name} happened`), {
    name,
    $fault: fault ?? (status !== undefined && status >= 500 ? "server" : "client"),
    $metadata: status === undefined ? {} : { httpStatusCode: status },
  });
}

function networkError(code: string) {
  return Object.assign(new Error(`connect ${code} 127.0.0.1:9`), { code });
}

describe("classifying SDK errors", () => {
  it.each([
    ["a failed condition", sdkError("ConditionalCheckFailedException", 400), "conditional"],
    ["a missing table", sdkError("ResourceNotFoundException", 400), "missing_resource"],
    ["a missing queue", sdkError("QueueDoesNotExist", 400), "missing_resource"],
    ["DynamoDB throttling", sdkError("ProvisionedThroughputExceededException", 400), "unavailable"],
    ["SQS throttling", sdkError("RequestThrottled", 400), "unavailable"],
    ["a 500", sdkError("InternalServerError", 500), "unavailable"],
    ["a 503 without a modelled name", sdkError("Unknown", 503), "unavailable"],
    ["a refused connection", networkError("ECONNREFUSED"), "unavailable"],
    ["an unknown host", networkError("ENOTFOUND"), "unavailable"],
    ["an SDK timeout", Object.assign(new Error("timed out"), { name: "TimeoutError" }), "unavailable"],
    ["missing credentials", sdkError("CredentialsProviderError"), "unavailable"],
    ["expired credentials", sdkError("ExpiredTokenException", 400), "unavailable"],
    ["a validation error (a bug)", sdkError("ValidationException", 400), "fatal"],
    ["a plain TypeError", new TypeError("x is undefined"), "fatal"],
    [
      "a refused connection to every address",
      Object.assign(new AggregateError([networkError("ECONNREFUSED"), networkError("ECONNREFUSED")]), {}),
      "unavailable",
    ],
  ])("classifies %s", (_, error, expected) => {
    expect(classifyAwsError(error)).toBe(expected);
  });

  it("maps a missing table to CoordinationUnavailable with the hint and keeps the cause", () => {
    // Prepare
    const cause = sdkError("ResourceNotFoundException", 400);

    // Act
    const mapped = toCoordinationError(cause, { operation: "DynamoDB Query", missingHint: "run it" });

    // Assess
    expect(mapped).toBeInstanceOf(CoordinationUnavailable);
    expect((mapped as Error).message).toBe(
      "DynamoDB Query failed: ResourceNotFoundException: ResourceNotFoundException happened; run it",
    );
    expect((mapped as Error).cause).toBe(cause);
  });

  it("passes a bug through unchanged", () => {
    const bug = sdkError("ValidationException", 400);
    expect(toCoordinationError(bug, { operation: "DynamoDB PutItem" })).toBe(bug);
  });
});

/**
 * A stand-in for DynamoDB that answers every request with one error. The real SDK client talks to
 * it, so its retries, error parsing and our mapping all run; a real DynamoDB cannot be made to
 * throttle or fail on demand.
 */
async function failingDynamo(
  status: number,
  type: string,
): Promise<{ server: Server; endpoint: string; hits: () => number }> {
  let hits = 0;
  const server = createServer((request, response) => {
    request.resume();
    hits += 1;
    response.writeHead(status, {
      "content-type": "application/x-amz-json-1.0",
      "x-amzn-requestid": `r${hits}`,
    });
    response.end(
      JSON.stringify({ __type: `com.amazonaws.dynamodb.v20120810#${type}`, message: `${type} (stub)` }),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { server, endpoint: `http://127.0.0.1:${port}`, hits: () => hits };
}

describe("a store that keeps failing", () => {
  let server: Server | undefined;
  let adapters: AwsAdapters | undefined;

  afterEach(async () => {
    adapters?.destroy();
    await new Promise((resolve) => server?.close(resolve));
  });

  it.each([
    ["throttles", 400, "ThrottlingException"],
    ["fails with 500", 500, "InternalServerError"],
    ["is unavailable (503)", 503, "ServiceUnavailable"],
  ])(
    "that %s makes acquire throw CoordinationUnavailable after the SDK's retries, not return false",
    async (_, status, type) => {
      // Prepare
      const stub = await failingDynamo(status, type);
      server = stub.server;
      adapters = createAwsAdapters({
        env: {
          AWS_ENDPOINT_URL_DYNAMODB: stub.endpoint,
          AWS_ENDPOINT_URL_SQS: stub.endpoint,
          AWS_REGION: "us-east-1",
          AWS_ACCESS_KEY_ID: "k",
          AWS_SECRET_ACCESS_KEY: "s",
        },
        maxAttempts: 2,
      });

      // Act
      const attempt = adapters.store.locks.acquire("s1", "owner", 1000);

      // Assess
      await expect(attempt).rejects.toBeInstanceOf(CoordinationUnavailable);
      await expect(attempt).rejects.toThrow(new RegExp(type));
      expect(stub.hits()).toBe(2);
      expect(adapters.counter.snapshot()["DynamoDB.UpdateItem"]).toEqual({
        calls: 1,
        requests: 2,
        errors: 1,
      });
    },
  );

  it("that rejects the condition makes acquire return false", async () => {
    // Prepare
    const stub = await failingDynamo(400, "ConditionalCheckFailedException");
    server = stub.server;
    adapters = createAwsAdapters({
      env: {
        AWS_ENDPOINT_URL_DYNAMODB: stub.endpoint,
        AWS_ENDPOINT_URL_SQS: stub.endpoint,
        AWS_REGION: "us-east-1",
        AWS_ACCESS_KEY_ID: "k",
        AWS_SECRET_ACCESS_KEY: "s",
      },
    });

    // Act
    const acquired = await adapters.store.locks.acquire("s1", "owner", 1000);

    // Assess
    expect(acquired).toBe(false);
    expect(stub.hits()).toBe(1);
  });
});
