import { existsSync, readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { GATE_LISTS } from "../../src/core/decide/gates.ts";

const ROOT = new URL("../../", import.meta.url);
const read = (path: string) => readFileSync(new URL(path, ROOT), "utf8");

interface DocGate {
  readonly name: string;
  readonly code: string;
  readonly guarantees: readonly number[];
  readonly tests: string;
}

/** The gate rows of docs/safety.md, by the `### LIST` heading they stand under. */
function documentedGates(text: string): Record<string, DocGate[]> {
  const lists: Record<string, DocGate[]> = {};
  let current: DocGate[] | undefined;
  for (const line of text.split("\n")) {
    const heading = /^### ([A-Z_]+)$/.exec(line);
    if (heading?.[1] !== undefined) {
      current = [];
      lists[heading[1]] = current;
      continue;
    }
    const row = /^\| \d+ \| `([a-z_]+)` \| `([a-z_]+)` \| ([\d, ]+) \| .* \| (.*) \|$/.exec(line);
    if (row === null || current === undefined) continue;
    const [, name = "", code = "", guarantees = "", tests = ""] = row;
    current.push({ name, code, guarantees: guarantees.split(",").map(Number), tests });
  }
  return lists;
}

const CODE_GATES = Object.entries(GATE_LISTS).map(
  ([list, gates]) =>
    [list, gates.map((gate) => ({ name: gate.name, code: gate.code, guarantees: gate.invariant }))] as const,
);

describe("docs/safety.md: one row per gate of the decision", () => {
  const docs = documentedGates(read("docs/safety.md"));

  it("documents exactly the gate lists of the code", () => {
    expect(Object.keys(docs).sort()).toEqual(Object.keys(GATE_LISTS).sort());
  });

  it.each(CODE_GATES)(
    "lists %s's gates in the code's order, with their codes and guarantees",
    (list, gates) => {
      expect(docs[list]?.map(({ name, code, guarantees }) => ({ name, code, guarantees }))).toEqual(gates);
    },
  );

  it("names every gate once", () => {
    const names = CODE_GATES.flatMap(([, gates]) => gates.map((gate) => gate.name));
    expect(new Set(names).size).toBe(names.length);
  });

  it("cites, for every gate, tests that exist under the names it quotes", () => {
    for (const gate of Object.values(docs).flat()) {
      const cited = gate.tests.split(";").map((part) => part.trim());
      expect(cited.length, gate.name).toBeGreaterThan(0);
      for (const citation of cited) {
        const match = /^(?:(integration) )?(?:`([\w.-]+)` )?"(.+)"$/.exec(citation);
        expect(match, `${gate.name}: ${citation}`).not.toBeNull();
        const [, project = "unit", file = "decide.test.ts", name = ""] = match ?? [];
        const path = `test/${project}/${file}`;
        expect(existsSync(new URL(path, ROOT)), path).toBe(true);
        expect(read(path), `${gate.name} cites "${name}" in ${path}`).toContain(name);
      }
    }
  });
});

describe("docs/controller.md §1: the no-action codes", () => {
  it("lists exactly the codes the gates answer with", () => {
    const row = read("docs/controller.md")
      .split("\n")
      .find((line) => line.startsWith("| `none` (with `code`) |"));
    const listed = [...(row ?? "").matchAll(/`([a-z_]+)`/g)]
      .map((match) => match[1])
      .filter((word) => word !== "none" && word !== "code");
    const codes = new Set(CODE_GATES.flatMap(([, gates]) => gates.map((gate) => gate.code)));
    expect(new Set(listed)).toEqual(codes);
  });
});
