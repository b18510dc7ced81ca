import RedisParser from "redis-parser";
import type { SentinelReply } from "../core/sentinel.ts";

/** RESP version a connection speaks: 2 until the client asks `HELLO 3`. */
export type Protocol = 2 | 3;

/** A reply, or a pub/sub message (RESP3 push, RESP2 array). */
export type Frame = SentinelReply | { readonly type: "push"; readonly items: readonly SentinelReply[] };

const CRLF = "\r\n";

/** Simple strings and errors are one line: a CR or LF in them would end the frame early. */
function line(text: string): string {
  return text.replace(/[\r\n]+/g, " ");
}

function encodeInto(frame: Frame, protocol: Protocol, out: string[]): void {
  switch (frame.type) {
    case "status":
      out.push(`+${line(frame.value)}${CRLF}`);
      return;
    case "error":
      out.push(`-${line(frame.message)}${CRLF}`);
      return;
    case "integer":
      out.push(`:${Math.trunc(frame.value)}${CRLF}`);
      return;
    case "bulk":
      out.push(`$${Buffer.byteLength(frame.value)}${CRLF}${frame.value}${CRLF}`);
      return;
    case "null":
      out.push(protocol === 3 ? `_${CRLF}` : `$-1${CRLF}`);
      return;
    case "nullArray":
      out.push(protocol === 3 ? `_${CRLF}` : `*-1${CRLF}`);
      return;
    case "array":
    case "push":
      out.push(`${frame.type === "push" && protocol === 3 ? ">" : "*"}${frame.items.length}${CRLF}`);
      for (const item of frame.items) encodeInto(item, protocol, out);
      return;
    case "map":
      out.push(protocol === 3 ? `%${frame.entries.length}${CRLF}` : `*${frame.entries.length * 2}${CRLF}`);
      for (const [key, value] of frame.entries) {
        encodeInto({ type: "bulk", value: key }, protocol, out);
        encodeInto(value, protocol, out);
      }
      return;
  }
}

/**
 * Serialises a reply. Only our own closed set of reply shapes is written, so this is a total
 * function over `Frame`; parsing untrusted input is left to redis-parser (RequestReader).
 */
export function encodeFrame(frame: Frame, protocol: Protocol): string {
  const out: string[] = [];
  encodeInto(frame, protocol, out);
  return out.join("");
}

export interface RequestReaderOptions {
  /** Bytes a client may send before completing a command; past it the request is refused. */
  readonly maxPendingBytes: number;
  /** Most arguments one command may carry (name included). */
  readonly maxArguments: number;
  readonly onCommand: (args: string[]) => void;
  /** The stream cannot be read further (malformed or oversized): reply with `message` and close. */
  readonly onFatal: (message: string) => void;
}

/**
 * Turns a client's byte stream into commands with redis-parser (the RESP parser ioredis and
 * node_redis used for years). Memory is bounded: at most `maxPendingBytes` (plus the chunk being
 * read) of an unfinished command is ever buffered, whatever bulk length the client declares.
 */
export class RequestReader {
  readonly #options: RequestReaderOptions;
  readonly #parser: RedisParser;
  #pending = 0;
  #completed = false;
  #failed = false;

  constructor(options: RequestReaderOptions) {
    this.#options = options;
    this.#parser = new RedisParser({
      returnBuffers: false,
      stringNumbers: true,
      returnReply: (value: unknown) => this.#command(value),
      returnError: () => this.#fail("ERR Protocol error: a client may not send an error reply"),
      returnFatalError: (error) => this.#fail(`ERR Protocol error: ${error.message}`),
    });
  }

  get failed(): boolean {
    return this.#failed;
  }

  feed(chunk: Buffer): void {
    if (this.#failed) return;
    this.#completed = false;
    this.#pending += chunk.length;
    if (this.#pending > this.#options.maxPendingBytes) {
      this.#fail(`ERR Protocol error: request larger than ${this.#options.maxPendingBytes} bytes`);
      return;
    }
    try {
      this.#parser.execute(chunk);
    } catch (error) {
      // e.g. an array length past what a JavaScript array can hold.
      this.#fail(`ERR Protocol error: ${error instanceof Error ? error.message : String(error)}`);
      return;
    }
    // Some command ended inside this chunk: what follows it is at most this chunk.
    if (this.#completed) this.#pending = 0;
  }

  #command(value: unknown): void {
    if (this.#failed) return;
    this.#completed = true;
    if (!Array.isArray(value) || value.length === 0 || !value.every((arg) => typeof arg === "string")) {
      this.#fail("ERR Protocol error: a command is a non-empty array of bulk strings");
      return;
    }
    if (value.length > this.#options.maxArguments) {
      this.#fail(`ERR Protocol error: more than ${this.#options.maxArguments} arguments`);
      return;
    }
    this.#options.onCommand(value as string[]);
  }

  #fail(message: string): void {
    if (this.#failed) return;
    // No parser.reset() here: this runs inside the parser's own loop. A failed reader ignores the rest.
    this.#failed = true;
    this.#options.onFatal(message);
  }
}
