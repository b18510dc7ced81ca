/**
 * The little the adapters log: malformed items and commands, with their context. Powertools'
 * `Logger` satisfies it, so entry points pass theirs.
 */
export interface AdapterLogger {
  warn(message: string, attributes?: Record<string, unknown>): void;
}

/** Default: one JSON line on stderr, so nothing malformed goes unreported. */
export const jsonLineLogger: AdapterLogger = {
  warn(message, attributes) {
    console.warn(
      JSON.stringify({ level: "WARN", message, ...attributes, timestamp: new Date().toISOString() }),
    );
  },
};
