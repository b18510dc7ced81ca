import type { Scheduler } from "./scheduler.ts";

/**
 * The simulated network between machines (`n1`, `n2`, `n3`, `aws`, `ctl`, `client`). Processes
 * run on machines (a process is a scheduler host `<machine>/<name>#<incarnation>`); a message
 * between two processes crosses the link between their machines.
 *
 * Messages travel on channels (a TCP connection): in order, each after the link's latency. A cut
 * link (one-way: `cut(a, b)` stops a -> b only) holds what is sent on it, as TCP's retransmissions
 * would, and delivers it in order when healed, unless the channel was closed meanwhile (a timeout
 * gave up on it). Delivery runs as code of the receiving process, so a paused process receives
 * when it resumes and a killed one never.
 */

export interface Channel {
  /** Virtual time the last message on it is delivered (keeps a channel's messages in order). */
  lastAt: number;
  closed: boolean;
  /** Messages scheduled and not yet delivered, per receiving process, in the order sent. */
  pending?: Map<string, Array<() => void>>;
}

interface Held {
  readonly channel: Channel;
  readonly toHost: string;
  readonly fn: () => void;
}

/** host -> its machine: a run has a few dozen hosts and asks for theirs on every message. */
const machines = new Map<string, string>();

export function machineOf(host: string): string {
  let machine = machines.get(host);
  if (machine === undefined) {
    const slash = host.indexOf("/");
    machine = slash < 0 ? host : host.slice(0, slash);
    if (machines.size < 10_000) machines.set(host, machine);
  }
  return machine;
}

export class Network {
  readonly #sched: Scheduler;
  readonly #cuts = new Set<string>();
  readonly #held = new Map<string, Held[]>();
  /** Extra one-way delay per link in ms (a slow link), by `from>to`. */
  readonly #slow = new Map<string, number>();

  constructor(sched: Scheduler) {
    this.#sched = sched;
  }

  static channel(): Channel {
    return { lastAt: 0, closed: false };
  }

  isCut(fromMachine: string, toMachine: string): boolean {
    return this.#cuts.has(`${fromMachine}>${toMachine}`);
  }

  /** Cuts `from -> to` (one way). */
  cut(fromMachine: string, toMachine: string): void {
    if (fromMachine !== toMachine) this.#cuts.add(`${fromMachine}>${toMachine}`);
  }

  heal(fromMachine: string, toMachine: string): void {
    const key = `${fromMachine}>${toMachine}`;
    this.#cuts.delete(key);
    const held = this.#held.get(key) ?? [];
    this.#held.delete(key);
    for (const message of held)
      this.#deliver(message.channel, fromMachine, toMachine, message.toHost, message.fn);
  }

  healAll(): void {
    for (const key of [...this.#cuts]) {
      const [from, to] = key.split(">") as [string, string];
      this.heal(from, to);
    }
    this.#slow.clear();
  }

  slow(fromMachine: string, toMachine: string, extraMs: number): void {
    this.#slow.set(`${fromMachine}>${toMachine}`, extraMs);
  }

  /** One-way latency between two machines, drawn for one message. */
  latency(fromMachine: string, toMachine: string): number {
    const random = this.#sched.random;
    const extra = this.#slow.size === 0 ? 0 : (this.#slow.get(`${fromMachine}>${toMachine}`) ?? 0);
    if (fromMachine === toMachine) return 0.02 + extra;
    if (fromMachine === "aws" || toMachine === "aws") return 2 + random.next() * 8 + extra;
    return 0.2 + random.next() * 0.8 + extra;
  }

  /** Sends `fn` from process `fromHost` to process `toHost` on `channel`. */
  send(channel: Channel, fromHost: string, toHost: string, fn: () => void): void {
    if (channel.closed) return;
    const from = machineOf(fromHost);
    const to = machineOf(toHost);
    // No cut (most of a run): no key to build.
    const key = this.#cuts.size === 0 ? "" : `${from}>${to}`;
    if (key !== "" && this.#cuts.has(key)) {
      const held = this.#held.get(key) ?? [];
      held.push({ channel, toHost, fn });
      this.#held.set(key, held);
      return;
    }
    this.#deliver(channel, from, to, toHost, fn);
  }

  #deliver(channel: Channel, from: string, to: string, toHost: string, fn: () => void): void {
    if (channel.closed) return;
    // Strictly after the channel's previous message: equal instants would be ordered by the
    // scheduler's random tie-break, and TCP does not reorder.
    const at = Math.max(this.#sched.now + this.latency(from, to), channel.lastAt + 0.001);
    channel.lastAt = at;
    // Each delivery runs the oldest message pending for its process, not its own: a process resumed
    // after a pause runs what came due meanwhile from the resume on (`Scheduler.resume`), so a
    // message sent just after the resume may come due before the last of them, and TCP does not
    // reorder (seed 5604: a replica hung 18 s applied an entry sent after its resume ahead of 415
    // held ones, a stream gap).
    channel.pending ??= new Map();
    let queue = channel.pending.get(toHost);
    if (queue === undefined) {
      queue = [];
      channel.pending.set(toHost, queue);
    }
    queue.push(fn);
    const pending = queue;
    this.#sched.schedule(
      at - this.#sched.now,
      () => {
        const next = pending.shift();
        if (!channel.closed) next?.();
      },
      toHost,
    );
  }
}
