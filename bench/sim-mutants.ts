import { spawn, spawnSync } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { codeVersion } from "../src/dev/code-version.ts";
import { applyMutant, MUTANTS, type Mutant } from "../src/dev/sim/mutants.ts";

/**
 * `npm run sim:mutants [-- --seconds 45 --minutes 2 --seed 7000 --only NAME --sim "--faults all --overlap"]`: does the simulator
 * find the holes we plant? Each mutant of src/dev/sim/mutants.ts is a source patch of a product
 * rule, applied to a temporary copy of the committed tree (`git archive HEAD`, with the working
 * tree's src/dev/sim/ over it: the simulator under test, never product code) and reverted after its
 * hunt; the checkout is never touched. `npm run sim` then runs seed after seed there (one process at
 * a time) until one fails or `--seconds` of wall time pass. The hunt's schedule (`--sim`, unless the
 * mutant names its own) draws every fault kind, the controller's overlap included, and lets faults
 * overlap: the default schedule of `npm run sim` draws one at a time. A failing seed counts only if the same
 * seed passes on the unpatched copy (otherwise it is a hole of the product or the model, not the
 * mutant's: recorded, and the hunt goes on). Reports, per mutant, the seeds and the wall time it
 * took, and the guarantee that broke (bench/results/sim-mutants.json).
 */

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "45" },
    minutes: { type: "string", default: "2" },
    seed: { type: "string", default: "7000" },
    only: { type: "string" },
    out: { type: "string", default: "bench/results/sim-mutants.json" },
    /** The hunt's schedule, for mutants that name none: every fault kind, faults overlapping. */
    sim: { type: "string", default: "--faults all --overlap" },
  },
});
const huntArgs = (values.sim as string).split(" ").filter((arg) => arg !== "");
const budgetMs = Number(values.seconds) * 1000;
const root = resolve(".");
const node = join(root, "node_modules/.bin/node");
const head = codeVersion().commit.slice(0, 7);

interface Verdict {
  readonly seed: number;
  readonly violations: string[];
}

/** Runs `npm run sim` in `dir` from `first` until a seed fails or `deadline`; seeds run and the failure. */
async function runSeeds(
  dir: string,
  first: number,
  count: number,
  deadline: number,
  sim: readonly string[],
): Promise<{ seeds: number; failure?: Verdict }> {
  const out = join(dir, "results");
  const child = spawn(
    node,
    [
      "src/dev/sim/cli.ts",
      "--seeds",
      String(count),
      "--seed",
      String(first),
      "--minutes",
      String(values.minutes),
      "--out",
      out,
      ...sim,
    ],
    { cwd: dir, stdio: ["ignore", "pipe", "inherit"] },
  );
  let seeds = 0;
  let failure: Verdict | undefined;
  let collecting = false;
  let pending = "";
  const timer = setTimeout(() => child.kill("SIGTERM"), Math.max(0, deadline - Date.now()));
  await new Promise<void>((done) => {
    child.stdout.on("data", (chunk: Buffer) => {
      pending += chunk.toString();
      const lines = pending.split("\n");
      pending = lines.pop() ?? "";
      for (const line of lines) {
        const verdict = /^seed (\d+): (\S+)/.exec(line);
        if (verdict) {
          seeds++;
          if (failure === undefined && verdict[2] === "INVALID,") {
            failure = { seed: Number(verdict[1]), violations: [] };
            collecting = true;
          }
        } else if (collecting && failure) {
          if (line.startsWith("  (")) failure.violations.push(line.trim());
          else if (line.startsWith("  replay:")) {
            collecting = false;
            child.kill("SIGTERM");
          }
        }
      }
    });
    child.on("exit", () => done());
  });
  clearTimeout(timer);
  return { seeds, failure };
}

/** The guarantee a violation names: the checker's letter or code before the first colon. */
function guaranteeOf(violation: string): string {
  return /^\(([^)]+)\)/.exec(violation)?.[1] ?? violation.slice(0, 40);
}

