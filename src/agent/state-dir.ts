import { randomBytes } from "node:crypto";
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";
import { z } from "zod";
import { jsonSyntaxProblem } from "../adapters/settings.ts";
import { describeIssues } from "../core/config.ts";
import { ConfigurationError, errorMessage } from "../core/errors.ts";
import { idSchema } from "../core/model.ts";

/** How many applied command ids are remembered; older duplicates are still caught by their epoch. */
export const APPLIED_IDS_LIMIT = 1000;

const STATE_FILE = "state.json";
const LOCK_FILE = "agent.lock";

/** The write block the agent put on its database, with what to restore when it lifts it. */
export const fenceRecordSchema = z.object({
  /** CONFIG values before the agent changed them. */
  saved: z.record(z.string(), z.string()).default({}),
  since: z.number().int(),
});
export type FenceRecord = z.output<typeof fenceRecordSchema>;

export const agentStateSchema = z.object({
  version: z.literal(1),
  shard: idSchema,
  node_id: idSchema,
  /** ms when this node id was first assigned. */
  created_at: z.number().int(),
  /** Highest command epoch applied (or adopted from the topology when the agent fenced itself). */
  highest_epoch: z.number().int().nonnegative().default(0),
  /** Epoch of the PROMOTE that made this node primary; undefined when it never was promoted by command. */
  promoted_epoch: z.number().int().nonnegative().optional(),
  /** Ids of applied commands, oldest first, at most APPLIED_IDS_LIMIT. */
  applied_command_ids: z.array(z.string()).default([]),
  /**
   * Present while the replica is parked (src/agent/primary-probe.ts): the address it was parked
   * from and the topology epoch then. An agent restarted meanwhile keeps the park as it was
   * (\`staysParked\`) and probes that address again. Nemesis seed 6601 (guarantee 1): two replicas
   * parked from their primary, which restarted from an older RDB; their agents, restarted later,
   * forgot the park and followed it, and the full syncs wiped the last copies of 128 writes.
   */
  parked: z.object({ from: z.string().min(1), at_epoch: z.number().int().nonnegative() }).optional(),
  /** Present while the agent holds its database's writes blocked (survives an agent restart). */
  fence: fenceRecordSchema.optional(),
  /**
   * The database process last seen (run_id, lineage and the one it continues, offset, role,
   * replicas attached), so that an agent restarted together with its database still judges the
   * new process (`judgeRestart`).
   * The offset is written when the identity changes and at most every few seconds otherwise.
   */
  db_identity: z
    .object({
      run_id: z.string(),
      repl_id: z.string(),
      offset: z.number().int().nonnegative(),
      role: z.enum(["primary", "replica"]),
      synced: z.number().int().nonnegative(),
      /** The earlier lineage it continues (`master_replid2`, up to `second_repl_offset` - 1). */
      prior: z.object({ repl_id: z.string(), offset: z.number().int().nonnegative() }).optional(),
    })
    .optional(),
  /** The database restarted without its data while primary: fenced until it follows a primary. */
  db_restarted: z.boolean().optional(),
});
export type AgentState = z.output<typeof agentStateSchema>;

export interface OpenStateDirOptions {
  readonly shard: string;
  /** The operator's `--node-id`; must match a stored one. */
  readonly nodeId?: string | undefined;
  /** ms, for `created_at`. */
  readonly now: number;
}

/** A node id for a node that was given none: short enough for queue names (see ID_PATTERN). */
export function generateNodeId(): string {
  return `node-${randomBytes(5).toString("hex")}`;
}

function isProcessAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    // EPERM: the process exists but belongs to someone else.
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
  // A killed agent that its parent has not reaped yet still answers kill(0): a zombie holds no lock.
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return true;
  }
}

/**
 * The agent's durable memory: the node id (assigned when the node first started, kept through
 * restarts), the highest applied epoch, recently applied command ids and an active write
 * fence. Written atomically (temporary file, fsync, rename, fsync of the directory) so a crash
 * leaves either the old or the new state, never half of one. A lock file keeps two agents from
 * sharing one node identity.
 */
export class StateDir {
  readonly dir: string;
  private current: AgentState;
  private released = false;

  private constructor(dir: string, state: AgentState) {
    this.dir = dir;
    this.current = state;
  }

