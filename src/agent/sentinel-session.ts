import { createHash, timingSafeEqual } from "node:crypto";
import { answerSentinel, reply, type SentinelReply, type SentinelView } from "../core/sentinel.ts";
import type { Frame, Protocol } from "./sentinel-resp.ts";

/** Most channels plus patterns one connection may subscribe to (bounded memory per connection). */
export const MAX_SUBSCRIPTIONS = 64;

/** What a session needs from the endpoint. */
export interface SessionHost {
  /** The view to answer ROLE and SENTINEL from (may read the table first). */
  view(): Promise<SentinelView>;
  /** The password clients must give (AUTH, HELLO ... AUTH), if any. */
  readonly password: string | undefined;
  /** A client subscribed while nothing was subscribed before: watch the topology. */
  subscribed(): void;
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

/** Redis glob (`*`, `?`, `[...]`, `[^...]`, `\x`) as a regular expression. */
export function globToRegExp(pattern: string): RegExp {
  let source = "";
  for (let index = 0; index < pattern.length; index++) {
    const char = pattern[index] as string;
    if (char === "*") source += ".*";
    else if (char === "?") source += ".";
    else if (char === "\\" && index + 1 < pattern.length) source += escapeChar(pattern[++index] as string);
    else if (char === "[") {
      const end = pattern.indexOf("]", index + 2);
      if (end === -1) {
        source += "\\[";
        continue;
      }
      let body = pattern.slice(index + 1, end);
      const negated = body.startsWith("^");
      if (negated) body = body.slice(1);
      source += `[${negated ? "^" : ""}${body.replace(/[\\\]]/g, "\\$&")}]`;
      index = end;
    } else source += escapeChar(char);
  }
  return new RegExp(`^${source}$`, "s");
}

function escapeChar(char: string): string {
  return char.replace(/[.*+?^${}()|[\]\\/-]/g, "\\$&");
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
  readonly patterns = new Map<string, RegExp>();
  readonly #host: SessionHost;
  #authenticated: boolean;

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
    for (const [pattern, regexp] of this.patterns) {
      if (!regexp.test(channel)) continue;
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
        return one(this.#auth(rest));
      case "hello":
        return one(this.#hello(rest));
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

  #passwordMatches(user: string | undefined, password: string): boolean {
    const expected = this.#host.password;
    if (expected === undefined) return true;
    if (user !== undefined && user !== "default") return false;
    return timingSafeEqual(digest(password), digest(expected));
  }

  #auth(rest: readonly string[]): SentinelReply {
    if (rest.length < 1 || rest.length > 2) return arity("auth");
    if (this.#host.password === undefined) {
      return reply.error(
        "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
      );
    }
    const [user, password] =
      rest.length === 2 ? [rest[0], rest[1] as string] : [undefined, rest[0] as string];
    if (!this.#passwordMatches(user, password)) {
      return reply.error("WRONGPASS invalid username-password pair or user is disabled.");
    }
    this.#authenticated = true;
    return reply.status("OK");
  }

  #hello(rest: readonly string[]): SentinelReply {
    let protocol: Protocol = this.protocol;
    if (rest.length > 0) {
      const asked = rest[0] as string;
      if (!/^\d+$/.test(asked)) return reply.error("ERR Protocol version is not an integer or out of range");
      if (asked !== "2" && asked !== "3") return reply.error("NOPROTO unsupported protocol version");
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
        return reply.error(`ERR Syntax error in HELLO option '${(rest[index] as string).slice(0, 64)}'`);
      }
    }
    if (auth !== undefined) {
      if (!this.#passwordMatches(auth.user, auth.password)) {
        return reply.error("WRONGPASS invalid username-password pair or user is disabled.");
      }
      this.#authenticated = true;
    }
    if (!this.#authenticated) {
      return reply.error(
        "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
      );
    }
    if (setName !== undefined) {
      if (!validName(setName))
        return reply.error("ERR Client names cannot contain spaces, newlines or special characters.");
      this.name = setName;
    }
    this.protocol = protocol;
    return {
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
    };
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
      if (kind === "subscribe") this.channels.add(target);
      else this.patterns.set(target, globToRegExp(target));
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
