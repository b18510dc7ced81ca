import { execFile, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { ShardguardError } from "../../core/errors.ts";
import { type Command, type LabSubnet, LINK_PREFIX, NAMESPACE_PREFIX } from "./plan.ts";

/**
 * What a lab leaves on the host and how it is taken back: one record file per lab (written before
 * anything is created, removed after everything is deleted), the sweep of dead labs' leftovers,
 * and the exit hooks that close live labs when the process ends.
 */

/** Where lab records live: /run is a tmpfs, emptied at boot like the namespaces it describes. */
export const STATE_DIR = "/run/shardguard-netlab";
/** The namespace `NetLab.available()` creates and deletes; the pid says whose it is. */
export const PROBE_PREFIX = "sgnlprobe-";

/** A command of the lab failed; carries the command line and what the tool said. */
export class NetLabError extends ShardguardError {
  override name = "NetLabError";
}

/** Everything a lab may have created, so that anyone can delete it once its owner is gone. */
export interface LabRecord {
  readonly id: string;
  /** The process that owns the lab, and its start time (a reused pid is not the owner). */
  readonly pid: number;
  readonly pidStart: string;
  readonly subnet: LabSubnet;
  readonly bridge: string;
  readonly namespaces: readonly string[];
  readonly links: readonly string[];
}

function commandLine(command: Command): string {
  return [command.tool, ...command.args].join(" ");
}

/** Runs one command; rejects with a NetLabError naming it and its stderr. */
export function run(command: Command): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(command.tool, command.args, { timeout: 10_000 }, (error, _stdout, stderr) => {
      if (error)
        reject(new NetLabError(`${commandLine(command)} failed: ${String(stderr).trim() || error.message}`));
      else resolve();
    });
  });
}

/** Runs one command to completion, blocking: for exit hooks and the sweep, where nothing may wait. */
export function runSync(command: Command): { ok: boolean; output: string } {
  const result = spawnSync(command.tool, command.args, { encoding: "utf8", timeout: 10_000 });
  return { ok: !result.error && result.status === 0, output: `${result.stdout ?? ""}${result.stderr ?? ""}` };
}

/** The start time of `pid` from /proc (field 22 of its stat), or undefined when it is not running. */
export function processStart(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: count fields after the last ")".
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  } catch {
    return undefined;
  }
}

function ownerAlive(record: Pick<LabRecord, "pid" | "pidStart">): boolean {
  return processStart(record.pid) === record.pidStart;
}

/**
 * Writes (or replaces) a lab's record atomically: a sweep in another process that read half a
 * file would skip the record and take the live lab's names for a dead lab's.
 */
export function writeRecord(record: LabRecord): void {
  mkdirSync(STATE_DIR, { recursive: true });
  const path = join(STATE_DIR, `${record.id}.json`);
  const partial = `${path}.${process.pid}.partial`;
  writeFileSync(partial, `${JSON.stringify(record)}\n`);
  renameSync(partial, path);
}

export function removeRecord(id: string): void {
  rmSync(join(STATE_DIR, `${id}.json`), { force: true });
}

/** Every readable lab record; an unreadable file (cut by a crash mid-write) is skipped. */
export function readRecords(): LabRecord[] {
  if (!existsSync(STATE_DIR)) return [];
  const records: LabRecord[] = [];
  for (const entry of readdirSync(STATE_DIR)) {
    if (!entry.endsWith(".json")) continue;
    try {
      records.push(JSON.parse(readFileSync(join(STATE_DIR, entry), "utf8")) as LabRecord);
    } catch {
      // Records are renamed into place whole; an unreadable one names nothing reliable, and its
      // leftovers match the prefixes below.
    }
  }
  return records;
}

/** Names of the host's network namespaces. */
export function listNamespaces(): string[] {
  const result = runSync({ tool: "ip", args: ["netns", "list"] });
  if (!result.ok) return [];
  return result.output
    .split("\n")
    .map((line) => line.split(" ")[0] ?? "")
    .filter((name) => name !== "");
}

/** Names of the host namespace's links. */
export function listLinks(): string[] {
  const result = runSync({ tool: "ip", args: ["-o", "link", "show"] });
  if (!result.ok) return [];
  const names: string[] = [];
  for (const line of result.output.split("\n")) {
    const match = /^\d+:\s+([^:@\s]+)/.exec(line);
    if (match?.[1]) names.push(match[1]);
  }
  return names;
}

