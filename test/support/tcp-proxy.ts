import { connect, createServer, type Server, type Socket } from "node:net";

/**
 * A TCP proxy on 127.0.0.1 that a test can cut and restore: a real network failure between a
 * client and a server (connections reset, new ones refused), not a mocked error.
 */
export class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  readonly targetHost: string;
  readonly targetPort: number;
  port = 0;
  /** Client bytes that make the proxy reset the connection before they reach the server. */
  private resetOn: Buffer | undefined;
  /** Requests seen per `X-Amz-Target` (the DynamoDB operation), forwarded or not. */
  private readonly targets = new Map<string, number>();
  /** Client bytes whose request reaches the server, but whose answer is replaced by a reset. */
  private loseAnswerOn: Buffer | undefined;

  constructor(targetHost: string, targetPort: number) {
    this.targetHost = targetHost;
    this.targetPort = targetPort;
  }

  /** Starts listening (on a free port the first time, on the same port after a cut). */
  async start(): Promise<void> {
    const server = createServer((client) => {
      const upstream = connect(this.targetPort, this.targetHost);
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on("close", () => this.sockets.delete(socket));
        socket.on("error", () => {
          client.destroy();
          upstream.destroy();
        });
      }
      let loseAnswer = false;
      client.on("data", (chunk: Buffer) => {
        // One request's headers arrive in one chunk on loopback: enough to single out a request type.
        const target = /x-amz-target:\s*([^\r\n]+)/i.exec(chunk.toString("latin1"))?.[1]?.trim();
        if (target !== undefined) this.targets.set(target, (this.targets.get(target) ?? 0) + 1);
        if (this.resetOn !== undefined && chunk.includes(this.resetOn)) {
          client.destroy();
          upstream.destroy();
          return;
        }
        if (this.loseAnswerOn !== undefined && chunk.includes(this.loseAnswerOn)) loseAnswer = true;
        if (!upstream.write(chunk)) {
          client.pause();
          upstream.once("drain", () => client.resume());
        }
      });
      client.on("end", () => upstream.end());
      upstream.on("data", (chunk: Buffer) => {
        if (loseAnswer) {
          // The server has done the request and answered: the client never hears it.
          client.resetAndDestroy();
          upstream.destroy();
          return;
        }
        if (!client.write(chunk)) {
          upstream.pause();
          client.once("drain", () => upstream.resume());
        }
      });
      upstream.on("end", () => client.end());
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.port, "127.0.0.1", () => resolve());
    });
    const address = server.address();
    if (address && typeof address === "object") this.port = address.port;
    this.server = server;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /**
   * Resets each connection on which the client sends `marker` (e.g. the `X-Amz-Target` of one
   * DynamoDB operation), before the request reaches the server; `undefined` passes everything again.
   * A partial outage: some calls fail while others get through.
   */
  resetRequestsContaining(marker: string | undefined): void {
    this.resetOn = marker === undefined ? undefined : Buffer.from(marker);
  }

  /** How many requests for `target` (e.g. "DynamoDB_20120810.Query") the client sent through. */
  requests(target: string): number {
    return this.targets.get(target) ?? 0;
  }

  /**
   * Lets each request containing `marker` reach the server, then resets the connection in place of
   * its answer: the request took effect, and the client sees a network error (an ambiguous
   * outcome, as a timeout after a commit). `undefined` passes every answer again.
   */
  loseAnswersTo(marker: string | undefined): void {
    this.loseAnswerOn = marker === undefined ? undefined : Buffer.from(marker);
  }

  /** Resets every open connection and refuses new ones until `start()`. */
  async cut(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    for (const socket of this.sockets) socket.destroy();
    this.sockets.clear();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  async close(): Promise<void> {
    await this.cut();
  }
}
