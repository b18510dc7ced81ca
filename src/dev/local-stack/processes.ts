import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { createServer } from "node:net";
import { PrerequisiteError } from "../../core/errors.ts";

/**
 * Children this process started. They are killed by PID on normal exit, on SIGINT/SIGTERM
 * and on an uncaught error, so no java or redis-server outlives the stack that started it.
 */
const children = new Set<ChildProcess>();
let hooksInstalled = false;

function killAll(signal: NodeJS.Signals = "SIGKILL"): void {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
  }
  children.clear();
}

function installExitHooks(): void {
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on("exit", () => killAll());
}

export interface ManagedProcess {
  readonly name: string;
  readonly child: ChildProcess;
  /** Recent stderr/stdout, for error messages when the process dies early. */
  output(): string;
  /** Stops the process and waits for it to exit (SIGTERM, then SIGKILL after `graceMs`). */
  stop(graceMs?: number): Promise<void>;
}

export function startProcess(
  name: string,
  command: string,
  args: readonly string[],
  options: { cwd?: string; env?: NodeJS.ProcessEnv } = {},
): ManagedProcess {
  installExitHooks();
  const child = spawn(command, args, {
    cwd: options.cwd,
    env: options.env ?? process.env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.add(child);
  let buffer = "";
  const collect = (chunk: Buffer) => {
    buffer = (buffer + chunk.toString()).slice(-4000);
  };
  child.stdout?.on("data", collect);
  child.stderr?.on("data", collect);
  child.on("error", (error) => {
    buffer += `\n${error.message}`;
  });
  const exited = new Promise<void>((resolve) => {
    if (child.exitCode !== null) resolve();
    child.once("exit", () => {
      children.delete(child);
      resolve();
    });
  });
  return {
    name,
    child,
    output: () => buffer,
    async stop(graceMs = 3000) {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** Resolves when the process exits; used to fail fast instead of waiting for a dead server. */
export function exitOf(proc: ManagedProcess): Promise<number | null> {
  const { child } = proc;
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once("exit", (code) => resolve(code)));
}

/** A port on 127.0.0.1 that was free a moment ago. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => {
        if (address && typeof address === "object") resolve(address.port);
        else reject(new Error("could not allocate a port"));
      });
    });
  });
}

/** Fails within seconds, with what to install, when `command` is not on PATH. */
export function requireCommand(command: string, versionArgs: readonly string[], install: string): string {
  const result = spawnSync(command, versionArgs, { encoding: "utf8", timeout: 10_000 });
  if (result.error || result.status !== 0) {
    throw new PrerequisiteError(`${command} not found or not working: ${install}`);
  }
  return `${result.stdout}${result.stderr}`;
}

/**
 * Polls `probe` until it succeeds, the process exits, or `timeoutMs` passes; each failure is
 * a one-line error naming the service, never a hang.
 */
export async function waitUntilReady(
  proc: ManagedProcess,
  probe: () => Promise<unknown>,
  timeoutMs: number,
  hint: string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let exited = false;
  void exitOf(proc).then(() => {
    exited = true;
  });
  let lastError: unknown;
  while (Date.now() < deadline) {
    if (exited) {
      const tail = proc.output().trim().split("\n").slice(-3).join(" | ");
      throw new PrerequisiteError(`${proc.name} exited before it was ready (${hint}): ${tail}`);
    }
    try {
      // A port held by something else may accept and never answer: bound every attempt.
      await withTimeout(probe(), 2000, `${proc.name} did not answer a request within 2 s`);
      return;
    } catch (error) {
      lastError = error;
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await proc.stop(500);
  const reason = lastError instanceof Error ? lastError.message : String(lastError);
  throw new PrerequisiteError(
    `${proc.name} did not answer within ${Math.round(timeoutMs / 1000)} s (${hint}); last error: ${reason}`,
  );
}

function withTimeout<T>(promise: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/**
 * The message when an emulator package of the local stack is missing: they are development
 * dependencies, absent from an install with --omit=dev (an agent node's).
 */
export function devDependencyMissing(pkg: string, what: string): string {
  return (
    `the ${pkg} package (${what}) is not installed: the local stack needs shardguard's development ` +
    "dependencies; install dev dependencies (npm ci in a checkout, or npm install without --omit=dev)"
  );
}
