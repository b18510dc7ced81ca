import { appendFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

/**
 * The nemesis history: one JSON object per line, in the order things happened, written by every
 * actor of a run (the writer, the two-writable sampler, the topology observer, the nemesis itself)
 * on one monotonic clock. It is the checker's only input besides the final reads.
 *
 * Jepsen's op model: an `invoke` is followed by one completion of the same `process`: `ok` (it took
 * effect), `fail` (it certainly did not: READONLY, NOREPLICAS, refused before sending) or `info`
 * (indeterminate: a timeout or a reset after sending; it may have applied). Events that are not
 * requests (a sample, an epoch change, a fault) are recorded as a single `ok` or `info`.
 */
export type OpType = "invoke" | "ok" | "fail" | "info";

/** Who recorded an op. `writer` writes, `sampler` probes, `observer` watches the topology. */
export type OpProcess = "writer" | "sampler" | "observer" | "nemesis" | "final";

export interface Op {
  /** Position in the history, from 0. */
  readonly index: number;
  /** Monotonic ms since the run started. */
  readonly t: number;
  readonly process: OpProcess;
  readonly type: OpType;
  /** `write`, `probe`, `epoch`, `inject`, `heal`, `read`. */
  readonly f: string;
  readonly value?: unknown;
  /** The node the op was aimed at or concerns, when one. */
  readonly node?: string;
}

/** `value` of a writer op: `seq` always; `replicas` (WAIT's answer) on ok; `error` on fail/info. */
export interface WriteValue {
  readonly seq: number;
  readonly replicas?: number;
  readonly error?: string;
  /** Written by the stray writer to a node other than the advertised primary that answered master. */
  readonly stray?: boolean;
}

/** `value` of a sampler probe: which nodes accepted a write to the probe key, and which refused. */
export interface ProbeValue {
  readonly writable: readonly string[];
  readonly refused: readonly string[];
  readonly unreachable: readonly string[];
}

/** `value` of an observer epoch op: the topology as read. */
export interface EpochValue {
  readonly epoch: number;
  readonly primary?: string;
  readonly status?: string;
  readonly previousEpoch?: number;
  readonly previousPrimary?: string;
  /**
   * The topology's cool-down still to run when read (\`cooldown_until\` less the reader's clock, in
   * ms after this op): no automatic change of primary until it ends, so a fault healed meanwhile
   * causes a change made when it ends (checker rule e).
   */
  readonly cooldownForMs?: number;
}

/** \`EpochValue.cooldownForMs\` from a topology's \`cooldown_until\` (ms) read at \`now\` (ms). */
export function cooldownFor(cooldownUntil: number | undefined, now: number): { cooldownForMs?: number } {
  return cooldownUntil !== undefined && cooldownUntil > now ? { cooldownForMs: cooldownUntil - now } : {};
}

/** `value` of a nemesis inject/heal op. `id` pairs an inject with its heal. */
export interface FaultValue {
  readonly id: number;
  readonly kind: string;
  readonly target: string;
  readonly nodes: readonly string[];
  readonly params?: Readonly<Record<string, unknown>>;
  readonly note?: string;
}

export type OpInput = Omit<Op, "index" | "t"> & { t?: number };

/** An append-only history, kept in memory and, when given a path, mirrored line by line to a JSONL file. */
export class History {
  readonly #ops: Op[] = [];
  readonly #start: number;
  readonly #now: () => number;
  readonly #path: string | undefined;

  constructor(options: { path?: string; now?: () => number } = {}) {
    this.#now = options.now ?? (() => performance.now());
    this.#start = this.#now();
    this.#path = options.path;
    if (this.#path) {
      mkdirSync(dirname(this.#path), { recursive: true });
      writeFileSync(this.#path, "");
    }
  }

  /** Ms since the history began, on the monotonic clock. */
  elapsed(): number {
    return this.#now() - this.#start;
  }

  append(input: OpInput): Op {
    const op: Op = {
      index: this.#ops.length,
      t: Math.round((input.t ?? this.elapsed()) * 10) / 10,
      process: input.process,
      type: input.type,
      f: input.f,
      ...(input.value !== undefined ? { value: input.value } : {}),
      ...(input.node !== undefined ? { node: input.node } : {}),
    };
    this.#ops.push(op);
    if (this.#path) appendFileSync(this.#path, `${JSON.stringify(op)}\n`);
    return op;
  }

  get ops(): readonly Op[] {
    return this.#ops;
  }
}

export function parseHistory(text: string): Op[] {
  return text
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => JSON.parse(line) as Op);
}

export function readHistory(path: string): Op[] {
  return parseHistory(readFileSync(path, "utf8"));
}
