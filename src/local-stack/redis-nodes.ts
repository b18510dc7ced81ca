import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Redis, type RedisOptions } from "ioredis";
import { freePort, type ManagedProcess, requireCommand, startProcess, waitUntilReady } from "./processes.ts";

/** One redis-server process on 127.0.0.1 that tests and the demo can kill, pause and restart. */
export class RedisNode {
  private proc: ManagedProcess | undefined;
  private readonly dir: string;

  readonly port: number;
  readonly id: string;

  constructor(port: number, id: string) {
    this.port = port;
    this.id = id;
    this.dir = mkdtempSync(join(tmpdir(), `shardguard-redis-${port}-`));
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** The directory redis-server runs in: its `dump.rdb`, never the working directory. */
  get dataDir(): string {
    return this.dir;
  }

  /**
   * Deletes the node's data files (`dump.rdb`, temp files), as on a host that lost its disk, so
   * the next `start()` comes up empty. Only while the server is stopped.
   */
  wipeData(): void {
    if (this.running)
      throw new Error(`redis-server :${this.port} is running; stop it before wiping its data`);
    for (const entry of readdirSync(this.dir))
      rmSync(join(this.dir, entry), { recursive: true, force: true });
  }

  get pid(): number | undefined {
    return this.proc?.child.pid;
  }

  get running(): boolean {
    const child = this.proc?.child;
    return child !== undefined && child.exitCode === null && child.signalCode === null;
  }

  /** Starts redis-server (optionally as a replica of `replicaOf`) and waits for PING. */
  async start(
    options: {
      replicaOf?: string;
      timeoutMs?: number;
      /** More redis-server arguments (e.g. the config a supervisor starts it with). */
      extraArgs?: readonly string[];
    } = {},
  ): Promise<void> {
    const args = [
      "--port",
      String(this.port),
      "--bind",
      "127.0.0.1",
      "--dir",
      this.dir,
      "--save",
      "",
      "--appendonly",
      "no",
      "--daemonize",
      "no",
      "--protected-mode",
      "no",
      "--loglevel",
      "warning",
      "--repl-diskless-sync",
      "yes",
      "--repl-diskless-sync-delay",
      "0",
      // DEBUG SLEEP from loopback only: the tests freeze a node with it.
      "--enable-debug-command",
      "local",
    ];
    if (options.replicaOf) {
      const [host, port] = options.replicaOf.split(":");
      args.push("--replicaof", host ?? "127.0.0.1", port ?? "6379");
    }
    args.push(...(options.extraArgs ?? []));
    this.proc = startProcess(`redis-server :${this.port}`, "redis-server", args);
    const client = this.client({ maxRetriesPerRequest: 0, retryStrategy: () => null, lazyConnect: true });
    // Refused connections while the server boots are expected; the probe reports them.
    client.on("error", () => {});
    try {
      await waitUntilReady(
        this.proc,
        async () => {
          if (client.status !== "ready") await client.connect().catch(() => client.disconnect());
          return client.ping();
        },
        options.timeoutMs ?? 10_000,
        `port ${this.port}; is the port taken?`,
      );
    } finally {
      client.disconnect();
    }
  }

  /** Sends a signal (SIGKILL to crash, SIGSTOP/SIGCONT to freeze) to the redis-server process. */
  signal(signal: NodeJS.Signals): void {
    this.proc?.child.kill(signal);
  }

  async stop(): Promise<void> {
    if (this.proc?.child.signalCode === null) this.proc.child.kill("SIGCONT");
    await this.proc?.stop(2000);
  }

  /** A new client to this node; the caller disconnects it. */
  client(options: RedisOptions = {}): Redis {
    return new Redis(this.port, "127.0.0.1", options);
  }

  async destroy(): Promise<void> {
    await this.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export function checkRedisServer(): void {
  requireCommand("redis-server", ["--version"], "install it with: apt-get install -y redis-server");
}

/** Starts `count` redis-server nodes on free ports: the first a primary, the rest its replicas. */
export async function startRedisNodes(count: number): Promise<RedisNode[]> {
  if (count <= 0) return [];
  checkRedisServer();
  const nodes: RedisNode[] = [];
  try {
    for (let index = 0; index < count; index++) {
      const node = new RedisNode(await freePort(), `node-${index + 1}`);
      nodes.push(node);
      await node.start(index === 0 ? {} : { replicaOf: nodes[0]?.address });
    }
    return nodes;
  } catch (error) {
    await Promise.all(nodes.map((node) => node.destroy()));
    throw error;
  }
}
