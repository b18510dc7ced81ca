import { connect, createServer, type Server, type Socket } from "node:net";

/**
 * A TCP proxy for one replica's replication link that can hold back the primary's stream: the
 * replica stays connected (`master_link_status:up`, `INFO` answers, heartbeats fresh) but stops
 * receiving writes, so its offset falls behind by exactly what was written while held. When the
 * primary dies, the held bytes are dropped with the connection: the replica is left lagging, as
 * one behind a slow network link would be. Deterministic, unlike racing a reconnect.
 */
export class ReplicationStallProxy {
  readonly #targetPort: number;
  readonly #sockets = new Set<Socket>();
  #server: Server | undefined;
  #held = false;
  #streams: Array<{ client: Socket; pending: Buffer[] }> = [];
  port = 0;

  constructor(targetPort: number) {
    this.#targetPort = targetPort;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    const server = createServer((client) => {
      const upstream = connect(this.#targetPort, "127.0.0.1");
      const stream = { client, pending: [] as Buffer[] };
      this.#streams.push(stream);
      for (const socket of [client, upstream]) {
        this.#sockets.add(socket);
        socket.on("error", () => {});
        // Either side gone: drop the other, and with it whatever was held back.
        socket.on("close", () => {
          this.#sockets.delete(socket);
          this.#streams = this.#streams.filter((candidate) => candidate !== stream);
          client.destroy();
          upstream.destroy();
        });
      }
      client.on("data", (chunk: Buffer) => upstream.write(chunk));
      // Keep reading while held, so that the primary's death is seen at once.
      upstream.on("data", (chunk: Buffer) => {
        if (this.#held) stream.pending.push(chunk);
        else client.write(chunk);
      });
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
    const address = server.address();
    if (address && typeof address === "object") this.port = address.port;
    this.#server = server;
  }

  /** From now on the primary's bytes are kept here instead of reaching the replica. */
  hold(): void {
    this.#held = true;
  }

  /** Delivers what was held and forwards again. */
  release(): void {
    this.#held = false;
    for (const stream of this.#streams) {
      for (const chunk of stream.pending) stream.client.write(chunk);
      stream.pending = [];
    }
  }

  /** Bytes held back right now. */
  get heldBytes(): number {
    return this.#streams.reduce((sum, stream) => sum + stream.pending.reduce((n, c) => n + c.length, 0), 0);
  }

  async close(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    this.#sockets.clear();
    const server = this.#server;
    this.#server = undefined;
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}
