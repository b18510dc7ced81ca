import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** clock-shim.c, beside this module (docs/chaos.md, `redis-clock-step`). */
const SOURCE = fileURLToPath(new URL("./clock-shim.c", import.meta.url));

/**
 * Compiles the wall-clock shim into `dir` and returns the shared object's path, to preload into a
 * redis-server (`LD_PRELOAD`) with `SHARDGUARD_CLOCK_FILE` naming a file holding the offset in ms.
 * libfaketime would be the usual tool; 0.9.10 aborts redis-server at start (jemalloc calls
 * clock_gettime during its initialisation), so the nemesis brings its own. Throws when no C
 * compiler is installed: the caller skips the fault kind and says why.
 */
export function buildClockShim(dir: string): string {
  const output = join(dir, "clock-shim.so");
  if (existsSync(output)) return output;
  execFileSync("cc", ["-O2", "-shared", "-fPIC", "-o", output, SOURCE], { stdio: "pipe", timeout: 60_000 });
  return output;
}
