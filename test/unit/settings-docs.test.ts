import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { FAILOVER_SETTINGS } from "../../src/adapters/env.ts";
import { AGENT_SETTINGS, agentProcessFields, resolveAgentOptions } from "../../src/agent/options.ts";
import { DEFAULT_CONFIG, failoverConfigSchema } from "../../src/core/config.ts";
import { DOC_TABLES, withTable } from "../../src/dev/docs-settings.ts";

const ROOT = new URL("../../", import.meta.url);

/** The default a docs row states as one code span (`100`), or undefined when it is prose. */
function literalDefault(text: string): string | undefined {
  return /^`([^`]*)`$/.exec(text)?.[1];
}

describe("settings: one declaration, the docs made from it", () => {
  it.each(DOC_TABLES.map((table) => [table.file, table] as const))(
    "%s carries the table the code generates (run npm run docs:settings after changing a setting)",
    (_file, table) => {
      const text = readFileSync(new URL(table.file, ROOT), "utf8");
      expect(withTable(text, table)).toBe(text);
    },
  );

  it("declares every field of the agent's schema once, and nothing else", () => {
    const keys = AGENT_SETTINGS.map((setting) => setting.key);
    expect(new Set(keys).size).toBe(keys.length);
    expect([...keys].sort()).toEqual(Object.keys(agentProcessFields.shape).sort());
  });

  it("declares every field of the failover configuration once, and nothing else", () => {
    const keys = FAILOVER_SETTINGS.map((setting) => setting.key);
    expect([...keys].sort()).toEqual(Object.keys(failoverConfigSchema.shape).sort());
  });

  it("states the failover defaults the schema applies", () => {
    for (const setting of FAILOVER_SETTINGS) {
      expect(literalDefault(setting.default), setting.key).toBe(String(DEFAULT_CONFIG[setting.key]));
    }
  });

  it("states the agent defaults the loader applies, where the docs give one value", () => {
    // Act
    const resolved = resolveAgentOptions({ flags: { shard: "s1", redis: "10.0.0.1:6379" }, env: {} });
    const values: Record<string, unknown> = { ...resolved.agent, ...resolved };

    // Assess
    const checked = AGENT_SETTINGS.filter(
      (setting) => literalDefault(setting.default) !== undefined && values[setting.key] !== undefined,
    );
    for (const setting of checked) {
      expect(String(values[setting.key]), setting.key).toBe(literalDefault(setting.default));
    }
    expect(checked.map((setting) => setting.key)).toEqual(
      expect.arrayContaining([
        "priority",
        "fencePolicy",
        "heartbeatIntervalMs",
        "fenceTimeoutMs",
        "logLevel",
      ]),
    );
  });

  it("fails when a generated table was edited by hand", () => {
    // Arrange
    const [table] = DOC_TABLES;
    if (!table) throw new Error("no docs table declared");
    const text = readFileSync(new URL(table.file, ROOT), "utf8");
    const edited = text.replace("| `--priority` |", "| `--prio` |");

    // Assess
    expect(edited).not.toBe(text);
    expect(withTable(edited, table)).not.toBe(edited);
  });
});
