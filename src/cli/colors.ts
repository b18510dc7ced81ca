import pc from "picocolors";

/**
 * Whether the CLI colours its output: only for a terminal, as `ls` and `git` do. `NO_COLOR` turns
 * colour off and `FORCE_COLOR` on (https://no-color.org, https://force-color.org). picocolors' own
 * default also colours whenever `CI` is set, which put escape codes into piped output on CI machines.
 */
export function colorWanted(env: NodeJS.ProcessEnv, isTTY: boolean | undefined): boolean {
  if (env.NO_COLOR !== undefined && env.NO_COLOR !== "") return false;
  if (env.FORCE_COLOR !== undefined && env.FORCE_COLOR !== "0" && env.FORCE_COLOR !== "false") return true;
  return isTTY === true && env.TERM !== "dumb";
}

/** The colour functions of this process's stdout. */
export const colors = pc.createColors(colorWanted(process.env, process.stdout.isTTY));
