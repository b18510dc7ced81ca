import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";
import { Redis } from "ioredis";
import { tryParseAddress } from "../../core/address.ts";
import { errorMessage } from "../../core/errors.ts";
import { type Ack, AckLog, type VerifyResult, verifyAcks, waitForAck } from "./ack-log.ts";

export type { Ack, VerifyResult } from "./ack-log.ts";

/**
 * Why one step of the write loop failed. The first five are a SET that was sent and not
 * acknowledged (`unreplicated`: applied, but fewer replicas than `waitReplicas` confirmed it within
 * the command timeout); the rest happen before any SET is sent (finding or reaching the primary).
 */
export const WRITE_FAILURE_KINDS = [
  "readonly",
  "timeout",
  "connection",
  "error",
  "unreplicated",
  "no-primary",
  "resolve",
  "connect",
  "not-primary",
] as const;
export type WriteFailureKind = (typeof WRITE_FAILURE_KINDS)[number];

export interface WriteFailure {
  readonly kind: WriteFailureKind;
  /** The server the step was aimed at, when one was known. */
  readonly address: string | undefined;
  /** The sequence number of the SET that failed, for the first four kinds. */
  readonly seq: number | undefined;
  readonly message: string;
  readonly at: number;
}

export interface WriteWorkloadStats {
  readonly running: boolean;
  /** SET commands sent. */
  readonly attempts: number;
  /** SET commands a primary answered OK. */
  readonly acked: number;
  /** SET commands sent and not acknowledged (READONLY, timeout, closed connection, other error). */
  readonly failedWrites: number;
  /** Every failed step by kind, including those before a SET was sent. */
  readonly failures: Readonly<Record<WriteFailureKind, number>>;
  /** The sequence number the next SET will carry; acks so far all have a smaller one. */
  readonly nextSeq: number;
  /** The server the writer currently writes to, if connected. */
  readonly address: string | undefined;
  readonly lastAck: Ack | undefined;
}

export interface WriteWorkloadEvents {
  ack: [ack: Ack];
  failure: [failure: WriteFailure];
  /** The writer connected to a server it verified is a primary. */
  target: [target: { address: string; at: number }];
}

export interface WriteWorkloadOptions {
  /** Where the primary is now (host:port), as the system under test advertises it; undefined when none is. */
  readonly resolvePrimary: () => Promise<string | undefined>;
  /** Key prefix; one per workload so runs never read each other's keys. @default `sg:w:<random>:` */
  readonly keyPrefix?: string;
  /** Bound on one SET, and on connecting. @default 250 */
  readonly commandTimeoutMs?: number;
  /** Bound on one resolvePrimary call. @default 1000 */
  readonly resolveTimeoutMs?: number;
  /**
   * Replicas that must confirm each write (`WAIT n`, within the command timeout) before it counts
   * as acknowledged: 1 is the replica-acknowledged writes guarantee 1 covers. @default 0 (the OK alone)
   */
  readonly waitReplicas?: number;
  /** Pause after an acknowledged write, so the loop does not spin. @default 2 */
  readonly writeIntervalMs?: number;
  /** Pause after a failed step before re-resolving. @default 10 */
  readonly retryDelayMs?: number;
  /** Monotonic clock for every recorded instant. @default performance.now */
  readonly now?: () => number;
}

interface Connection {
  readonly address: string;
  readonly client: Redis;
}

/**
 * A continuous writer that measures a failover the way an application sees it: one `SET <prefix><seq>
 * <wall ms>` at a time to whatever the system under test says is the primary, each key written once,
 * so a lost acknowledged write is exactly a key missing from the final primary.
 *
 * A write counts as acknowledged only when the server replied OK. A replica answers READONLY
 * (counted as failed), and the writer checks `ROLE` is master whenever it connects, so an OK always
 * came from a server that was a primary. On any failure it drops the connection and re-resolves after
 * `retryDelayMs`; commands never queue or retry inside the client, so no write is acknowledged late.
 */