/**
 * Deletes a namespace of a lab that is gone: first kills, by pid, the processes still inside it
 * (a redis-server or agent of a crashed run; the namespace lives as long as they do), then its name.
 */
function destroyNamespace(name: string): void {
  const pids = runSync({ tool: "ip", args: ["netns", "pids", name] });
  if (pids.ok) {
    for (const pid of pids.output.split(/\s+/).filter(Boolean).map(Number)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // Exited on its own meanwhile.
      }
    }
  }
  runSync({ tool: "ip", args: ["netns", "del", name] });
}

/** Deletes everything `record` names, then the record. */
function destroyRecord(record: LabRecord): void {
  for (const link of record.links) runSync({ tool: "ip", args: ["link", "del", link] });
  for (const namespace of record.namespaces) destroyNamespace(namespace);
  runSync({ tool: "ip", args: ["link", "del", record.bridge] });
  removeRecord(record.id);
}

const LAB_NAMESPACE = new RegExp(`^${NAMESPACE_PREFIX}([a-z0-9]{6})-`);
const LAB_LINK = new RegExp(`^${LINK_PREFIX}([a-z0-9]{6})(b|h\\d+)$`);
const PROBE_NAMESPACE = new RegExp(`^${PROBE_PREFIX}(\\d+)-(\\d+)$`);

/**
 * Removes what dead labs left: every recorded lab whose owner process is gone, and every
 * namespace or link carrying a lab's prefix that no record claims (a crash between a delete and
 * the record's removal). Names are listed before records are read: a lab writes its record before
 * it creates anything, so a name listed first is always claimed by a record read after.
 * Returns the ids of the labs swept.
 */
export function sweepDeadLabs(): string[] {
  const namespaces = listNamespaces();
  const links = listLinks();
  const records = readRecords();
  const claimed = new Set(records.map((record) => record.id));
  const swept = new Set<string>();
  for (const record of records) {
    if (ownerAlive(record)) continue;
    destroyRecord(record);
    swept.add(record.id);
  }
  for (const namespace of namespaces) {
    const lab = LAB_NAMESPACE.exec(namespace)?.[1];
    if (lab !== undefined && !claimed.has(lab)) {
      destroyNamespace(namespace);
      swept.add(lab);
    }
    const probe = PROBE_NAMESPACE.exec(namespace);
    if (probe && processStart(Number(probe[1])) !== probe[2]) destroyNamespace(namespace);
  }
  for (const entry of existsSync(STATE_DIR) ? readdirSync(STATE_DIR) : []) {
    const writer = /\.(\d+)\.partial$/.exec(entry)?.[1];
    if (writer && processStart(Number(writer)) === undefined) rmSync(join(STATE_DIR, entry), { force: true });
  }
  for (const link of links) {
    const lab = LAB_LINK.exec(link)?.[1];
    if (lab !== undefined && !claimed.has(lab)) {
      runSync({ tool: "ip", args: ["link", "del", link] });
      swept.add(lab);
    }
  }
  return [...swept];
}

/** Something that must be undone before the process ends. */
export interface SyncClosable {
  closeSync(): void;
}

const live = new Set<SyncClosable>();
let hooksInstalled = false;
const SIGNALS: readonly NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];

function closeAll(): void {
  for (const lab of live) {
    try {
      lab.closeSync();
    } catch {
      // Exiting: what is left is the next sweep's.
    }
  }
  live.clear();
}

function onSignal(signal: NodeJS.Signals): void {
  // Another listener owns this signal (a runner that heals and reads before it stops): leave the
  // labs to its stop, or to the exit hook.
  if (process.listenerCount(signal) > 1) return;
  // Alone, our listener replaced the default (exit): close, restore the default and die of the
  // signal, as the process would have without the lab.
  closeAll();
  process.removeListener(signal, onSignal);
  process.kill(process.pid, signal);
}

/**
 * Closes `lab` on exit (an uncaught error included) and on SIGINT/SIGTERM/SIGHUP when nothing else
 * listens for the signal, unless `forget` comes first.
 */
export function closeOnExit(lab: SyncClosable): void {
  live.add(lab);
  if (hooksInstalled) return;
  hooksInstalled = true;
  process.on("exit", closeAll);
  for (const signal of SIGNALS) process.on(signal, onSignal);
}

export function forget(lab: SyncClosable): void {
  live.delete(lab);
}
