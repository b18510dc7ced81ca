import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { codeVersion } from "../../src/dev/code-version.ts";

describe("codeVersion", () => {
  it("names the commit and the tree of src/ in a git checkout", () => {
    const version = codeVersion();

    expect(version.commit).toMatch(/^[0-9a-f]{40}$/);
    expect(version.srcTree).toMatch(/^[0-9a-f]{40}$/);
    expect(version.srcTree).not.toBe(version.commit);
    expect(typeof version.srcDirty).toBe("boolean");
  });

  it("says unknown outside a git checkout", () => {
    const dir = mkdtempSync(join(tmpdir(), "code-version-"));
    try {
      expect(codeVersion(dir)).toEqual({ commit: "unknown", srcTree: "unknown", srcDirty: "unknown" });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
