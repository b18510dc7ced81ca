import { spawn } from "node:child_process";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

/**
 * For the abuse tests whose hostile client runs in a process of its own (so that generating garbage
 * does not load the agent under test, which runs in the test's process).
 */

/** Live memory (JavaScript heap and buffers) after a full collection, in MB. */
export function liveMemoryMb(): number {
  setFlagsFromString("--expose-gc");
  (runInNewContext("gc") as () => void)();
  const { heapUsed, external } = process.memoryUsage();
  return (heapUsed + external) / 2 ** 20;
}

/** Runs `node <script> <args...>` and resolves with the one JSON line it prints; rejects on a non-zero exit. */
export function runJsonClient<T = Record<string, unknown>>(
  script: string,
  args: readonly string[],
): Promise<T> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "inherit"] });
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.on("error", reject);
    child.on("exit", (code) =>
      code === 0 ? resolve(JSON.parse(output) as T) : reject(new Error(`${script} exited with ${code}`)),
    );
  });
}
