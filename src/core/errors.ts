/**
 * Every error Shardguard raises on purpose descends from ShardguardError and sets `name`,
 * so logs and callers can tell them apart without instanceof across module copies.
 */
export class ShardguardError extends Error {
  override name = "ShardguardError";
  /** Whether repeating the same operation later may succeed. */
  readonly retryable: boolean = false;
}

/** Bad configuration, flag or input; names what is wrong. Never retryable. */
export class ConfigurationError extends ShardguardError {
  override name = "ConfigurationError";
}

/** A local prerequisite (java, redis-server, a free port) is missing. */
export class PrerequisiteError extends ShardguardError {
  override name = "PrerequisiteError";
}

/** The coordination store (DynamoDB) or command bus (SQS) cannot be reached or refused service. */
export class CoordinationUnavailable extends ShardguardError {
  override name = "CoordinationUnavailable";
  override readonly retryable = true;
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/**
 * A node's command queue does not exist: its agent never started, or an operator retired the node
 * (\`shardguard decommission\` deletes its queues). Nothing can be sent to it; retrying will not help
 * until an agent of that node creates the queue.
 */
export class QueueMissing extends CoordinationUnavailable {
  override name = "QueueMissing";
}

/** Stored data that does not match its schema; carries the field path and the reason. */
export class MalformedRecord extends ShardguardError {
  override name = "MalformedRecord";
  readonly field: string;
  readonly reason: string;
  constructor(message: string, field: string, reason: string) {
    super(message);
    this.field = field;
    this.reason = reason;
  }
}

/** One classifier for retry decisions: our own errors say so; anything else is treated as fatal. */
export function isRetryable(error: unknown): boolean {
  return error instanceof ShardguardError && error.retryable;
}

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
