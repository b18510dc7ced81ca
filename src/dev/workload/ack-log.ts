/** One write the server acknowledged: the sequence number, when the reply arrived, and who sent it. */
export interface Ack {
  readonly seq: number;
  /** Monotonic ms (the workload's clock) when the OK reply arrived. */
  readonly at: number;
  /** host:port of the server that replied OK. */
  readonly address: string;
}

/**
 * Every acknowledged write, in the order the replies arrived. The writer has one command in flight
 * at a time, so both `seq` and `at` increase along the log; lookups by instant are binary searches.
 */
export class AckLog {
  readonly #seqs: number[] = [];
  readonly #times: number[] = [];
  readonly #addresses: string[] = [];

  get size(): number {
    return this.#seqs.length;
  }

  add(ack: Ack): void {
    const last = this.#times.length - 1;
    if (last >= 0 && (ack.at < (this.#times[last] ?? 0) || ack.seq <= (this.#seqs[last] ?? 0))) {
      throw new RangeError(
        `acks must arrive in order: seq ${ack.seq} at ${ack.at} after ${this.last()?.seq}`,
      );
    }
    this.#seqs.push(ack.seq);
    this.#times.push(ack.at);
    this.#addresses.push(ack.address);
  }

  at(index: number): Ack | undefined {
    const seq = this.#seqs[index];
    const at = this.#times[index];
    const address = this.#addresses[index];
    if (seq === undefined || at === undefined || address === undefined) return undefined;
    return { seq, at, address };
  }

  last(): Ack | undefined {
    return this.at(this.#seqs.length - 1);
  }

  /** The first ack strictly after `instant` from a server other than `notAddress` (any server when omitted). */
  firstAfter(instant: number, notAddress?: string): Ack | undefined {
    for (let index = this.#firstIndexAfter(instant); index < this.#seqs.length; index++) {
      if (this.#addresses[index] !== notAddress) return this.at(index);
    }
    return undefined;
  }

  /** The last ack at or before `instant`. */
  lastAtOrBefore(instant: number): Ack | undefined {
    return this.at(this.#firstIndexAfter(instant) - 1);
  }

  /** Acks with `fromSeq <= seq < toSeq`, in order. */
  bySeqRange(fromSeq: number, toSeq = Number.POSITIVE_INFINITY): Ack[] {
    const acks: Ack[] = [];
    for (let index = lowerBound(this.#seqs, fromSeq); index < this.#seqs.length; index++) {
      const ack = this.at(index);
      if (!ack || ack.seq >= toSeq) break;
      acks.push(ack);
    }
    return acks;
  }

  /** Index of the first ack whose time is strictly after `instant`. */
  #firstIndexAfter(instant: number): number {
    let low = 0;
    let high = this.#times.length;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if ((this.#times[mid] ?? 0) <= instant) low = mid + 1;
      else high = mid;
    }
    return low;
  }
}

/** Index of the first element >= value in an ascending array. */
function lowerBound(sorted: readonly number[], value: number): number {
  let low = 0;
  let high = sorted.length;
  while (low < high) {
    const mid = (low + high) >>> 1;
    if ((sorted[mid] ?? 0) < value) low = mid + 1;
    else high = mid;
  }
  return low;
}

/** Resolves with the first ack strictly after `instant` from a server other than `notAddress`, or undefined after `timeoutMs`. */
export function waitForAck(
  log: AckLog,
  events: {
    on(event: "ack", listener: (ack: Ack) => void): unknown;
    off(event: "ack", listener: (ack: Ack) => void): unknown;
  },
  instant: number,
  notAddress: string | undefined,
  timeoutMs: number,
): Promise<Ack | undefined> {
  const existing = log.firstAfter(instant, notAddress);
  if (existing) return Promise.resolve(existing);
  return new Promise((resolve) => {
    const onAck = (ack: Ack) => {
      if (ack.at <= instant || ack.address === notAddress) return;
      finish(ack);
    };
    const timer = setTimeout(() => finish(undefined), timeoutMs);
    const finish = (ack: Ack | undefined) => {
      clearTimeout(timer);
      events.off("ack", onAck);
      resolve(ack);
    };
    events.on("ack", onAck);
  });
}

/** Acknowledged writes looked up on a server, and the ones it does not hold. */
export interface VerifyResult {
  /** Acknowledged writes looked up. */
  readonly checked: number;
  /** Sequence numbers acknowledged by a primary and absent from the server verified. */
  readonly lost: readonly number[];
  /** Lost writes counted by the server that had acknowledged them. */
  readonly lostByAddress: Readonly<Record<string, number>>;
}

/** Looks up the acks with `fromSeq <= seq < toSeq` with MGET (keys from `keyOf`) and reports those missing. */
export async function verifyAcks(
  acks: readonly Ack[],
  keyOf: (seq: number) => string,
  mget: (keys: string[]) => Promise<(string | null)[]>,
): Promise<VerifyResult> {
  const lost: number[] = [];
  const lostByAddress: Record<string, number> = {};
  const batchSize = 1000;
  for (let start = 0; start < acks.length; start += batchSize) {
    const batch = acks.slice(start, start + batchSize);
    const values = await mget(batch.map((ack) => keyOf(ack.seq)));
    batch.forEach((ack, index) => {
      if (values[index] !== null) return;
      lost.push(ack.seq);
      lostByAddress[ack.address] = (lostByAddress[ack.address] ?? 0) + 1;
    });
  }
  return { checked: acks.length, lost, lostByAddress };
}
