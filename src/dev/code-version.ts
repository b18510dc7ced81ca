import { spawnSync } from "node:child_process";

/**
 * Which code a long run exercised, for its report: the commit checked out, the git tree of `src/`
 * (the product and the harness that drives it; docs-only commits keep it, so runs split across
 * commits can show they ran the same code), and whether `src/` had uncommitted changes. Fields are
 * "unknown" outside a git checkout.
 */
export interface CodeVersion {
  readonly commit: string;
  readonly srcTree: string;
  readonly srcDirty: boolean | "unknown";
}

export function codeVersion(cwd = process.cwd()): CodeVersion {
  const git = (...args: string[]) => {
    const result = spawnSync("git", args, { cwd, encoding: "utf8" });
    return result.status === 0 ? result.stdout.trim() : undefined;
  };
  const status = git("status", "--porcelain", "--", "src");
  return {
    commit: git("rev-parse", "HEAD") ?? "unknown",
    srcTree: git("rev-parse", "HEAD:src") ?? "unknown",
    srcDirty: status === undefined ? "unknown" : status !== "",
  };
}
