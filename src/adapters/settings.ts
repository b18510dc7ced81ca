import { readFileSync } from "node:fs";
import type { z } from "zod";
import { describeIssues } from "../core/config.ts";
import { ConfigurationError, errorMessage } from "../core/errors.ts";

/**
 * One declaration per setting: its key (zod schema field and config-file key), its environment
 * variable, its flag if it has one, and the text that the CLI's help and the docs tables show.
 * A component lists its settings once; the loader, commander's options and the docs table
 * (`npm run docs:settings`) are all made from that list.
 */
export interface Setting {
  readonly key: string;
  readonly kind: "string" | "integer" | "boolean";
  readonly env: string;
  /** `--priority`; absent for a setting that must not show in `ps` (passwords) or is env/file only. */
  readonly flag?: string;
  /** The flag's value in help, e.g. `<host:port>`; absent for a switch (`--redis-tls`). */
  readonly placeholder?: string;
  /** The default as the docs state it (markdown). */
  readonly default: string;
  /** What it does (markdown; the CLI's help shows it as plain text). */
  readonly description: string;
}

/** Where settings come from. Precedence: flag > environment > config file > the schema's default. */
export interface SettingSources {
  /** commander's parsed flags (camelCase keys, string values; `true` for a switch). */
  readonly flags?: Readonly<Record<string, string | boolean | undefined>>;
  readonly env: NodeJS.ProcessEnv;
  /** A JSON config file with the settings' keys, already read ({@link readJsonConfigFile}). */
  readonly file?: { readonly path: string; readonly values: Readonly<Record<string, unknown>> };
}

/** How an operator names a setting in a message: "--redis-ca (SHARDGUARD_REDIS_CA)" or the variable. */
export function settingLabel(settings: readonly Setting[], key: string): string {
  const setting = settings.find((candidate) => candidate.key === key);
  if (!setting) return key;
  return setting.flag ? `${setting.flag} (${setting.env})` : setting.env;
}