export class WriteWorkload extends EventEmitter<WriteWorkloadEvents> {
  readonly keyPrefix: string;
  readonly #resolvePrimary: () => Promise<string | undefined>;
  readonly #commandTimeoutMs: number;
  readonly #resolveTimeoutMs: number;
  readonly #writeIntervalMs: number;
  readonly #waitReplicas: number;
  readonly #retryDelayMs: number;
  readonly #now: () => number;
  readonly #log = new AckLog();
  readonly #failures = Object.fromEntries(WRITE_FAILURE_KINDS.map((kind) => [kind, 0])) as Record<
    WriteFailureKind,
    number
  >;
  #connection: Connection | undefined;
  #nextSeq = 1;
  #attempts = 0;
  #failedWrites = 0;
  #abort: AbortController | undefined;
  #loop: Promise<void> | undefined;

  constructor(options: WriteWorkloadOptions) {
    super();
    this.#resolvePrimary = options.resolvePrimary;
    this.keyPrefix = options.keyPrefix ?? `sg:w:${randomUUID().slice(0, 8)}:`;
    this.#commandTimeoutMs = options.commandTimeoutMs ?? 250;
    this.#resolveTimeoutMs = options.resolveTimeoutMs ?? 1000;
    this.#writeIntervalMs = options.writeIntervalMs ?? 2;
    this.#waitReplicas = options.waitReplicas ?? 0;
    this.#retryDelayMs = options.retryDelayMs ?? 10;
    this.#now = options.now ?? (() => performance.now());
  }

  keyOf(seq: number): string {
    return `${this.keyPrefix}${seq}`;
  }