  static open(dir: string, options: OpenStateDirOptions): StateDir {
    try {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
    } catch (error) {
      throw new ConfigurationError(`state dir ${dir} cannot be created: ${errorMessage(error)}`);
    }
    acquireLock(dir);
    try {
      const stored = readState(dir);
      let state: AgentState;
      if (stored) {
        if (options.nodeId !== undefined && options.nodeId !== stored.node_id) {
          throw new ConfigurationError(
            `--node-id ${options.nodeId} does not match node id ${stored.node_id} stored in ${join(dir, STATE_FILE)}; ` +
              "a node keeps its id for life: drop --node-id, or use a fresh --state-dir for a new node",
          );
        }
        if (stored.shard !== options.shard) {
          throw new ConfigurationError(
            `state dir ${dir} belongs to node ${stored.node_id} of shard ${stored.shard}, not shard ${options.shard}`,
          );
        }
        state = stored;
      } else {
        state = agentStateSchema.parse({
          version: 1,
          shard: options.shard,
          node_id: options.nodeId ?? generateNodeId(),
          created_at: options.now,
        });
      }
      const opened = new StateDir(dir, state);
      if (!stored) opened.write(state);
      return opened;
    } catch (error) {
      rmSync(join(dir, LOCK_FILE), { force: true });
      throw error;
    }
  }

  get state(): AgentState {
    return this.current;
  }

  get nodeId(): string {
    return this.current.node_id;
  }

  hasApplied(commandId: string): boolean {
    return this.current.applied_command_ids.includes(commandId);
  }

  /** Records an applied command: its id joins the bounded list and its epoch may raise the highest. */
  recordApplied(commandId: string, epoch: number, changes: Partial<AgentState> = {}): void {
    const ids = [...this.current.applied_command_ids.filter((id) => id !== commandId), commandId];
    this.update({
      ...changes,
      applied_command_ids: ids.slice(-APPLIED_IDS_LIMIT),
      highest_epoch: Math.max(this.current.highest_epoch, epoch),
    });
  }

  /** Applies `changes` and persists the result before returning. */
  update(changes: Partial<AgentState>): void {
    const next = agentStateSchema.parse({ ...this.current, ...changes });
    this.write(next);
    this.current = next;
  }

  /** Releases the lock; the state stays for the next start. Safe to call twice. */
  release(): void {
    if (this.released) return;
    this.released = true;
    rmSync(join(this.dir, LOCK_FILE), { force: true });
  }

  private write(state: AgentState): void {
    const target = join(this.dir, STATE_FILE);
    // A fresh name opened exclusively: never a file or symlink someone placed there (O_EXCL
    // refuses an existing path, a symlink included), never a predictable name to plant one at.
    const temporary = `${target}.${randomBytes(8).toString("hex")}.tmp`;
    const fd = openSync(temporary, "wx", 0o600);
    try {
      try {
        writeSync(fd, `${JSON.stringify(state, null, 2)}\n`);
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(temporary, target);
    } catch (error) {
      rmSync(temporary, { force: true });
      throw error;
    }
    // The rename is durable only once the directory entry is on disk.
    const dirFd = openSync(this.dir, "r");
    try {
      fsyncSync(dirFd);
    } finally {
      closeSync(dirFd);
    }
  }
}

function readState(dir: string): AgentState | undefined {
  const file = join(dir, STATE_FILE);
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new ConfigurationError(`state file ${file} cannot be read: ${errorMessage(error)}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    // Never replace a damaged identity silently: a new id would make this node a stranger to its shard.
    throw new ConfigurationError(
      `state file ${file} is not valid JSON (${jsonSyntaxProblem(error)}); repair or remove it`,
    );
  }
  const parsed = agentStateSchema.safeParse(json);
  if (!parsed.success) {
    throw new ConfigurationError(
      `state file ${file} is invalid: ${describeIssues(parsed.error)}; repair or remove it`,
    );
  }
  return parsed.data;
}

function acquireLock(dir: string): void {
  const file = join(dir, LOCK_FILE);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      writeFileSync(file, `${process.pid}\n`, { flag: "wx", mode: 0o600 });
      return;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") {
        throw new ConfigurationError(`state dir ${dir} cannot be locked: ${errorMessage(error)}`);
      }
    }
    const pid = Number.parseInt(readFileSync(file, "utf8"), 10);
    if (Number.isInteger(pid) && pid > 0 && isProcessAlive(pid)) {
      throw new ConfigurationError(
        `state dir ${dir} is in use by process ${pid} (${file}); two agents must not share a node identity`,
      );
    }
    // The agent that wrote it is gone: the lock is stale.
    rmSync(file, { force: true });
  }
  throw new ConfigurationError(`state dir ${dir} cannot be locked: ${file} keeps reappearing`);
}
