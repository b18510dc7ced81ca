import { createHash, timingSafeEqual } from "node:crypto";
import { compileGlob, globMatch } from "../core/glob.ts";
import {
  answerSentinel,
  reply,
  SENTINEL_CHANNELS,
  type SentinelReply,
  type SentinelView,
} from "../core/sentinel.ts";
import type { Frame, Protocol } from "./sentinel-resp.ts";

/** Most channels plus patterns one connection may subscribe to (bounded memory per connection). */
export const MAX_SUBSCRIPTIONS = 64;

/** Longest channel name or pattern accepted, in bytes (event channels are at most 14). */
export const MAX_PATTERN_BYTES = 256;

/** Failed password attempts one connection may make; the last one closes it. */
export const MAX_AUTH_FAILURES_PER_CONNECTION = 3;

/** What a session needs from the endpoint. */
export interface SessionHost {
  /** The view to answer ROLE and SENTINEL from (may read the table first). */
  view(): Promise<SentinelView>;
  /** The password clients must give (AUTH, HELLO ... AUTH), if any. */
  readonly password: string | undefined;
  /** A client subscribed while nothing was subscribed before: watch the topology. */
  subscribed(): void;
  /**
   * Whether a password attempt may be checked now (false: too many recent failures from this
   * client's address) and, after a wrong one, a report of it. @default always allowed
   */
  readonly authThrottle?: { allowed(): boolean; failed(): void; succeeded(): void };
}

export interface Outcome {
  readonly frames: readonly Frame[];
  /** Close the connection after writing the frames (QUIT). */
  readonly close?: boolean;
}

const PUBSUB_ONLY = new Set([
  "subscribe",
  "psubscribe",
  "unsubscribe",
  "punsubscribe",
  "ping",
  "quit",
  "reset",
]);

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}

/**
 * The event channels a pattern matches, found once when it is subscribed: publishing an event
 * is then a set lookup, whatever the pattern (no per-event matching a client could make slow).
 */
export function channelsMatching(pattern: string): ReadonlySet<string> {
  const glob = compileGlob(pattern);
  return new Set(SENTINEL_CHANNELS.filter((channel) => globMatch(glob, channel)));
}

/**
 * One client connection's protocol state: RESP version, authentication, name, subscriptions.
 * The connection commands (PING, HELLO, AUTH, CLIENT, (P)SUBSCRIBE, ...) are answered here;
 * ROLE and SENTINEL go to the pure core (answerSentinel).
 */
export class SentinelSession {
  readonly id: number;
  protocol: Protocol = 2;
  name: string | undefined;
  readonly channels = new Set<string>();
  /** Each pattern with the event channels it matches. */
  readonly patterns = new Map<string, ReadonlySet<string>>();
  readonly #host: SessionHost;
  #authenticated: boolean;
  #authFailures = 0;

  constructor(id: number, host: SessionHost) {
    this.id = id;
    this.#host = host;
    this.#authenticated = host.password === undefined;
  }

  get subscriptions(): number {
    return this.channels.size + this.patterns.size;
  }

  /** The frames a published event makes for this session (none when it does not listen). */
  messagesFor(channel: string, message: string): Frame[] {
    const frames: Frame[] = [];
    if (this.channels.has(channel)) {
      frames.push({ type: "push", items: [reply.bulk("message"), reply.bulk(channel), reply.bulk(message)] });
    }
    for (const [pattern, channels] of this.patterns) {
      if (!channels.has(channel)) continue;
      frames.push({
        type: "push",
        items: [reply.bulk("pmessage"), reply.bulk(pattern), reply.bulk(channel), reply.bulk(message)],
      });
    }
    return frames;
  }