  /** Starts the write loop; a second call while running does nothing. */
  start(): void {
    if (this.#loop) return;
    const abort = new AbortController();
    this.#abort = abort;
    this.#loop = this.#run(abort.signal);
  }

  /** Stops after the write in flight settles and closes the connection. */
  async stop(): Promise<void> {
    this.#abort?.abort();
    await this.#loop;
    this.#loop = undefined;
    this.#abort = undefined;
    this.#dropConnection();
  }

  stats(): WriteWorkloadStats {
    return {
      running: this.#loop !== undefined,
      attempts: this.#attempts,
      acked: this.#log.size,
      failedWrites: this.#failedWrites,
      failures: { ...this.#failures },
      nextSeq: this.#nextSeq,
      address: this.#connection?.address,
      lastAck: this.#log.last(),
    };
  }

  /** The first write acknowledged strictly after `instant` by a server other than `notAddress`. */
  firstAckAfter(instant: number, notAddress?: string): Ack | undefined {
    return this.#log.firstAfter(instant, notAddress);
  }

  /** The last write acknowledged at or before `instant` (e.g. the last one before a kill). */
  lastAckAtOrBefore(instant: number): Ack | undefined {
    return this.#log.lastAtOrBefore(instant);
  }

  /** Acknowledged writes with `fromSeq <= seq < toSeq`. */
  acks(fromSeq = 0, toSeq?: number): Ack[] {
    return this.#log.bySeqRange(fromSeq, toSeq);
  }

  /** Resolves with `firstAckAfter(instant, notAddress)` as soon as there is one, or undefined after `timeoutMs`. */
  waitForAckAfter(
    instant: number,
    notAddress: string | undefined,
    timeoutMs: number,
  ): Promise<Ack | undefined> {
    return waitForAck(this.#log, this, instant, notAddress, timeoutMs);
  }

  /**
   * Looks up every acknowledged write (or those with `fromSeq <= seq < toSeq`) on `client`, normally
   * the final primary, and reports the ones it does not hold: acknowledged writes lost.
   */
  verify(client: Redis, range: { fromSeq?: number; toSeq?: number } = {}): Promise<VerifyResult> {
    const acks = this.#log.bySeqRange(range.fromSeq ?? 0, range.toSeq);
    return verifyAcks(
      acks,
      (seq) => this.keyOf(seq),
      (keys) => client.mget(keys),
    );
  }

  async #run(signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      const acked = await this.#step();
      try {
        await sleep(acked ? this.#writeIntervalMs : this.#retryDelayMs, undefined, { signal });
      } catch {
        // Aborted by stop(): the loop condition ends it.
      }
    }
  }

  /** One write, connecting to the resolved primary first when needed; true when it was acknowledged. */
  async #step(): Promise<boolean> {
    const connection = this.#connection ?? (await this.#connect());
    if (!connection) return false;
    const seq = this.#nextSeq++;
    this.#attempts += 1;
    try {
      const reply = await connection.client.set(this.keyOf(seq), String(Date.now()));
      if (reply !== "OK") throw new Error(`unexpected reply ${String(reply)}`);
      if (this.#waitReplicas > 0) {
        const replicas = Number(
          // Within the client's own timeout, so that a slow WAIT answers rather than times out.
          await connection.client.call(
            "WAIT",
            String(this.#waitReplicas),
            String(Math.max(1, Math.floor(this.#commandTimeoutMs * 0.8))),
          ),
        );
        if (replicas < this.#waitReplicas) {
          // Applied on the primary alone: not acknowledged. The connection stays (nothing failed).
          this.#failedWrites += 1;
          this.#fail(
            "unreplicated",
            connection.address,
            `WAIT ${this.#waitReplicas} answered ${replicas}`,
            seq,
          );
          return false;
        }
      }
      const ack = { seq, at: this.#now(), address: connection.address };
      this.#log.add(ack);
      this.emit("ack", ack);
      return true;
    } catch (error) {
      this.#failedWrites += 1;
      this.#fail(classifyWriteError(error), connection.address, errorMessage(error), seq);
      this.#dropConnection();
      return false;
    }
  }

  async #connect(): Promise<Connection | undefined> {
    let address: string | undefined;
    try {
      address = await withTimeout(this.#resolvePrimary(), this.#resolveTimeoutMs, "resolvePrimary timed out");
    } catch (error) {
      this.#fail("resolve", undefined, errorMessage(error));
      return undefined;
    }
    if (!address) {
      this.#fail("no-primary", undefined, "the system advertises no primary");
      return undefined;
    }
    const endpoint = tryParseAddress(address);
    if (!endpoint) {
      this.#fail("resolve", address, "the advertised primary is not host:port");
      return undefined;
    }
    const { host, port } = endpoint;
    const client = new Redis(port, host, {
      lazyConnect: true,
      enableOfflineQueue: false,
      enableReadyCheck: false,
      maxRetriesPerRequest: 0,
      retryStrategy: () => null,
      connectTimeout: this.#commandTimeoutMs,
      commandTimeout: this.#commandTimeoutMs,
    });
    // Failures surface as rejected commands; the event would otherwise be an unhandled error.
    client.on("error", () => {});
    try {
      await client.connect();
      const role = (await client.role()) as unknown[];
      if (role[0] !== "master") {
        client.disconnect();
        this.#fail("not-primary", address, `ROLE is ${String(role[0])}`);
        return undefined;
      }
    } catch (error) {
      client.disconnect();
      this.#fail("connect", address, errorMessage(error));
      return undefined;
    }
    this.#connection = { address, client };
    this.emit("target", { address, at: this.#now() });
    return this.#connection;
  }

  #fail(kind: WriteFailureKind, address: string | undefined, message: string, seq?: number): void {
    this.#failures[kind] += 1;
    this.emit("failure", { kind, address, seq, message, at: this.#now() });
  }

  #dropConnection(): void {
    this.#connection?.client.disconnect();
    this.#connection = undefined;
  }
}

export function classifyWriteError(error: unknown): WriteFailureKind {
  const message = errorMessage(error);
  if (message.startsWith("READONLY")) return "readonly";
  if (message.includes("timed out")) return "timeout";
  if (/Connection is closed|Stream isn't writeable|ECONNRESET|EPIPE|ECONNREFUSED/.test(message)) {
    return "connection";
  }
  return "error";
}

function withTimeout<T>(promise: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(message)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}
