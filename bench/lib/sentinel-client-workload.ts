import { randomUUID } from "node:crypto";
import { EventEmitter } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";
import { Redis } from "ioredis";
import { errorMessage } from "../../src/core/errors.ts";
import { type Ack, AckLog, verifyAcks, waitForAck } from "../../src/dev/workload/ack-log.ts";
import {
  classifyWriteError,
  type VerifyResult,
  type WriteWorkloadEvents,
  type WriteWorkloadStats,
} from "../../src/dev/workload/writer.ts";

/** Where a Sentinel client finds the primary: the sentinels (or agents) and the master name. */
export interface SentinelClientTarget {
  readonly sentinels: readonly { readonly host: string; readonly port: number }[];
  readonly name: string;
}

export interface SentinelClientWorkloadOptions {
  /**
   * The sentinels and the master name (ioredis in Sentinel mode), or one fixed address (a plain
   * ioredis client, e.g. through HAProxy: the `haproxy` row).
   */
  readonly target:
    | SentinelClientTarget
    | { readonly direct: { readonly host: string; readonly port: number } };
  /** Key prefix; one per workload. @default `sg:s:<random>:` */
  readonly keyPrefix?: string;
  /** `WAIT 1 <ms>` after every SET: a write is acknowledged once a replica has it. @default 1000 */
  readonly waitTimeoutMs?: number;
  /** Pause after an acknowledged write. @default 2 */
  readonly writeIntervalMs?: number;
  /** Pause after a refused or failed write. @default 10 */
  readonly retryDelayMs?: number;
}

/**
 * The integration test's ioredis workload (test/integration/sentinel-clients.test.ts) as a benchmark
 * writer: one ioredis client in Sentinel mode (`new Redis({ sentinels, name })`, ioredis's own
 * discovery, reconnection and offline queue), writing `SET <prefix><seq>` then `WAIT 1 1000` in a loop;
 * a write is acknowledged only when SET said OK *and* WAIT counted a replica.
 *
 * ioredis's options are its defaults. Each step is one pipeline `CLIENT INFO; SET; WAIT; CLIENT INFO`:
 * ioredis resends the unanswered commands of a closed connection on the next one
 * (`autoResendUnfulfilledCommands`, default on), so a SET answered by the old primary could be followed
 * by a WAIT answered by the new one, which confirms nothing about that SET (a fresh connection has no
 * write to wait for). The two `CLIENT INFO` replies (`id`, `laddr`) must name the same connection, else
 * the step is not an acknowledgement; `laddr` names the server that took the write. Every step that
 * reached a server (an ack, a `NOREPLICAS` refusal, a WAIT that counted no replica) is a *contact*.
 *
 * Same public surface as `WriteWorkload` for what the benchmark driver uses.
 */
export class SentinelClientWorkload extends EventEmitter<WriteWorkloadEvents> {
  readonly keyPrefix: string;
  readonly #target: SentinelClientWorkloadOptions["target"];
  readonly #waitTimeoutMs: number;
  readonly #writeIntervalMs: number;
  readonly #retryDelayMs: number;
  readonly #log = new AckLog();
  /** Every reply from a server, acknowledged or not (seq = the write's). */
  readonly #contacts = new AckLog();
  readonly #failures: Record<string, number> = {};
  /** ioredis's reconnection schedule: when it scheduled each reconnect, and its retryStrategy delay. */
  readonly #reconnects: { at: number; delayMs: number }[] = [];
  #client: Redis | undefined;
  #nextSeq = 1;
  #attempts = 0;
  #failedWrites = 0;
  #unconfirmed = 0;
  #address: string | undefined;
  #abort: AbortController | undefined;
  #loop: Promise<void> | undefined;

  constructor(options: SentinelClientWorkloadOptions) {
    super();
    this.#target = options.target;
    this.keyPrefix = options.keyPrefix ?? `sg:s:${randomUUID().slice(0, 8)}:`;
    this.#waitTimeoutMs = options.waitTimeoutMs ?? 1000;
    this.#writeIntervalMs = options.writeIntervalMs ?? 2;
    this.#retryDelayMs = options.retryDelayMs ?? 10;
  }

  keyOf(seq: number): string {
    return `${this.keyPrefix}${seq}`;
  }

