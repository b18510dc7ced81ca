/**
 * A hostile HTTP client for the HTTP endpoint's robustness test (test/integration/http-robustness.test.ts),
 * run in its own process so that its work does not load the agent under test:
 *
 *   node test/support/http-abuse-client.ts <host> <port> <seconds> <slow source> <request source>
 *
 * For `seconds`, from loopback addresses other than the checker's:
 * - from `slow source`, keeps 1,000 slowloris connections going at once: each sends a request line
 *   and then one header byte a second, never finishing; one the server closes is opened again a
 *   second later;
 * - from `request source`, two at a time on connections of their own: requests for an unknown path,
 *   with 64 KiB of headers, with a 20,000-byte path, and a POST; counts the status codes that come back.
 * Prints one JSON line of counts at the end.
 */
import { connect, type Socket } from "node:net";

const [
  host = "127.0.0.1",
  portText = "0",
  secondsText = "10",
  slowSource = "127.0.0.2",
  requestSource = "127.0.0.3",
] = process.argv.slice(2);
const port = Number(portText);
const deadline = Date.now() + Number(secondsText) * 1000;
const SLOW_CONNECTIONS = 1000;

const counts = {
  slowOpened: 0,
  slowClosedByServer: 0,
  slowMaxOpenAtOnce: 0,
  requests: 0,
  statuses: {} as Record<string, number>,
  resets: 0,
};
let slowOpen = 0;

function slowloris(): void {
  if (Date.now() >= deadline) return;
  const socket = connect({ host, port, localAddress: slowSource });
  counts.slowOpened++;
  slowOpen++;
  counts.slowMaxOpenAtOnce = Math.max(counts.slowMaxOpenAtOnce, slowOpen);
  let timer: NodeJS.Timeout | undefined;
  socket.on("connect", () => {
    socket.write("GET /primary HTTP/1.1\r\nHost: agent\r\nX-Slow: ");
    timer = setInterval(() => socket.write("a"), 1000);
  });
  socket.on("error", () => {});
  socket.on("close", () => {
    slowOpen--;
    if (timer) clearInterval(timer);
    if (Date.now() < deadline) {
      counts.slowClosedByServer++;
      // Back off: a refused connection must not become a busy loop on two cores.
      setTimeout(slowloris, 1000);
    }
  });
}

/** One request on its own connection; resolves with the status code, or "reset". */
function request(text: string): Promise<string> {
  return new Promise((resolve) => {
    const socket: Socket = connect({ host, port, localAddress: requestSource });
    let reply = "";
    const done = (status: string) => {
      socket.destroy();
      resolve(status);
    };
    socket.setTimeout(10_000, () => done("timeout"));
    socket.on("connect", () => socket.write(text));
    socket.on("data", (chunk: Buffer) => {
      reply += chunk.toString("latin1");
      const match = /^HTTP\/1\.1 (\d{3})/.exec(reply);
      if (match?.[1]) done(match[1]);
    });
    socket.on("error", () => done("reset"));
    socket.on("close", () => done(reply === "" ? "reset" : "unparsed"));
  });
}

const HUGE = `X-Big: ${"b".repeat(64 * 1024)}\r\n`;
const REQUESTS = [
  `GET /no/such/path HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n`,
  `GET /primary HTTP/1.1\r\nHost: agent\r\n${HUGE}Connection: close\r\n\r\n`,
  `POST /primary HTTP/1.1\r\nHost: agent\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`,
  `GET /${"x".repeat(20_000)} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n`,
];

async function requests(): Promise<void> {
  let index = 0;
  while (Date.now() < deadline) {
    const status = await request(REQUESTS[index++ % REQUESTS.length] as string);
    counts.requests++;
    counts.statuses[status] = (counts.statuses[status] ?? 0) + 1;
    await new Promise((next) => setTimeout(next, 5));
  }
}

for (let n = 0; n < SLOW_CONNECTIONS; n++) slowloris();
await Promise.all([requests(), requests()]);
process.stdout.write(`${JSON.stringify(counts)}\n`);
process.exit(0);
