import { CoordinationUnavailable, errorMessage } from "../core/errors.ts";

/**
 * What an SDK error means to a caller of the ports:
 * - `conditional`: a condition expression failed (a lost race; the caller returns false);
 * - `missing_resource`: the table or queue does not exist (deploy, or start the local stack);
 * - `unavailable`: the service could not be reached or refused service (network, timeout, 5xx,
 *   throttling after the SDK's retries, credentials or authorisation);
 * - `fatal`: anything else, e.g. a ValidationException: a bug that no retry fixes.
 */
export type AwsErrorClass = "conditional" | "missing_resource" | "unavailable" | "fatal";

const CONDITIONAL = new Set(["ConditionalCheckFailedException"]);

const MISSING_RESOURCE = new Set([
  "ResourceNotFoundException",
  "QueueDoesNotExist",
  "AWS.SimpleQueueService.NonExistentQueue",
]);

const THROTTLING = new Set([
  "ThrottlingException",
  "Throttling",
  "ThrottledException",
  "RequestThrottled",
  "RequestThrottledException",
  "TooManyRequestsException",
  "ProvisionedThroughputExceededException",
  "RequestLimitExceeded",
  "LimitExceededException",
  "TransactionInProgressException",
  "KMS.ThrottlingException",
]);

/** The service refused us: retrying with the same credentials fails, but the store is not ours to use. */
const REFUSED = new Set([
  "CredentialsProviderError",
  "UnrecognizedClientException",
  "InvalidClientTokenId",
  "InvalidSignatureException",
  "SignatureDoesNotMatch",
  "IncompleteSignature",
  "ExpiredToken",
  "ExpiredTokenException",
  "AccessDenied",
  "AccessDeniedException",
  "MissingAuthenticationToken",
  "RequestExpired",
  "InvalidSecurity",
]);

const NETWORK_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "ETIMEDOUT",
  "EPIPE",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENETDOWN",
  "EADDRNOTAVAIL",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
]);

const NETWORK_NAMES = new Set(["TimeoutError", "RequestTimeout", "RequestTimeoutException", "AbortError"]);

interface SdkErrorShape {
  name?: string;
  code?: string;
  Code?: string;
  $fault?: string;
  $metadata?: { httpStatusCode?: number };
  $retryable?: unknown;
  errors?: unknown[];
  cause?: unknown;
}

export function classifyAwsError(error: unknown): AwsErrorClass {
  if (typeof error !== "object" || error === null) return "fatal";
  const shape = error as SdkErrorShape;
  const name = shape.name ?? "";
  const code = shape.Code ?? shape.code ?? "";
  if (CONDITIONAL.has(name)) return "conditional";
  if (MISSING_RESOURCE.has(name) || MISSING_RESOURCE.has(code)) return "missing_resource";
  if (THROTTLING.has(name) || THROTTLING.has(code) || REFUSED.has(name) || REFUSED.has(code)) {
    return "unavailable";
  }
  const status = shape.$metadata?.httpStatusCode;
  if ((status !== undefined && status >= 500) || shape.$fault === "server") return "unavailable";
  if (status === 403 || status === 429) return "unavailable";
  if (NETWORK_CODES.has(code) || NETWORK_NAMES.has(name)) return "unavailable";
  // Node reports a failed connection to every address of a host as an AggregateError.
  if (
    Array.isArray(shape.errors) &&
    shape.errors.some((inner) => classifyAwsError(inner) === "unavailable")
  ) {
    return "unavailable";
  }
  if (shape.cause !== undefined && shape.cause !== error) {
    return classifyAwsError(shape.cause) === "unavailable" ? "unavailable" : "fatal";
  }
  return "fatal";
}

/** What is being done, for error messages: `"DynamoDB PutItem (lock acquire, shard s1)"`. */
export interface OperationContext {
  readonly operation: string;
  /** How to create the missing table or queue; appended to `missing_resource` messages. */
  readonly missingHint?: string;
}

/**
 * Maps an SDK error to what callers of the ports expect: `CoordinationUnavailable` for an
 * unreachable, missing or refusing store; the original error (a bug) otherwise. Conditional
 * failures must be handled by the caller before this.
 */
export function toCoordinationError(error: unknown, context: OperationContext): unknown {
  const kind = classifyAwsError(error);
  if (kind === "unavailable") {
    return new CoordinationUnavailable(`${context.operation} failed: ${describe(error)}`, { cause: error });
  }
  if (kind === "missing_resource") {
    const hint = context.missingHint ? `; ${context.missingHint}` : "";
    return new CoordinationUnavailable(`${context.operation} failed: ${describe(error)}${hint}`, {
      cause: error,
    });
  }
  return error;
}

function describe(error: unknown): string {
  const shape = (typeof error === "object" && error !== null ? error : {}) as SdkErrorShape;
  const name = shape.name && shape.name !== "Error" ? shape.name : (shape.code ?? "Error");
  const message =
    errorMessage(error) || (Array.isArray(shape.errors) ? shape.errors.map(errorMessage).join("; ") : "");
  return message ? `${name}: ${message}` : name;
}