  async handle(args: readonly string[]): Promise<Outcome> {
    const [command = "", ...rest] = args;
    const name = command.toLowerCase();
    if (!this.#authenticated && name !== "auth" && name !== "hello" && name !== "quit") {
      return one(reply.error("NOAUTH Authentication required."));
    }
    if (this.protocol === 2 && this.subscriptions > 0 && !PUBSUB_ONLY.has(name)) {
      return one(
        reply.error(
          `ERR Can't execute '${name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context`,
        ),
      );
    }
    switch (name) {
      case "ping":
        return one(this.#ping(rest));
      case "echo":
        return one(rest.length === 1 ? reply.bulk(rest[0] as string) : arity(name));
      case "quit":
        return { frames: [reply.status("OK")], close: true };
      case "auth":
        return this.#auth(rest);
      case "hello":
        return this.#hello(rest);
      case "client":
        return one(this.#client(rest));
      case "command":
        return one(reply.array([]));
      case "reset":
        this.channels.clear();
        this.patterns.clear();
        this.protocol = 2;
        this.name = undefined;
        this.#authenticated = this.#host.password === undefined;
        return one(reply.status("RESET"));
      case "subscribe":
      case "psubscribe":
        return this.#subscribe(name, rest);
      case "unsubscribe":
      case "punsubscribe":
        return this.#unsubscribe(name, rest);
      case "info":
        return one(infoText(await this.#host.view(), rest[0]));
      case "role":
      case "sentinel":
        return one(answerSentinel(command, rest, await this.#host.view()));
      default: {
        const shown = rest
          .slice(0, 3)
          .map((arg) => `'${arg.slice(0, 64)}' `)
          .join("");
        return one(
          reply.error(`ERR unknown command '${command.slice(0, 64)}', with args beginning with: ${shown}`),
        );
      }
    }
  }

  #ping(rest: readonly string[]): SentinelReply {
    if (rest.length > 1) return arity("ping");
    if (this.protocol === 2 && this.subscriptions > 0) {
      return reply.array([reply.bulk("pong"), reply.bulk(rest[0] ?? "")]);
    }
    return rest.length === 1 ? reply.bulk(rest[0] as string) : reply.status("PONG");
  }

  /**
   * Checks a password attempt; undefined when it is right. A wrong one counts against the
   * connection (the last allowed one closes it) and against the client's address (back-off).
   */
  #attempt(user: string | undefined, password: string): Outcome | undefined {
    const expected = this.#host.password;
    if (expected === undefined) return undefined;
    const throttle = this.#host.authThrottle;
    if (throttle && !throttle.allowed()) {
      return {
        frames: [reply.error("ERR too many failed authentication attempts from this address; retry later")],
        close: true,
      };
    }
    const right =
      (user === undefined || user === "default") && timingSafeEqual(digest(password), digest(expected));
    if (right) {
      throttle?.succeeded();
      return undefined;
    }
    throttle?.failed();
    this.#authFailures++;
    return {
      frames: [reply.error("WRONGPASS invalid username-password pair or user is disabled.")],
      close: this.#authFailures >= MAX_AUTH_FAILURES_PER_CONNECTION,
    };
  }

  #auth(rest: readonly string[]): Outcome {
    if (rest.length < 1 || rest.length > 2) return one(arity("auth"));
    if (this.#host.password === undefined) {
      return one(
        reply.error(
          "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        ),
      );
    }
    const [user, password] =
      rest.length === 2 ? [rest[0], rest[1] as string] : [undefined, rest[0] as string];
    const refused = this.#attempt(user, password);
    if (refused) return refused;
    this.#authenticated = true;
    return one(reply.status("OK"));
  }

  #hello(rest: readonly string[]): Outcome {
    let protocol: Protocol = this.protocol;
    if (rest.length > 0) {
      const asked = rest[0] as string;
      if (!/^\d+$/.test(asked))
        return one(reply.error("ERR Protocol version is not an integer or out of range"));
      if (asked !== "2" && asked !== "3") return one(reply.error("NOPROTO unsupported protocol version"));
      protocol = asked === "3" ? 3 : 2;
    }
    let auth: { user: string; password: string } | undefined;
    let setName: string | undefined;
    for (let index = 1; index < rest.length; index++) {
      const option = (rest[index] as string).toLowerCase();
      if (option === "auth" && index + 2 < rest.length) {
        auth = { user: rest[index + 1] as string, password: rest[index + 2] as string };
        index += 2;
      } else if (option === "setname" && index + 1 < rest.length) {
        setName = rest[index + 1] as string;
        index += 1;
      } else {
        return one(reply.error(`ERR Syntax error in HELLO option '${(rest[index] as string).slice(0, 64)}'`));
      }
    }
    if (auth !== undefined) {
      const refused = this.#attempt(auth.user, auth.password);
      if (refused) return refused;
      this.#authenticated = true;
    }
    if (!this.#authenticated) {
      return one(
        reply.error(
          "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
        ),
      );
    }
    if (setName !== undefined) {
      if (!validName(setName))
        return one(reply.error("ERR Client names cannot contain spaces, newlines or special characters."));
      this.name = setName;
    }
    this.protocol = protocol;
    return one({
      type: "map",
      entries: [
        ["server", reply.bulk("redis")],
        ["version", reply.bulk(SERVER_VERSION)],
        ["proto", reply.integer(protocol)],
        ["id", reply.integer(this.id)],
        ["mode", reply.bulk("sentinel")],
        ["role", reply.bulk("sentinel")],
        ["modules", reply.array([])],
      ],
    });
  }

  #client(rest: readonly string[]): SentinelReply {
    const sub = rest[0]?.toLowerCase();
    switch (sub) {
      case "setname":
        if (rest.length !== 2) return arity("client|setname");
        if (!validName(rest[1] as string)) {
          return reply.error("ERR Client names cannot contain spaces, newlines or special characters.");
        }
        this.name = rest[1] === "" ? undefined : rest[1];
        return reply.status("OK");
      case "getname":
        return this.name === undefined ? reply.null : reply.bulk(this.name);
      case "id":
        return reply.integer(this.id);
      case "setinfo":
      case "no-evict":
      case "no-touch":
        return reply.status("OK");
      default:
        return reply.error(`ERR unknown subcommand '${(rest[0] ?? "").slice(0, 64)}'. Try CLIENT HELP.`);
    }
  }

  #subscribe(kind: "subscribe" | "psubscribe", targets: readonly string[]): Outcome {
    if (targets.length === 0) return one(arity(kind));
    const wasIdle = this.subscriptions === 0;
    const frames: Frame[] = [];
    for (const target of targets) {
      const known = kind === "subscribe" ? this.channels.has(target) : this.patterns.has(target);
      if (!known && this.subscriptions >= MAX_SUBSCRIPTIONS) {
        frames.push(reply.error(`ERR more than ${MAX_SUBSCRIPTIONS} subscriptions on one connection`));
        continue;
      }
      if (Buffer.byteLength(target) > MAX_PATTERN_BYTES) {
        frames.push(
          reply.error(
            `ERR ${kind === "subscribe" ? "channel" : "pattern"} longer than ${MAX_PATTERN_BYTES} bytes`,
          ),
        );
        continue;
      }
      if (kind === "subscribe") this.channels.add(target);
      else if (!known) this.patterns.set(target, channelsMatching(target));
      frames.push(this.#ack(kind, target));
    }
    if (wasIdle && this.subscriptions > 0) this.#host.subscribed();
    return { frames };
  }

  #unsubscribe(kind: "unsubscribe" | "punsubscribe", targets: readonly string[]): Outcome {
    const set = kind === "unsubscribe" ? this.channels : this.patterns;
    const names = targets.length > 0 ? targets : [...set.keys()];
    if (names.length === 0) return one(this.#ack(kind, undefined));
    const frames: Frame[] = [];
    for (const target of names) {
      set.delete(target);
      frames.push(this.#ack(kind, target));
    }
    return { frames };
  }

  #ack(kind: string, target: string | undefined): Frame {
    return {
      type: "push",
      items: [
        reply.bulk(kind),
        target === undefined ? reply.null : reply.bulk(target),
        reply.integer(this.subscriptions),
      ],
    };
  }
}

/** The Redis version HELLO and INFO report: the Sentinel protocol this endpoint follows. */
export const SERVER_VERSION = "7.0.0";

function one(frame: Frame): Outcome {
  return { frames: [frame] };
}

function arity(command: string): SentinelReply {
  return reply.error(`ERR wrong number of arguments for '${command}' command`);
}

function validName(name: string): boolean {
  return /^[\x21-\x7e]*$/.test(name);
}

function infoText(view: SentinelView, section: string | undefined): SentinelReply {
  const wanted = section?.toLowerCase();
  const topology = view.topology;
  const status =
    topology === undefined
      ? "unknown"
      : topology.status === "online" || topology.status === "paused"
        ? "ok"
        : "odown";
  const address = topology?.primary_address ?? "";
  const replicas = view.nodes.filter((node) => node.role === "replica").length;
  const sentinels = view.nodes.filter((node) => node.sentinel_address !== undefined).length;
  const sections: Record<string, string[]> = {
    server: [`redis_version:${SERVER_VERSION}`, "redis_mode:sentinel", `run_id:${view.selfNodeId}`],
    sentinel: [
      "sentinel_masters:1",
      "sentinel_tilt:0",
      "sentinel_running_scripts:0",
      `master0:name=${view.shard},status=${status},address=${address},slaves=${replicas},sentinels=${sentinels}`,
    ],
  };
  const chosen =
    wanted === undefined || wanted === "all" || wanted === "default" || wanted === "everything"
      ? Object.keys(sections)
      : Object.keys(sections).filter((key) => key === wanted);
  const text = chosen.map(
    (key) => `# ${key[0]?.toUpperCase()}${key.slice(1)}\r\n${sections[key]?.join("\r\n")}\r\n`,
  );
  return reply.bulk(text.join("\r\n"));
}
