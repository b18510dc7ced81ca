/**
 * Runs test files N times in a row, each run a fresh `vitest run`, and says how many passed, how
 * many failed and how long each took: a flake rate, measured the same way by anyone.
 *
 *   npm run test:repeat -- test/integration/chaos-agent-stall.test.ts --times 20
 *   npm run test:repeat -- test/integration/chaos-agent-stall.test.ts --times 10 --hog
 *
 * `--hog` runs one busy loop per core (`sh -c 'while :; do :; done'`) from the first run to the
 * last, as a loaded CI machine would; they are killed by their pid at the end (also on Ctrl-C).
 * Each run's output goes to a file of its own; a failed run's file is named with the error lines
 * vitest printed. Exits 1 when any run failed.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createWriteStream, mkdtempSync, readFileSync } from "node:fs";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { parseIntegerOption } from "../src/cli/options.ts";
import { median } from "./lib/stats.ts";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const VITEST = join(ROOT, "node_modules", "vitest", "vitest.mjs");

// biome-ignore lint/suspicious/noControlCharactersInRegex: terminal colour codes are what it removes
const ANSI = /\u001b\[[0-9;]*m/g;

interface RunResult {
  readonly run: number;
  readonly passed: boolean;
  readonly exitCode: number | null;
  readonly seconds: number;
  readonly log: string;
  /** vitest's "Tests" line: how many tests failed and passed (undefined: it printed none). */
  readonly tests: { readonly failed: number; readonly passed: number } | undefined;
}

/** One busy loop per core; each is one `sh` process (`:` is a builtin), killed by its pid. */
function startHogs(count: number): ChildProcess[] {
  return Array.from({ length: count }, () => spawn("sh", ["-c", "while :; do :; done"], { stdio: "ignore" }));
}

function stopHogs(hogs: readonly ChildProcess[]): void {
  for (const hog of hogs) if (hog.exitCode === null && hog.signalCode === null) hog.kill("SIGKILL");
}

/** `vitest run <files>` once, its output to `log`. */
function runOnce(files: readonly string[], extra: readonly string[], log: string): Promise<number | null> {
  return new Promise((resolve, reject) => {
    const out = createWriteStream(log);
    // No retry: the integration project's retry (vitest.config.ts) would count a flaky run as a pass.
    const child = spawn(process.execPath, [VITEST, "run", "--retry=0", ...files, ...extra], {
      cwd: ROOT,
      env: { ...process.env, NO_COLOR: "1", FORCE_COLOR: "0" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    child.stdout.pipe(out, { end: false });
    child.stderr.pipe(out, { end: false });
    child.on("error", reject);
    child.on("close", (code) => out.end(() => resolve(code)));
  });
}

/** vitest's summary ("Tests  1 failed | 3 passed (4)"), from a run's output. */
function testCounts(log: string): RunResult["tests"] {
  const line = readFileSync(log, "utf8")
    .replace(ANSI, "")
    .split("\n")
    .find((candidate) => /^\s*Tests\s+\d/.test(candidate));
  if (line === undefined) return undefined;
  return {
    failed: Number(/(\d+) failed/.exec(line)?.[1] ?? 0),
    passed: Number(/(\d+) passed/.exec(line)?.[1] ?? 0),
  };
}

/** "pass", or why not: tests failed, or the run failed outside them (setup, teardown). */
function verdict(result: RunResult): string {
  if (result.passed) return "pass";
  const tests = result.tests;
  if (tests === undefined) return `FAIL (exit ${result.exitCode}; no test summary)`;
  if (tests.failed > 0)
    return `FAIL (exit ${result.exitCode}; ${tests.failed} failed, ${tests.passed} passed)`;
  return `FAIL (exit ${result.exitCode}; all ${tests.passed} tests passed: the failure is outside them)`;
}

/** The lines of a failed run's output that say what failed. */
function failureLines(log: string): string[] {
  return readFileSync(log, "utf8")
    .replace(ANSI, "")
    .split("\n")
    .filter((line) => /^\s*(FAIL|×)\s|Error:/.test(line))
    .slice(0, 6)
    .map((line) => line.trim().slice(0, 300));
}

export function buildProgram(): Command {
  return new Command()
    .name("test:repeat")
    .description("Run test files N times in a row; print pass/fail counts and per-run durations.")
    .argument("<files...>", "test files, as vitest takes them")
    .option("--times <n>", "how many runs", parseIntegerOption(1, 1000), 10)
    .option("--hog", "a busy loop on every core for the whole series")
    .option("-t, --test-name-pattern <pattern>", "only the tests whose name matches (vitest -t)")
    .option("--bail", "stop at the first failed run")
    .action(
      async (
        files: string[],
        options: { times: number; hog?: boolean; testNamePattern?: string; bail?: boolean },
      ) => {
        const extra = options.testNamePattern === undefined ? [] : ["-t", options.testNamePattern];
        const dir = mkdtempSync(join(tmpdir(), "shardguard-repeat-"));
        const hogs = options.hog ? startHogs(availableParallelism()) : [];
        const onSignal = () => {
          stopHogs(hogs);
          process.exit(130);
        };
        process.once("SIGINT", onSignal).once("SIGTERM", onSignal);
        process.once("exit", () => stopHogs(hogs));
        if (hogs.length > 0)
          console.log(`hog: ${hogs.length} busy loops, pids ${hogs.map((hog) => hog.pid).join(" ")}`);
        console.log(
          `${options.times} runs of ${files.join(" ")}${extra.length ? ` -t ${extra[1]}` : ""}; logs in ${dir}`,
        );
        const results: RunResult[] = [];
        try {
          for (let run = 1; run <= options.times; run++) {
            const log = join(dir, `run-${run}.log`);
            const started = performance.now();
            const exitCode = await runOnce(files, extra, log);
            const result: RunResult = {
              run,
              passed: exitCode === 0,
              exitCode,
              seconds: (performance.now() - started) / 1000,
              log,
              tests: testCounts(log),
            };
            results.push(result);
            console.log(`run ${run}/${options.times}: ${verdict(result)} ${result.seconds.toFixed(1)} s`);
            if (!result.passed) {
              for (const line of failureLines(log)) console.log(`    ${line}`);
              console.log(`    output: ${log}`);
              if (options.bail) break;
            }
          }
        } finally {
          stopHogs(hogs);
        }
        const failed = results.filter((result) => !result.passed);
        const seconds = results.map((result) => result.seconds);
        console.log(
          `${results.length} runs${options.hog ? " beside the hog" : ""}: ${results.length - failed.length} passed, ${failed.length} failed` +
            `${failed.length ? ` (runs ${failed.map((result) => result.run).join(", ")})` : ""}; ` +
            `duration median ${median(seconds).toFixed(1)} s, min ${Math.min(...seconds).toFixed(1)} s, max ${Math.max(...seconds).toFixed(1)} s`,
        );
        if (failed.length > 0) {
          const testFailed = failed.filter((result) => (result.tests?.failed ?? 0) > 0);
          const outside = failed.filter((result) => result.tests !== undefined && result.tests.failed === 0);
          console.log(
            `of the failed: ${testFailed.length} with a failed test, ${outside.length} with every test passed ` +
              `(setup or teardown failed), ${failed.length - testFailed.length - outside.length} without a test summary`,
          );
        }
        process.exitCode = failed.length > 0 ? 1 : 0;
      },
    );
}

if (import.meta.main) {
  await buildProgram().parseAsync(process.argv);
}
