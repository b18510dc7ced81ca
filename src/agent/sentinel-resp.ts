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
 * function over `Frame`; untrusted input is parsed by RequestReader.
 */
export function encodeFrame(frame: Frame, protocol: Protocol): string {
  const out: string[] = [];
  encodeInto(frame, protocol, out);
  return out.join("");
}

export interface RequestReaderOptions {
  /** Bytes one command may take (headers and arguments); past it the request is refused. */
  readonly maxPendingBytes: number;
  /** Most arguments one command may carry (name included). */
  readonly maxArguments: number;
  readonly onCommand: (args: string[]) => void;
  /** The stream cannot be read further (malformed or oversized): reply with `message` and close. */
  readonly onFatal: (message: string) => void;
}

/** Where the reader is inside a command `*<n>\r\n` then n times `$<len>\r\n<bytes>\r\n`. */
type ReadState = "start" | "count" | "countEnd" | "dollar" | "length" | "lengthEnd" | "data";

/** Longest number a header may carry: more digits than any accepted count or length needs. */
const MAX_DIGITS = 10;

const CR = 13;
const LF = 10;

/**
 * Turns a client's byte stream into commands: RESP arrays of bulk strings, the only requests
 * Sentinel clients send (anything else, inline commands included, is a protocol error that
 * closes the connection). Incremental and linear: every byte is looked at once, whatever the
 * chunking (a general RESP parser that re-scans a buffered partial frame on every chunk costs
 * quadratic time to a client trickling bytes: 65 KB sent a byte at a time cost redis-parser
 * 14 s of the agent's thread). Memory is bounded: a command larger than `maxPendingBytes`, or
 * one declaring more, is refused before it is buffered.
 */
export class RequestReader {
  readonly #options: RequestReaderOptions;
  #state: ReadState = "start";
  #failed = false;
  #number = 0;
  #digits = 0;
  #count = 0;
  #length = 0;
  #commandBytes = 0;
  #args: string[] = [];
  /** The argument being read, with its CRLF: allocated once its (bounded) length is known. */
  #bulk: Buffer = Buffer.alloc(0);
  #bulkBytes = 0;

  constructor(options: RequestReaderOptions) {
    this.#options = options;
  }

  get failed(): boolean {
    return this.#failed;
  }

  feed(chunk: Buffer): void {
    let index = 0;
    while (index < chunk.length && !this.#failed) {
      if (this.#state === "data") {
        index = this.#data(chunk, index);
        continue;
      }
      this.#commandBytes++;
      if (this.#commandBytes > this.#options.maxPendingBytes) {
        this.#fail(`ERR Protocol error: request larger than ${this.#options.maxPendingBytes} bytes`);
        return;
      }
      this.#header(chunk[index] as number);
      index++;
    }
  }

  /** One byte of a header line. */
  #header(byte: number): void {
    switch (this.#state) {
      case "start":
        if (byte !== 0x2a) this.#fail(`ERR Protocol error: expected '*', got '${printable(byte)}'`);
        else this.#startNumber("count");
        return;
      case "dollar":
        if (byte !== 0x24) this.#fail(`ERR Protocol error: expected '$', got '${printable(byte)}'`);
        else this.#startNumber("length");
        return;
      case "count":
      case "length":
        this.#digit(byte);
        return;
      case "countEnd":
        this.#endCount(byte);
        return;
      case "lengthEnd":
        this.#endLength(byte);
        return;
    }
  }

  #endCount(byte: number): void {
    if (byte !== LF || this.#number < 1) this.#fail("ERR Protocol error: invalid multibulk length");
    else if (this.#number > this.#options.maxArguments)
      this.#fail(`ERR Protocol error: more than ${this.#options.maxArguments} arguments`);
    else {
      this.#count = this.#number;
      this.#state = "dollar";
    }
  }

  #endLength(byte: number): void {
    if (byte !== LF) this.#fail("ERR Protocol error: invalid bulk length");
    else if (this.#commandBytes + this.#number + 2 > this.#options.maxPendingBytes)
      this.#fail(`ERR Protocol error: request larger than ${this.#options.maxPendingBytes} bytes`);
    else {
      this.#length = this.#number;
      this.#bulk = Buffer.allocUnsafe(this.#length + 2);
      this.#bulkBytes = 0;
      this.#state = "data";
    }
  }

  #startNumber(state: "count" | "length"): void {
    this.#state = state;
    this.#number = 0;
    this.#digits = 0;
  }

  #digit(byte: number): void {
    const what = this.#state === "count" ? "multibulk" : "bulk";
    if (byte === CR && this.#digits > 0) {
      this.#state = this.#state === "count" ? "countEnd" : "lengthEnd";
    } else if (byte >= 0x30 && byte <= 0x39 && this.#digits < MAX_DIGITS) {
      this.#number = this.#number * 10 + (byte - 0x30);
      this.#digits++;
    } else if (byte >= 0x30 && byte <= 0x39 && what === "multibulk") {
      this.#fail(`ERR Protocol error: more than ${this.#options.maxArguments} arguments`);
    } else {
      this.#fail(`ERR Protocol error: invalid ${what} length`);
    }
  }

  /** Takes the bytes of the current argument (and its CRLF) from `chunk`; returns where it stopped. */
  #data(chunk: Buffer, index: number): number {
    const bytes = this.#bulk;
    const taken = chunk.copy(bytes, this.#bulkBytes, index, index + bytes.length - this.#bulkBytes);
    this.#bulkBytes += taken;
    this.#commandBytes += taken;
    if (this.#bulkBytes < bytes.length) return index + taken;
    this.#bulk = Buffer.alloc(0);
    if (bytes[this.#length] !== CR || bytes[this.#length + 1] !== LF) {
      this.#fail("ERR Protocol error: a bulk string does not end where its length says");
      return index + taken;
    }
    this.#args.push(bytes.toString("utf8", 0, this.#length));
    if (this.#args.length < this.#count) {
      this.#state = "dollar";
    } else {
      const args = this.#args;
      this.#args = [];
      this.#state = "start";
      this.#commandBytes = 0;
      this.#options.onCommand(args);
    }
    return index + taken;
  }

  #fail(message: string): void {
    if (this.#failed) return;
    // A failed reader ignores the rest of the stream; its buffers go.
    this.#failed = true;
    this.#bulk = Buffer.alloc(0);
    this.#args = [];
    this.#options.onFatal(message);
  }
}

/** A byte as an error message may show it: printable ASCII, else its code. */
function printable(byte: number): string {
  return byte >= 0x20 && byte < 0x7f && byte !== 0x27
    ? String.fromCharCode(byte)
    : `\\x${byte.toString(16).padStart(2, "0")}`;
}