/** Reads a JSON config file holding one object; every failure names the file. */
export function readJsonConfigFile(
  path: string,
  readFile: (path: string) => string = (p) => readFileSync(p, "utf8"),
): Record<string, unknown> {
  let text: string;
  try {
    text = readFile(path);
  } catch (error) {
    throw new ConfigurationError(`config file ${path} cannot be read: ${errorMessage(error)}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new ConfigurationError(`config file ${path} is not valid JSON: ${jsonSyntaxProblem(error)}`);
  }
  if (json === null || typeof json !== "object" || Array.isArray(json)) {
    throw new ConfigurationError(`config file ${path} must hold one JSON object`);
  }
  return json as Record<string, unknown>;
}

/**
 * Why JSON.parse refused a text, without quoting any of it: V8's message carries an excerpt, and
 * the file may be a password or key file named by mistake.
 */
export function jsonSyntaxProblem(error: unknown): string {
  const where = /at position \d+(?: \(line \d+ column \d+\))?/.exec(errorMessage(error))?.[0];
  return `syntax error${where ? ` ${where}` : ""} (the content is not shown: it may be a secret)`;
}

/**
 * Merges flags, environment and config file into the input of `schema` and validates it. Every
 * problem is reported at once, each naming the flag, variable or config key it came from (or, for
 * a setting nobody set, its flag and variable); `what` starts the message ("invalid agent options").
 */
export function loadSettings<Schema extends z.ZodType>(
  settings: readonly Setting[],
  schema: Schema,
  sources: SettingSources,
  what: string,
  /** Values from elsewhere, used when no source names the setting (systemd's STATE_DIRECTORY). */
  fallbacks: Readonly<Record<string, { readonly value: unknown; readonly label: string }>> = {},
): z.output<Schema> {
  const errors: string[] = [];
  const file = sources.file;
  if (file) {
    const known = new Set(settings.map((setting) => setting.key));
    for (const key of Object.keys(file.values)) {
      if (!known.has(key))
        errors.push(`${key} in ${file.path}: unknown setting (known: ${[...known].join(", ")})`);
    }
  }

  const labels = new Map<string, string>();
  const input: Record<string, unknown> = {};
  for (const setting of settings) {
    const flagValue = setting.flag ? sources.flags?.[flagAttribute(setting.flag)] : undefined;
    const envValue = sources.env[setting.env];
    let found: { value: unknown; label: string } | undefined;
    if (setting.flag && flagValue !== undefined) found = { value: flagValue, label: setting.flag };
    else if (envValue !== undefined && envValue !== "") found = { value: envValue, label: setting.env };
    else if (file && file.values[setting.key] !== undefined)
      found = { value: file.values[setting.key], label: `${setting.key} in ${file.path}` };
    else found = fallbacks[setting.key];
    if (found === undefined) continue;
    labels.set(setting.key, found.label);
    input[setting.key] = coerce(found.value, setting.kind, found.label, errors);
  }

  const nameOf = (key: string) => labels.get(key) ?? settingLabel(settings, key);
  const result = schema.safeParse(input);
  if (!result.success) {
    for (const issue of result.error.issues) {
      const missing = issue.code === "invalid_type" && issue.input === undefined;
      if (missing && issue.path.length > 0) {
        const key = String(issue.path[0]);
        errors.push(`${labels.get(key) ?? requiredLabel(settings, key)}: required`);
      } else {
        errors.push(describeIssues([issue], nameOf));
      }
    }
  }
  if (errors.length > 0) throw new ConfigurationError(`${what}: ${errors.join("; ")}`);
  return (result as { data: z.output<Schema> }).data;
}

/** A required setting nobody gave: "--shard (or SHARDGUARD_SHARD)". */
function requiredLabel(settings: readonly Setting[], key: string): string {
  const setting = settings.find((candidate) => candidate.key === key);
  if (!setting) return key;
  return setting.flag ? `${setting.flag} (or ${setting.env})` : setting.env;
}

function coerce(raw: unknown, kind: Setting["kind"], label: string, errors: string[]): unknown {
  if (kind === "integer" && typeof raw === "string") {
    const value = Number(raw.trim());
    if (raw.trim() === "" || !Number.isInteger(value)) {
      errors.push(`${label}: must be an integer, got "${raw}"`);
      return undefined;
    }
    return value;
  }
  if (kind === "boolean" && typeof raw === "string") {
    const word = raw.trim().toLowerCase();
    if (["true", "1", "yes", "on"].includes(word)) return true;
    if (["false", "0", "no", "off"].includes(word)) return false;
    errors.push(`${label}: must be true or false, got "${raw}"`);
    return undefined;
  }
  return raw;
}

/** "--node-id" -> "nodeId", as commander names parsed flags. */
export function flagAttribute(flag: string): string {
  return flag.replace(/^--/, "").replace(/-([a-z])/g, (_, letter: string) => letter.toUpperCase());
}

/** Markdown as plain text for `--help`: code spans and links keep only their text. */
export function plainText(markdown: string): string {
  return markdown
    .replace(/`([^`]*)`/g, "$1")
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/\*([^*]+)\*/g, "$1");
}

/**
 * The docs table of a component's settings. docs/agent.md and docs/controller.md carry it between
 * `<!-- settings:<name> -->` markers; a unit test fails when they drift from the code.
 */
export function settingsTable(settings: readonly Setting[], options: { readonly flags: boolean }): string {
  const code = (text: string | undefined) => (text ? `\`${text}\`` : "");
  const row = (cells: readonly string[]) => `|${cells.map((cell) => (cell ? ` ${cell} ` : " ")).join("|")}|`;
  const header = options.flags
    ? [row(["Flag", "Variable", "Config key", "Default", "Meaning"]), "|---|---|---|---|---|"]
    : [row(["Variable", "Default", "Meaning"]), "|---|---|---|"];
  const rows = settings.map((setting) =>
    row(
      options.flags
        ? [code(setting.flag), code(setting.env), code(setting.key), setting.default, setting.description]
        : [code(setting.env), setting.default, setting.description],
    ),
  );
  return [...header, ...rows].join("\n");
}
