/**
 * Writes the settings tables of docs/agent.md and docs/controller.md from the settings lists in the
 * code (`npm run docs:settings`); test/unit/settings-docs.test.ts fails when the docs drift.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { FAILOVER_SETTINGS } from "../adapters/env.ts";
import { type Setting, settingsTable } from "../adapters/settings.ts";
import { AGENT_SETTINGS } from "../agent/options.ts";

export interface DocTable {
  /** Relative to the repository root. */
  readonly file: string;
  /** The markers are `<!-- settings:<name> -->` and `<!-- /settings:<name> -->`. */
  readonly name: string;
  readonly settings: readonly Setting[];
  readonly flags: boolean;
}

export const DOC_TABLES: readonly DocTable[] = [
  { file: "docs/agent.md", name: "agent", settings: AGENT_SETTINGS, flags: true },
  { file: "docs/controller.md", name: "controller", settings: FAILOVER_SETTINGS, flags: false },
  {
    file: "docs/sentinel.md",
    name: "sentinel",
    settings: AGENT_SETTINGS.filter((setting) => setting.key.startsWith("sentinel")),
    flags: true,
  },
];

/** `text` with the table between the markers written afresh; throws when a marker is missing. */
export function withTable(text: string, table: DocTable): string {
  const open = `<!-- settings:${table.name} -->`;
  const close = `<!-- /settings:${table.name} -->`;
  const start = text.indexOf(open);
  const end = text.indexOf(close);
  if (start < 0 || end < start) throw new Error(`${table.file} lacks the markers ${open} ... ${close}`);
  const generated = `${open}\n<!-- generated from the code by \`npm run docs:settings\`; edit the settings list, not this table -->\n${settingsTable(table.settings, { flags: table.flags })}\n`;
  return text.slice(0, start) + generated + text.slice(end);
}

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  for (const table of DOC_TABLES) {
    const path = `${ROOT}${table.file}`;
    const before = readFileSync(path, "utf8");
    const after = withTable(before, table);
    if (after !== before) writeFileSync(path, after);
    process.stdout.write(
      `${table.file}: ${after === before ? "up to date" : "table rewritten"} (${table.settings.length} settings)\n`,
    );
  }
}
