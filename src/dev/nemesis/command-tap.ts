import { type Command, commandSchema } from "../../core/model.ts";

/**
 * Reads the commands an agent receives from the bytes of its SQS connection (the proxy's tap):
 * AWS JSON `ReceiveMessage` answers carry each message as `"Body":"<escaped JSON>"`. The nemesis
 * sends copies of them again later, as SQS may (at-least-once delivery, redelivery after a lost
 * delete, a message delayed past the next failover): a real duplicate of a real command.
 */

const BODY = /"Body"\s*:\s*"((?:[^"\\]|\\.)*)"/g;
/** Characters of an unfinished answer kept per connection: a command body is a few hundred. */
const MAX_PENDING = 8 * 1024;
/** Connections whose unfinished answer is kept (agents reconnect often under reset faults). */
const MAX_LINKS = 16;

/** The bodies in `text` that are complete, and the text after the last of them. */
export function extractBodies(text: string): { readonly bodies: string[]; readonly rest: string } {
  const bodies: string[] = [];
  let consumed = 0;
  for (const match of text.matchAll(BODY)) {
    try {
      bodies.push(JSON.parse(`"${match[1]}"`) as string);
    } catch {
      // Not a JSON string literal after all: skipped.
    }
    consumed = (match.index ?? 0) + match[0].length;
  }
  return { bodies, rest: text.slice(consumed) };
}

/** A command body as the agent would parse it, or undefined when it is none. */
export function commandOf(body: string): Command | undefined {
  try {
    const parsed = commandSchema.safeParse(JSON.parse(body));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

/** The commands seen on one agent's SQS connections, the latest `keep` of them, oldest first. */
export class CommandTap {
  readonly #pending = new Map<number, string>();
  readonly #seen = new Set<string>();
  readonly #commands: Command[] = [];
  readonly #keep: number;

  constructor(keep = 20) {
    this.#keep = keep;
  }

  /** One chunk the upstream sent on connection `link`. */
  push(chunk: Buffer, link: number): void {
    const text = (this.#pending.get(link) ?? "") + chunk.toString("utf8");
    const { bodies, rest } = extractBodies(text);
    this.#pending.delete(link);
    this.#pending.set(link, rest.slice(-MAX_PENDING));
    for (const oldest of this.#pending.keys()) {
      if (this.#pending.size <= MAX_LINKS) break;
      this.#pending.delete(oldest);
    }
    for (const body of bodies) {
      const command = commandOf(body);
      if (command === undefined || this.#seen.has(command.command_id)) continue;
      this.#seen.add(command.command_id);
      this.#commands.push(command);
      if (this.#commands.length > this.#keep) this.#commands.shift();
    }
  }

  get commands(): readonly Command[] {
    return this.#commands;
  }
}
