/**
 * A hostile Sentinel client for the fuzz test (test/integration/sentinel-fuzz.test.ts), run in its
 * own process so that generating garbage does not load the agent under test:
 *
 *   node test/support/sentinel-fuzz-client.ts <port> <seconds> <seed>
 *
 * For `seconds`, keeps CONCURRENCY connections busy (few enough to leave the agent a core on a two-core machine) sending random sequences of valid commands,
 * malformed RESP2, RESP3 types a client never sends, oversized and truncated frames, split at
 * random byte boundaries; some connections stop reading their replies, some vanish mid-frame.
 * Prints one JSON line of counts at the end. Deterministic for a seed, up to socket timing.
 */
import { connect, type Socket } from "node:net";
import { Random } from "../../src/dev/nemesis/random.ts";

const [port, seconds, seed] = process.argv.slice(2).map(Number) as [number, number, number];
const CONCURRENCY = 8;

const random = new Random(seed);
const int = (max: number) => random.int(0, max - 1);
const pick = <T>(items: readonly T[]): T => random.pick(items);

function word(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz+-*?[]^\\0123456789 \r\n\u00e9";
  return Array.from({ length: int(12) }, () => pick([...alphabet])).join("");
}

function pattern(): string {
  return pick([
    () => `${"*".repeat(1 + int(300))}X`,
    () => `${"*?".repeat(int(100))}[a-${word()}`,
    () => "+s*",
    () => "*",
    () => `[^${word()}]*down`,
    () => word(),
    () => "\\".repeat(int(50)),
  ])();
}

function command(): string[] {
  return pick([
    () => ["PING"],
    () => ["PING", word()],
    () => ["HELLO", pick(["2", "3", "4", "-1", word()])],
    () => ["HELLO", "3", "AUTH", "default", word(), "SETNAME", word()],
    () => ["AUTH", word()],
    () => ["AUTH", word(), word()],
    () => ["SUBSCRIBE", pick(["+switch-master", "+sdown", word()])],
    () => ["PSUBSCRIBE", ...Array.from({ length: 1 + int(70) }, pattern)],
    () => ["PUNSUBSCRIBE", ...(random.next() < 0.5 ? [] : [pattern()])],
    () => ["UNSUBSCRIBE"],
    () => ["SENTINEL", "get-master-addr-by-name", word()],
    () => [
      "SENTINEL",
      pick(["masters", "master", "replicas", "slaves", "sentinels", "myid", "failover", word()]),
      word(),
    ],
    () => ["ROLE"],
    () => ["INFO", pick(["all", "server", "sentinel", word()])],
    () => ["CLIENT", pick(["SETNAME", "GETNAME", "ID", "SETINFO", "KILL", word()]), word()],
    () => ["RESET"],
    () => ["COMMAND", "DOCS"],
    () => [word(), ...Array.from({ length: int(5) }, word)],
  ])();
}

function request(args: readonly string[]): string {
  return `*${args.length}\r\n${args.map((arg) => `$${Buffer.byteLength(arg)}\r\n${arg}\r\n`).join("")}`;
}

/** One frame: mostly commands, the rest every way RESP can be wrong. */
function frame(): Buffer {
  const valid = request(command());
  const text = pick<() => string | Buffer>([
    () => valid,
    () => valid,
    () => valid,
    () => valid.slice(0, int(valid.length)),
    () => `${command().join(" ")}\r\n`,
    () => Buffer.from(Array.from({ length: int(2000) }, () => int(256))),
    () => `*2\r\n$5\r\nab\r\n$1\r\nc\r\n`,
    () => `*1\r\n$${pick(["999999999", "-7", "1e9", "", "18446744073709551616"])}\r\n${word()}`,
    () => `*${pick(["99999999999", "-5", "0", "x", ""])}\r\n`,
    () => `*2\r\n*1\r\n$1\r\na\r\n$1\r\nb\r\n`,
    () => `%2\r\n+a\r\n:1\r\n+b\r\n:2\r\n`,
    () => `~1\r\n$1\r\na\r\n`,
    () => `>2\r\n$4\r\nPING\r\n$1\r\nx\r\n`,
    () => `#t\r\n,3.14\r\n(123456789012345678901234567890\r\n`,
    () => `!5\r\nERROR\r\n=8\r\ntxt:abcd\r\n`,
    () => `|1\r\n+k\r\n+v\r\n*1\r\n$4\r\nPING\r\n`,
    () => `_\r\n:${word()}\r\n-ERR ${word()}\r\n`,
    () => request(Array.from({ length: 65 + int(100) }, () => "a")),
    () => request(["PSUBSCRIBE", "*".repeat(10_000 + int(60_000))]),
    () => Buffer.alloc(70_000 + int(100_000), 42),
  ])();
  return Buffer.isBuffer(text) ? text : Buffer.from(text);
}

const counts = { connections: 0, frames: 0, bytesSent: 0, bytesReceived: 0, closedByServer: 0 };
const deadline = Date.now() + seconds * 1000;

/** One connection's life: a few frames in random pieces, then gone one way or another. */
function session(): Promise<void> {
  return new Promise((resolve) => {
    counts.connections++;
    const socket: Socket = connect(port, "127.0.0.1");
    let done = false;
    // A paused client whose connection the server closed never sees it: give up on it.
    const giveUp = setTimeout(() => finish(), 3000);
    const finish = () => {
      if (done) return;
      done = true;
      clearTimeout(giveUp);
      socket.destroy();
      resolve();
    };
    socket.on("data", (chunk: Buffer) => {
      counts.bytesReceived += chunk.length;
    });
    socket.on("error", finish);
    socket.on("close", () => {
      if (!done) counts.closedByServer++;
      finish();
    });
    // A fifth of the clients never read their replies.
    if (random.next() < 0.2) socket.pause();
    socket.on("connect", async () => {
      const frames = 1 + int(20);
      for (let index = 0; index < frames && !done && Date.now() < deadline; index++) {
        const bytes = frame();
        counts.frames++;
        let offset = 0;
        while (offset < bytes.length && !done) {
          const size = 1 + int(Math.min(bytes.length - offset, pick([1, 7, 64, 4096, 65_536])));
          socket.write(bytes.subarray(offset, offset + size));
          counts.bytesSent += size;
          offset += size;
          if (random.next() < 0.3) await new Promise((next) => setTimeout(next, int(5)));
        }
      }
      const ending = random.next();
      if (ending < 0.4) finish();
      else if (ending < 0.7) socket.end();
      else setTimeout(finish, int(500));
    });
  });
}

async function worker(): Promise<void> {
  while (Date.now() < deadline) await session();
}

await Promise.all(Array.from({ length: CONCURRENCY }, worker));
process.stdout.write(`${JSON.stringify(counts)}\n`);
