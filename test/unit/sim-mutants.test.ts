import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { applyMutant, MUTANTS } from "../../src/dev/sim/mutants.ts";

/**
 * `npm run sim:mutants` plants each mutant of src/dev/sim/mutants.ts in a temporary copy of the
 * tree: a refactor that moves the code a patch searches for must update the patch, not silently
 * drop the mutant.
 */
describe("the simulator's planted mutants", () => {
  it("are at least ten, with distinct names", () => {
    // Assess
    expect(MUTANTS.length).toBeGreaterThanOrEqual(10);
    expect(new Set(MUTANTS.map((m) => m.name)).size).toBe(MUTANTS.length);
  });

  for (const mutant of MUTANTS) {
    it(`${mutant.name} applies to the product source once and changes it`, () => {
      // Arrange
      const written = new Map<string, string>();

      // Act
      const missing = applyMutant(
        mutant,
        (file) => readFileSync(file, "utf8"),
        (file, text) => written.set(file, text),
      );

      // Assess
      expect(missing).toEqual([]);
      for (const [file, text] of written) expect(text).not.toBe(readFileSync(file, "utf8"));
      expect(written.size).toBeGreaterThan(0);
    });
  }

  it("reports a patch whose search text is gone, and writes nothing", () => {
    // Arrange
    const mutant = { ...(MUTANTS[0] as (typeof MUTANTS)[number]) };
    const written: string[] = [];

    // Act
    const missing = applyMutant(
      mutant,
      () => "nothing to patch here",
      (file) => written.push(file),
    );

    // Assess
    expect(missing).toHaveLength(1);
    expect(written).toEqual([]);
  });
});
