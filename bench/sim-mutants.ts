import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";

/**
 * `npm run sim:mutants [-- --seconds 240 --minutes 5]`: does the simulator find holes that were
 * found and fixed before? Each mutant is a source patch (a search and its replacement) applied to a
 * temporary copy of the committed tree (`git archive HEAD`); `npm run sim` then runs seed after seed
 * there until one fails or `--seconds` of wall time pass. Reports, per mutant, the seeds and the wall
 * time it took (bench/results/sim-mutants.json). A patch that no longer applies is reported, not
 * skipped silently.
 */

interface Mutant {
  readonly name: string;
  /** The hole it reopens, and where it was found first. */
  readonly hole: string;
  readonly file: string;
  readonly search: string;
  readonly replace: string;
}

const MUTANTS: readonly Mutant[] = [
  {
    name: "no-promotion-window",
    hole: "a promoted node takes writes at once, while the old primary's guard may still count it (finding 5 of issue 30: the promotion fence window)",
    file: "src/core/write-guard.ts",
    search: "if (input.promotionWindowOpen) {",
    replace: "if (false && input.promotionWindowOpen) {",
  },
  {
    name: "unconfirmed-primary-open",
    hole: "a primary the topology no longer confirms keeps taking writes (the fence on an unconfirmed primary; a returning old primary)",
    file: "src/core/write-guard.ts",
    search: "if (input.confirmed === false) {",
    replace: "if (false && input.confirmed === false) {",
  },
  {
    name: "guard-one-replica",
    hole: "the write guard demands one acknowledging replica instead of every member of the replica set (docs/agent.md#the-replica-set-guard)",
    file: "src/core/write-guard.ts",
    search: "minReplicas: demanded + outsiders,",
    replace: "minReplicas: Math.min(1, demanded + outsiders),",
  },
];

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "240" },
    minutes: { type: "string", default: "5" },
    seed: { type: "string", default: "7000" },
    only: { type: "string" },
    out: { type: "string", default: "bench/results/sim-mutants.json" },
  },
});
const budgetMs = Number(values.seconds) * 1000;
const root = resolve(".");
const head = spawnSync("git", ["rev-parse", "--short", "HEAD"], { encoding: "utf8" }).stdout.trim();

async function hunt(mutant: Mutant) {
  const dir = mkdtempSync(join(tmpdir(), `shardguard-mutant-${mutant.name}-`));
  try {
    const archive = spawnSync("sh", ["-c", `git archive HEAD | tar -x -C ${JSON.stringify(dir)}`], {
      cwd: root,
    });
    if (archive.status !== 0) throw new Error(`git archive failed: ${archive.stderr}`);
    symlinkSync(join(root, "node_modules"), join(dir, "node_modules"));
    const path = join(dir, mutant.file);
    const source = readFileSync(path, "utf8");
    if (!source.includes(mutant.search)) return { mutant: mutant.name, applied: false, found: false };
    writeFileSync(path, source.replace(mutant.search, mutant.replace));
    const out = join(dir, "results");
    mkdirSync(out);
    const started = Date.now();
    const child = spawn(
      join(root, "node_modules/.bin/node"),
      [
        "src/dev/sim/cli.ts",
        "--seeds",
        "1000",
        "--seed",
        String(values.seed),
        "--minutes",
        String(values.minutes),
        "--out",
        out,
      ],
      { cwd: dir, stdio: ["ignore", "pipe", "inherit"] },
    );
    let seeds = 0;
    let failure: { seed: number; violation: string; wallMs: number } | undefined;
    let pending = "";
    const timer = setTimeout(() => child.kill("SIGTERM"), budgetMs);
    await new Promise<void>((done) => {
      child.stdout.on("data", (chunk: Buffer) => {
        pending += chunk.toString();
        const lines = pending.split("\n");
        pending = lines.pop() ?? "";
        for (const line of lines) {
          const verdict = /^seed (\d+): (\S+)/.exec(line);
          if (verdict) {
            seeds++;
            if (verdict[2] === "INVALID,")
              failure ??= { seed: Number(verdict[1]), violation: "", wallMs: Date.now() - started };
          } else if (failure && failure.violation === "" && line.startsWith("  (")) {
            failure.violation = line.trim();
            child.kill("SIGTERM");
          }
        }
      });
      child.on("exit", () => done());
    });
    clearTimeout(timer);
    return {
      mutant: mutant.name,
      hole: mutant.hole,
      applied: true,
      found: failure !== undefined,
      seedsRun: seeds,
      firstFailingSeed: failure?.seed,
      violation: failure?.violation,
      wallSecondsToFind: failure === undefined ? undefined : failure.wallMs / 1000,
      wallSecondsSpent: (Date.now() - started) / 1000,
      replay:
        failure === undefined
          ? undefined
          : `npm run sim -- --seed ${failure.seed} --seeds 1 --minutes ${values.minutes} (with the patch applied)`,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const results = [];
for (const mutant of MUTANTS.filter((m) => values.only === undefined || m.name === values.only)) {
  const result = await hunt(mutant);
  console.log(
    `${mutant.name}: ${!result.applied ? "patch no longer applies" : result.found ? `found by seed ${result.firstFailingSeed} after ${result.seedsRun} seeds, ${result.wallSecondsToFind?.toFixed(0)} s: ${result.violation}` : `not found in ${result.seedsRun} seeds, ${result.wallSecondsSpent?.toFixed(0)} s`}`,
  );
  results.push(result);
}
writeFileSync(
  values.out as string,
  `${JSON.stringify({ command: `npm run sim:mutants -- --seconds ${values.seconds} --minutes ${values.minutes} --seed ${values.seed}`, commit: head, results }, null, 2)}\n`,
);
console.log(values.out);