async function hunt(dir: string, mutant: Mutant) {
  const originals = new Map<string, string>();
  const read = (file: string) => {
    const text = readFileSync(join(dir, file), "utf8");
    if (!originals.has(file)) originals.set(file, text);
    return text;
  };
  const write = (file: string, text: string) => writeFileSync(join(dir, file), text);
  const restore = () => {
    for (const [file, text] of originals) writeFileSync(join(dir, file), text);
  };
  const missing = applyMutant(mutant, read, write);
  if (missing.length > 0) {
    restore();
    return { mutant: mutant.name, hole: mutant.hole, applied: false, missing, found: false };
  }
  const started = Date.now();
  const deadline = started + budgetMs;
  let next = Number(values.seed);
  let seedsRun = 0;
  const failingUnpatched: Verdict[] = [];
  let found: (Verdict & { wallMs: number }) | undefined;
  try {
    while (found === undefined && Date.now() < deadline) {
      const run = await runSeeds(dir, next, 100_000, deadline, mutant.sim ?? huntArgs);
      seedsRun += run.seeds;
      if (run.failure === undefined) break;
      const wallMs = Date.now() - started;
      next = run.failure.seed + 1;
      // The same seed on the unpatched tree: only a mutant's own failure counts.
      restore();
      const baseline = await runSeeds(dir, run.failure.seed, 1, Date.now() + 120_000, mutant.sim ?? huntArgs);
      applyMutant(mutant, read, write);
      if (baseline.failure === undefined && baseline.seeds === 1) found = { ...run.failure, wallMs };
      else failingUnpatched.push(baseline.failure ?? run.failure);
    }
  } finally {
    restore();
  }
  const wallSecondsSpent = (Date.now() - started) / 1000;
  return {
    mutant: mutant.name,
    hole: mutant.hole,
    expected: mutant.expect,
    sim: (mutant.sim ?? huntArgs).join(" "),
    applied: true,
    found: found !== undefined,
    seedsRun,
    firstSeed: Number(values.seed),
    failingSeed: found?.seed,
    guarantee: found === undefined ? undefined : [...new Set(found.violations.map(guaranteeOf))].join(", "),
    violations: found?.violations,
    wallSecondsToFind: found === undefined ? undefined : found.wallMs / 1000,
    wallSecondsSpent,
    failingUnpatched: failingUnpatched.length > 0 ? failingUnpatched : undefined,
    replay:
      found === undefined
        ? undefined
        : `npm run sim -- --seed ${found.seed} --seeds 1 --minutes ${values.minutes}${(mutant.sim ?? huntArgs).map((arg) => ` ${arg}`).join("")} (with the patch applied: npm run sim:mutants -- --only ${mutant.name} --seed ${found.seed})`,
  };
}

const selected = MUTANTS.filter((m) => values.only === undefined || values.only.split(",").includes(m.name));
const dir = mkdtempSync(join(tmpdir(), "shardguard-mutants-"));
const results = [];
const started = Date.now();
try {
  const archive = spawnSync("sh", ["-c", `git archive HEAD | tar -x -C ${JSON.stringify(dir)}`], {
    cwd: root,
  });
  if (archive.status !== 0) throw new Error(`git archive failed: ${archive.stderr}`);
  // The simulator under test is the working tree's (it is not product code).
  cpSync(join(root, "src/dev/sim"), join(dir, "src/dev/sim"), { recursive: true });
  symlinkSync(join(root, "node_modules"), join(dir, "node_modules"));
  mkdirSync(join(dir, "results"));
  console.log(
    `${selected.length} mutants on ${head}, seeds from ${values.seed}, ${values.minutes} simulated minutes each, ${values.seconds} s of wall time per mutant at most (load ${(loadavg()[0] ?? 0).toFixed(1)})`,
  );
  for (const [index, mutant] of selected.entries()) {
    process.stdout.write(`[${index + 1}/${selected.length}] ${mutant.name}: `);
    const result = await hunt(dir, mutant);
    console.log(
      !result.applied
        ? `patch no longer applies (${result.missing?.join("; ")})`
        : result.found
          ? `FOUND by seed ${result.failingSeed} after ${result.seedsRun} seeds, ${result.wallSecondsToFind?.toFixed(0)} s: ${result.violations?.join(" | ").slice(0, 300)}`
          : `not found in ${result.seedsRun} seeds, ${result.wallSecondsSpent?.toFixed(0)} s`,
    );
    if (result.failingUnpatched)
      console.log(
        `  seeds failing without the patch too: ${result.failingUnpatched.map((v) => v.seed).join(", ")}`,
      );
    results.push(result);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const wallSeconds = (Date.now() - started) / 1000;
const found = results.filter((r) => r.found).length;
if (values.only === undefined || values.out !== "bench/results/sim-mutants.json")
  writeFileSync(
    values.out as string,
    `${JSON.stringify(
      {
        command: `npm run sim:mutants -- --seconds ${values.seconds} --minutes ${values.minutes} --seed ${values.seed}${values.only ? ` --only ${values.only}` : ""} --sim "${values.sim}"`,
        commit: head,
        load: loadavg()[0],
        found,
        mutants: results.length,
        wallSeconds,
        results,
      },
      null,
      2,
    )}\n`,
  );
console.log(`${found} of ${results.length} mutants found in ${wallSeconds.toFixed(0)} s; ${values.out}`);
