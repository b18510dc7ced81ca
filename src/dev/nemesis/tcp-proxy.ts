import { connect, createServer, type Server, type Socket } from "node:net";

/**
 * What the proxy does with traffic, settable at any moment (toxiproxy semantics):
 * - `pass`: forward both ways;
 * - `drop`: a blackhole: accept connections and read their bytes, forward nothing either way. On
 *   leaving `drop`, every connection that was blackholed is DESTROYED: bytes were swallowed, so its
 *   stream is corrupt, and a connection that outlives its fault would let the client escape it
 *   (toxiproxy #148, #168);
 * - `delay`: forward every chunk `delayMs` late, in order, both ways;
 * - `reset`: RST every open connection now and every new one on accept (`resetAndDestroy`);
 * - `http-error`: reads the client's HTTP/1.1 requests (Content-Length bodies, as the AWS SDK
 *   sends them) and answers a `fraction` of them itself with `status` and `body`, as a throttled
 *   or failing DynamoDB would; the rest are forwarded. Entering and leaving it closes every open
 *   connection, so each connection it parses starts at a request boundary.
 * Every mode applies to the connections already open, not only to new ones.
 */
export type ProxyMode =
  | { readonly kind: "pass" }
  | { readonly kind: "drop" }
  | { readonly kind: "delay"; readonly delayMs: number }
  | { readonly kind: "reset" }
  | {
      readonly kind: "http-error";
      readonly fraction: number;
      readonly status: number;
      readonly body: string;
      /** In [0, 1): the seeded draw deciding each request (the nemesis never calls Math.random). */
      readonly draw: () => number;
    };

/** DynamoDB's answer to a request over the table's provisioned throughput (HTTP 400). */
export const DYNAMODB_THROTTLED = JSON.stringify({
  __type: "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
  message:
    "The level of configured provisioned throughput for the table was exceeded. Consider increasing your provisioning level with the UpdateTable API.",
});

/** DynamoDB's answer to an internal failure (HTTP 500). */
export const DYNAMODB_INTERNAL_ERROR = JSON.stringify({
  __type: "com.amazon.coral.service#InternalFailure",
  message: "The request processing has failed because of an unknown error, exception or failure.",
});

export const PASS: ProxyMode = { kind: "pass" };

export interface ProxyStats {
  readonly accepted: number;
  readonly open: number;
  readonly bytesForwarded: number;
  readonly bytesDropped: number;
  readonly resets: number;
  /** Blackholed connections destroyed when a `drop` was healed. */
  readonly destroyedOnHeal: number;
  /** Requests the proxy answered itself in `http-error`. */
  readonly answered: number;
}

interface Link {
  /** Serial of the accepted connection: tells a tap's chunks of one stream from another's. */
  readonly id: number;
  readonly client: Socket;
  upstream: Socket | undefined;
  /** Swallowed bytes while in `drop`: the link is destroyed on heal. */
  blackholed: boolean;
  /** When the last delayed chunk of each direction is due, so chunks stay in order. */
  dueUp: number;
  dueDown: number;
  closed: boolean;
  /** `http-error`: bytes of a request not yet complete. */
  request: Buffer;
}

export function describeMode(mode: ProxyMode): string {
  if (mode.kind === "delay") return `delay ${mode.delayMs} ms`;
  if (mode.kind === "http-error") return `HTTP ${mode.status} for ${Math.round(mode.fraction * 100)}%`;
  return mode.kind;
}

/** An in-process TCP proxy on a free 127.0.0.1 port in front of `upstreamHost:upstreamPort`. */
export class TcpProxy {
  readonly upstreamHost: string;
  readonly upstreamPort: number;
  readonly name: string;
  #server: Server | undefined;
  /** Listeners on other addresses of the same port (`listenAlso`). */
  readonly #extra: Server[] = [];
  #port = 0;
  #mode: ProxyMode = PASS;
  readonly #links = new Set<Link>();
  readonly #timers = new Set<NodeJS.Timeout>();
  #accepted = 0;
  #bytesForwarded = 0;
  #bytesDropped = 0;
  #resets = 0;
  #destroyedOnHeal = 0;
  #answered = 0;
  /**
   * Sees every chunk the upstream sends that is forwarded to the client (what the client reads),
   * with its connection's serial; the nemesis reads the commands agents receive through it.
   */
  tap: ((chunk: Buffer, link: number) => void) | undefined;

