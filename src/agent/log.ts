/**
 * What the agent logs through. Powertools' `Logger` satisfies it, and so does the JSON-line
 * logger below; tests pass one that records lines.
 */
export interface AgentLogger {
  debug(message: string, attributes?: Record<string, unknown>): void;
  info(message: string, attributes?: Record<string, unknown>): void;
  warn(message: string, attributes?: Record<string, unknown>): void;
  error(message: string, attributes?: Record<string, unknown>): void;
}

export const LOG_LEVELS = ["debug", "info", "warn", "error", "silent"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/**
 * Structured JSON lines with persistent keys (shard, node) on every line. Lines go to `write`
 * (stdout by default, which journald and CloudWatch agents collect as is).
 */
export function jsonLineLogger(
  persistent: Record<string, unknown>,
  level: LogLevel = "info",
  write: (line: string) => void = (line) => process.stdout.write(`${line}\n`),
): AgentLogger {
  const threshold = LOG_LEVELS.indexOf(level);
  const emit =
    (lineLevel: Exclude<LogLevel, "silent">) => (message: string, attributes?: Record<string, unknown>) => {
      if (LOG_LEVELS.indexOf(lineLevel) < threshold) return;
      write(
        JSON.stringify({
          level: lineLevel.toUpperCase(),
          message,
          timestamp: new Date().toISOString(),
          ...persistent,
          ...attributes,
        }),
      );
    };
  return { debug: emit("debug"), info: emit("info"), warn: emit("warn"), error: emit("error") };
}