  start(): void {
    if (this.#loop) return;
    const target = this.#target;
    const client =
      "direct" in target
        ? new Redis(target.direct.port, target.direct.host)
        : new Redis({ sentinels: target.sentinels.map((sentinel) => ({ ...sentinel })), name: target.name });
    client.on("error", () => {});
    client.on("reconnecting", (delayMs: number) => this.#reconnects.push({ at: performance.now(), delayMs }));
    this.#client = client;
    const abort = new AbortController();
    this.#abort = abort;
    this.#loop = this.#run(client, abort.signal);
  }

  async stop(): Promise<void> {
    this.#abort?.abort();
    // A step queued offline waits for a primary; closing the client rejects it.
    const settled = await Promise.race([this.#loop?.then(() => true), sleep(3000, false)]);
    this.#client?.disconnect();
    if (!settled) await this.#loop;
    this.#loop = undefined;
    this.#abort = undefined;
    this.#client = undefined;
  }

  stats(): WriteWorkloadStats & { readonly unconfirmed: number } {
    return {
      running: this.#loop !== undefined,
      attempts: this.#attempts,
      acked: this.#log.size,
      failedWrites: this.#failedWrites,
      failures: { ...this.#failures } as WriteWorkloadStats["failures"],
      nextSeq: this.#nextSeq,
      address: this.#address,
      lastAck: this.#log.last(),
      unconfirmed: this.#unconfirmed,
    };
  }

  firstAckAfter(instant: number, notAddress?: string): Ack | undefined {
    return this.#log.firstAfter(instant, notAddress);
  }

  /** The first reply of any kind (ack, refusal, unconfirmed) after `instant` from a server other than `notAddress`. */
  firstContactAfter(instant: number, notAddress?: string): Ack | undefined {
    return this.#contacts.firstAfter(instant, notAddress);
  }

  /**
   * ioredis's reconnects scheduled in (from, to]: how many, and the last one's instant and
   * retryStrategy delay (the pause before the attempt that reached the new primary, typically).
   */
  reconnectsBetween(from: number, to: number): { count: number; lastAt?: number; lastDelayMs?: number } {
    const within = this.#reconnects.filter((reconnect) => reconnect.at > from && reconnect.at <= to);
    const last = within.at(-1);
    return { count: within.length, lastAt: last?.at, lastDelayMs: last?.delayMs };
  }

  acks(fromSeq = 0, toSeq?: number): Ack[] {
    return this.#log.bySeqRange(fromSeq, toSeq);
  }

  /** As `WriteWorkload.waitForAckAfter`. */
  waitForAckAfter(instant: number, notAddress: string | undefined, ms: number): Promise<Ack | undefined> {
    return waitForAck(this.#log, this, instant, notAddress, ms);
  }

  /** As `WriteWorkload.verify`: the acknowledged writes of the range `client` does not hold. */
  verify(client: Redis, range: { fromSeq?: number; toSeq?: number } = {}): Promise<VerifyResult> {
    const keys = (acks: string[]) => client.mget(acks);
    return verifyAcks(this.acks(range.fromSeq, range.toSeq), (seq) => this.keyOf(seq), keys);
  }

  async #run(client: Redis, signal: AbortSignal): Promise<void> {
    while (!signal.aborted) {
      const acked = await this.#step(client);
      try {
        await sleep(acked ? this.#writeIntervalMs : this.#retryDelayMs, undefined, { signal });
      } catch {
        // Aborted by stop().
      }
    }
  }

  async #step(client: Redis): Promise<boolean> {
    const seq = this.#nextSeq++;
    this.#attempts += 1;
    let replies: [Error | null, unknown][] | null;
    try {
      replies = await client
        .pipeline()
        .call("CLIENT", "INFO")
        .set(this.keyOf(seq), String(Date.now()))
        .call("WAIT", "1", String(this.#waitTimeoutMs))
        .call("CLIENT", "INFO")
        .exec();
    } catch (error) {
      return this.#failed(seq, undefined, error);
    }
    const at = performance.now();
    const [before, set, wait, after] = replies ?? [];
    const connection = connectionOf(after?.[1]);
    const address = connection?.laddr;
    if (address !== undefined) {
      this.#address = address;
      this.#contacts.add({ seq, at, address });
    }
    if (!set || set[0] || set[1] !== "OK") return this.#failed(seq, address, set?.[0] ?? "no SET reply");
    if (!wait || wait[0]) return this.#failed(seq, address, wait?.[0] ?? "no WAIT reply");
    if (Number(wait[1]) < 1) {
      this.#unconfirmed += 1;
      return this.#failed(seq, address, `WAIT counted ${String(wait[1])} replicas`);
    }
    const first = connectionOf(before?.[1]);
    if (address === undefined || first?.id !== connection?.id || first?.laddr !== address) {
      return this.#failed(seq, address, "the step spanned two connections: not an acknowledgement");
    }
    const ack = { seq, at, address };
    this.#log.add(ack);
    this.emit("ack", ack);
    return true;
  }

  #failed(seq: number, address: string | undefined, error: unknown): false {
    const kind = classifyWriteError(error);
    this.#failures[kind] = (this.#failures[kind] ?? 0) + 1;
    this.#failedWrites += 1;
    this.emit("failure", { kind, address, seq, message: errorMessage(error), at: performance.now() });
    return false;
  }
}

/**
 * `id` and `laddr` (the server's side: host:port) of a `CLIENT INFO` reply: which connection to which
 * server answered it. Undefined when the reply has neither.
 */
export function connectionOf(reply: unknown): { id: string; laddr: string } | undefined {
  const text = typeof reply === "string" ? reply : Buffer.isBuffer(reply) ? reply.toString() : undefined;
  const id = text?.match(/(?:^|\s)id=(\d+)/)?.[1];
  const laddr = text?.match(/(?:^|\s)laddr=(\S+)/)?.[1];
  return id === undefined || laddr === undefined ? undefined : { id, laddr };
}