  constructor(upstreamHost: string, upstreamPort: number, name = `${upstreamHost}:${upstreamPort}`) {
    this.upstreamHost = upstreamHost;
    this.upstreamPort = upstreamPort;
    this.name = name;
  }

  /** A proxy in front of the host:port of an `http://host:port` URL. */
  static forUrl(url: string, name?: string): TcpProxy {
    const parsed = new URL(url);
    const port = Number(parsed.port || (parsed.protocol === "https:" ? 443 : 80));
    return new TcpProxy(parsed.hostname, port, name ?? url);
  }

  get port(): number {
    return this.#port;
  }

  /** The upstream URL with the proxy's host and port instead (same scheme and path). */
  urlFor(upstreamUrl: string): string {
    const parsed = new URL(upstreamUrl);
    parsed.hostname = "127.0.0.1";
    parsed.port = String(this.#port);
    return parsed.toString().replace(/\/$/, "");
  }

  get mode(): ProxyMode {
    return this.#mode;
  }

  async start(): Promise<void> {
    if (this.#server) return;
    const server = createServer((client) => this.#accept(client));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
    const address = server.address();
    if (!address || typeof address !== "object") throw new Error("the proxy got no port");
    this.#port = address.port;
    this.#server = server;
  }

  /**
   * Accepts on `host` too, same port (the network lab's AWS address, which nodes in their
   * namespaces reach while 127.0.0.1 is their own loopback). After `start`.
   */
  async listenAlso(host: string): Promise<void> {
    const server = createServer((client) => this.#accept(client));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.#port, host, () => resolve());
    });
    this.#extra.push(server);
  }

  /** Switches the mode; applies to open connections at once (see ProxyMode). */
  setMode(mode: ProxyMode): void {
    const previous = this.#mode;
    this.#mode = mode;
    if (previous.kind === "drop" && mode.kind !== "drop") {
      for (const link of [...this.#links]) {
        if (!link.blackholed) continue;
        this.#destroyedOnHeal++;
        this.#close(link);
      }
    }
    if (mode.kind === "reset") {
      for (const link of [...this.#links]) this.#reset(link);
    }
    if (mode.kind === "drop") {
      // Open connections are blackholed from now on: they do not escape the fault.
      for (const link of this.#links) link.blackholed = true;
    }
    if ((previous.kind === "http-error") !== (mode.kind === "http-error")) {
      for (const link of [...this.#links]) this.#close(link);
    }
  }

  heal(): void {
    this.setMode(PASS);
  }

  stats(): ProxyStats {
    return {
      accepted: this.#accepted,
      open: this.#links.size,
      bytesForwarded: this.#bytesForwarded,
      bytesDropped: this.#bytesDropped,
      resets: this.#resets,
      destroyedOnHeal: this.#destroyedOnHeal,
      answered: this.#answered,
    };
  }

  /** Closes the listener and every connection. */
  async stop(): Promise<void> {
    for (const timer of this.#timers) clearTimeout(timer);
    this.#timers.clear();
    for (const link of [...this.#links]) this.#close(link);
    const server = this.#server;
    this.#server = undefined;
    const servers = [...(server ? [server] : []), ...this.#extra.splice(0)];
    await Promise.all(servers.map((one) => new Promise<void>((resolve) => one.close(() => resolve()))));
  }

  #accept(client: Socket): void {
    this.#accepted++;
    const link: Link = {
      id: this.#accepted,
      client,
      upstream: undefined,
      blackholed: false,
      dueUp: 0,
      dueDown: 0,
      closed: false,
      request: Buffer.alloc(0),
    };
    this.#links.add(link);
    client.setNoDelay(true);
    client.on("error", () => this.#close(link));
    client.on("close", () => this.#close(link));
    if (this.#mode.kind === "reset") {
      this.#reset(link);
      return;
    }
    if (this.#mode.kind === "drop") link.blackholed = true;
    else this.#connectUpstream(link);
    client.on("data", (chunk: Buffer) => this.#forward(link, chunk, "up"));
  }

  #connectUpstream(link: Link): void {
    const upstream = connect(this.upstreamPort, this.upstreamHost);
    upstream.setNoDelay(true);
    link.upstream = upstream;
    upstream.on("error", () => this.#close(link));
    upstream.on("close", () => this.#close(link));
    upstream.on("data", (chunk: Buffer) => this.#forward(link, chunk, "down"));
  }

  #forward(link: Link, chunk: Buffer, direction: "up" | "down"): void {
    if (link.closed) return;
    const mode = this.#mode;
    if (mode.kind === "drop" || link.blackholed) {
      link.blackholed = true;
      this.#bytesDropped += chunk.length;
      return;
    }
    if (mode.kind === "reset") {
      this.#reset(link);
      return;
    }
    if (mode.kind === "http-error" && direction === "up") {
      this.#answerSome(link, chunk, mode);
      return;
    }
    if (direction === "down") this.tap?.(chunk, link.id);
    if (direction === "up" && link.upstream === undefined) this.#connectUpstream(link);
    const target = direction === "up" ? link.upstream : link.client;
    if (!target) return;
    if (mode.kind === "delay" && mode.delayMs > 0) {
      const now = performance.now();
      const previous = direction === "up" ? link.dueUp : link.dueDown;
      const due = Math.max(now + mode.delayMs, previous);
      if (direction === "up") link.dueUp = due;
      else link.dueDown = due;
      const timer = setTimeout(() => {
        this.#timers.delete(timer);
        if (link.closed || link.blackholed) return;
        this.#bytesForwarded += chunk.length;
        target.write(chunk);
      }, due - now);
      this.#timers.add(timer);
      return;
    }
    // A chunk delayed earlier may still be due: keep the order.
    const pending = direction === "up" ? link.dueUp : link.dueDown;
    if (pending > performance.now()) {
      const timer = setTimeout(() => {
        this.#timers.delete(timer);
        if (link.closed || link.blackholed) return;
        this.#bytesForwarded += chunk.length;
        target.write(chunk);
      }, pending - performance.now());
      this.#timers.add(timer);
      return;
    }
    this.#bytesForwarded += chunk.length;
    target.write(chunk);
  }

  /** `http-error`: splits the client's bytes into requests; answers some, forwards the others. */
  #answerSome(link: Link, chunk: Buffer, mode: Extract<ProxyMode, { kind: "http-error" }>): void {
    link.request = Buffer.concat([link.request, chunk]);
    for (;;) {
      const headerEnd = link.request.indexOf("\r\n\r\n");
      if (headerEnd < 0) return;
      const head = link.request.subarray(0, headerEnd).toString("latin1");
      const length = Number(/\r\ncontent-length:\s*(\d+)/i.exec(head)?.[1] ?? 0);
      const end = headerEnd + 4 + length;
      if (link.request.length < end) return;
      const request = link.request.subarray(0, end);
      link.request = link.request.subarray(end);
      if (mode.draw() < mode.fraction) {
        this.#answered++;
        const body = Buffer.from(mode.body);
        link.client.write(
          `HTTP/1.1 ${mode.status} ${mode.status === 400 ? "Bad Request" : "Internal Server Error"}\r\n` +
            "Content-Type: application/x-amz-json-1.0\r\n" +
            `x-amzn-RequestId: nemesis-${this.#answered}\r\n` +
            `Content-Length: ${body.length}\r\n` +
            "Connection: keep-alive\r\n\r\n",
        );
        link.client.write(body);
        continue;
      }
      if (link.upstream === undefined) this.#connectUpstream(link);
      this.#bytesForwarded += request.length;
      link.upstream?.write(request);
    }
  }

  #reset(link: Link): void {
    if (link.closed) return;
    this.#resets++;
    link.closed = true;
    this.#links.delete(link);
    link.client.resetAndDestroy();
    link.upstream?.resetAndDestroy();
  }

  #close(link: Link): void {
    if (link.closed) return;
    link.closed = true;
    this.#links.delete(link);
    link.client.destroy();
    link.upstream?.destroy();
  }
}
