import { once } from "node:events";
import { connect, createServer, type Server, type Socket } from "node:net";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { DYNAMODB_THROTTLED, TcpProxy } from "../../src/dev/nemesis/tcp-proxy.ts";
import { waitFor } from "../support/wait.ts";

/** Real sockets: an echo server upstream, clients through the proxy. */
let echo: Server;
let received = 0;
let proxy: TcpProxy;
const clients: Socket[] = [];

async function waitUntil(what: string, check: () => boolean, timeoutMs = 5000): Promise<void> {
  await waitFor(check, what, timeoutMs, 5);
}

async function client(): Promise<{ socket: Socket; data: () => string; events: string[] }> {
  const socket = connect(proxy.port, "127.0.0.1");
  clients.push(socket);
  let buffer = "";
  const events: string[] = [];
  socket.on("data", (chunk) => {
    buffer += chunk.toString();
  });
  socket.on("error", (error: NodeJS.ErrnoException) => events.push(`error:${error.code}`));
  socket.on("close", () => events.push("close"));
  await once(socket, "connect");
  return { socket, data: () => buffer, events };
}

beforeEach(async () => {
  received = 0;
  echo = createServer((socket) => {
    socket.on("data", (chunk) => {
      received += chunk.length;
      socket.write(chunk);
    });
    socket.on("error", () => {});
  });
  await new Promise<void>((resolve) => echo.listen(0, "127.0.0.1", () => resolve()));
  const address = echo.address();
  proxy = new TcpProxy("127.0.0.1", typeof address === "object" && address ? address.port : 0, "echo");
  await proxy.start();
});

afterEach(async () => {
  for (const socket of clients.splice(0)) socket.destroy();
  await proxy.stop();
  await new Promise<void>((resolve) => echo.close(() => resolve()));
});

describe("nemesis TCP proxy", () => {
  it("forwards both ways in pass mode", async () => {
    const c = await client();
    c.socket.write("hello");
    await waitUntil("the echo", () => c.data() === "hello");
    expect(proxy.stats()).toMatchObject({ accepted: 1, open: 1, bytesForwarded: 10 });
  });

  it("blackholes an open connection in drop mode and destroys it on heal", async () => {
    // Prepare: a connection that worked before the fault.
    const c = await client();
    c.socket.write("a");
    await waitUntil("the first echo", () => c.data() === "a");

    // Act: the fault; the bytes sent now go nowhere.
    proxy.setMode({ kind: "drop" });
    c.socket.write("lost");
    await waitUntil("the bytes swallowed", () => proxy.stats().bytesDropped === 4);

    // Assess: nothing reached the server; on heal the connection is closed, not resumed.
    expect(received).toBe(1);
    expect(c.data()).toBe("a");
    proxy.heal();
    await waitUntil("the blackholed connection closed", () => c.events.includes("close"));
    expect(received).toBe(1);
    expect(proxy.stats().destroyedOnHeal).toBe(1);
  });

  it("accepts new connections in drop mode without reaching the server, and works again after heal", async () => {
    proxy.setMode({ kind: "drop" });
    const dropped = await client();
    dropped.socket.write("x");
    await waitUntil("the bytes swallowed", () => proxy.stats().bytesDropped === 1);
    expect(received).toBe(0);

    proxy.heal();
    await waitUntil("the blackholed connection closed", () => dropped.events.includes("close"));
    const fresh = await client();
    fresh.socket.write("ok");
    await waitUntil("the echo after heal", () => fresh.data() === "ok");
  });

  it("delays every chunk by the delay, in order", async () => {
    const c = await client();
    proxy.setMode({ kind: "delay", delayMs: 150 });
    const sentAt = performance.now();
    c.socket.write("1");
    c.socket.write("2");
    await waitUntil("both echoes", () => c.data() === "12");
    // Once up, once down: at least two delays.
    expect(performance.now() - sentAt).toBeGreaterThanOrEqual(290);
    proxy.heal();
    c.socket.write("3");
    await waitUntil("the echo after heal", () => c.data() === "123");
  });

  it("resets open connections and new ones in reset mode", async () => {
    const open = await client();
    proxy.setMode({ kind: "reset" });
    await waitUntil("the open connection reset", () => open.events.includes("error:ECONNRESET"));

    const fresh = connect(proxy.port, "127.0.0.1");
    clients.push(fresh);
    const [error] = (await once(fresh, "error")) as [NodeJS.ErrnoException];
    expect(error.code).toBe("ECONNRESET");
    expect(proxy.stats().resets).toBe(2);
  });

  it("closes every connection on stop", async () => {
    const c = await client();
    await proxy.stop();
    await waitUntil("the connection closed", () => c.events.includes("close"));
    expect(proxy.stats().open).toBe(0);
  });

  it("rewrites an endpoint URL to itself", () => {
    expect(proxy.urlFor("http://127.0.0.1:4566")).toBe(`http://127.0.0.1:${proxy.port}`);
    expect(TcpProxy.forUrl("http://localhost:8000").upstreamPort).toBe(8000);
  });

  it("answers a fraction of HTTP requests itself with DynamoDB's throttling error and forwards the rest", async () => {
    // Prepare: draws 0.1, 0.9, 0.1 against a fraction of 0.5: the first and third are answered.
    const draws = [0.1, 0.9, 0.1];
    const c = await client();
    proxy.setMode({
      kind: "http-error",
      fraction: 0.5,
      status: 400,
      body: DYNAMODB_THROTTLED,
      draw: () => draws.shift() ?? 0,
    });
    const again = await client();
    const request = (n: number) => {
      const body = `{"n":${n}}`;
      return `POST / HTTP/1.1\r\nHost: x\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    };

    // Act: three requests on one connection, the first split across two writes.
    const first = request(1);
    again.socket.write(first.slice(0, 20));
    again.socket.write(first.slice(20));
    await waitUntil("the first answer", () =>
      again.data().includes("ProvisionedThroughputExceededException"),
    );
    again.socket.write(request(2));
    await waitUntil("the second request echoed", () => again.data().includes('{"n":2}'));
    again.socket.write(request(3));
    await waitUntil("the third answer", () => again.data().split("HTTP/1.1 400").length === 3);

    // Assess: the connection open before the mode was closed (a parse starts at a boundary); two
    // answers of 400 with the body's length; only the second request reached the upstream.
    await waitUntil("the old connection closed", () => c.events.includes("close"));
    expect(again.data()).toContain(`Content-Length: ${Buffer.byteLength(DYNAMODB_THROTTLED)}`);
    expect(again.data()).not.toContain('{"n":1}');
    expect(again.data()).not.toContain('{"n":3}');
    expect(received).toBe(Buffer.byteLength(request(2)));
    expect(proxy.stats().answered).toBe(2);
  });
});
