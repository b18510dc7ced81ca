import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Redis, type RedisOptions } from "ioredis";
import { FENCED_MIN_REPLICAS } from "../../core/write-guard.ts";
import { freePort, type ManagedProcess, requireCommand, startProcess, waitUntilReady } from "./processes.ts";

/**
 * redis-server arguments of a restart, as docs/deploy.md asks of a supervisor's config file:
 * writes refused until the agent has judged the new process and applied the write guard.
 */
export const FENCED_START_ARGS: readonly string[] = [
  "--min-replicas-to-write",
  String(FENCED_MIN_REPLICAS),
  "--min-replicas-max-lag",
  "2",
];

/** PEM files of one node: the CA that signs every node and client, and the node's own pair. */
export interface RedisTlsFiles {
  readonly caFile: string;
  /** The node's certificate: served to clients, and shown to its primary when it replicates. */
  readonly certFile: string;
  readonly keyFile: string;
}

/** A node secured the way production runs it (docs/agent.md#tls-and-acl-users). @default plain TCP, the default user */
export interface RedisSecurity {
  /** TLS-only port (no plain one), `tls-replication yes`, client certificates required; per node id. */
  readonly tls?: (id: string) => RedisTlsFiles;
  /** ACL `user` directives as redis.conf spells them after `user`, e.g. `default off`. */
  readonly users?: readonly string[];
  /** The user replication (`masteruser`) and this module's clients (readiness, tests) log in as. */
  readonly admin?: { readonly username: string; readonly password: string };
}

/** Where a node runs in the network lab (src/dev/netlab): its namespace, and its address there. */
export interface NodeNetwork {
  readonly namespace: string;
  readonly host: string;
}

/** One redis-server process on 127.0.0.1 that tests and the demo can kill, pause and restart. */
export class RedisNode {
  private proc: ManagedProcess | undefined;
  private readonly dir: string;
  private readonly security: RedisSecurity;

  readonly port: number;
  readonly id: string;
  /** Extra environment of every start of this redis-server (e.g. a clock shim preloaded). */
  env: NodeJS.ProcessEnv | undefined;
  /** Set: the server runs inside this namespace, bound to its address there. @default 127.0.0.1 */
  network: NodeNetwork | undefined;

  constructor(port: number, id: string, security: RedisSecurity = {}) {
    this.port = port;
    this.id = id;
    this.security = security;
    this.dir = mkdtempSync(join(tmpdir(), `shardguard-redis-${port}-`));
  }

  get address(): string {
    return `${this.network?.host ?? "127.0.0.1"}:${this.port}`;
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
    const tls = this.security.tls?.(this.id);
    const args = [
      ...(tls
        ? [
            ...["--port", "0", "--tls-port", String(this.port), "--tls-replication", "yes"],
            ...[
              "--tls-cert-file",
              tls.certFile,
              "--tls-key-file",
              tls.keyFile,
              "--tls-ca-cert-file",
              tls.caFile,
            ],
          ]
        : ["--port", String(this.port)]),
      "--bind",
      this.network?.host ?? "127.0.0.1",
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
      // DEBUG SLEEP from loopback only: the tests freeze a node with it. In the network lab the
      // host is not loopback to the node, so from anywhere.
      "--enable-debug-command",
      this.network ? "yes" : "local",
    ];
    for (const user of this.security.users ?? []) args.push("--user", ...user.split(/\s+/));
    const admin = this.security.admin;
    if (admin) args.push("--masteruser", admin.username, "--masterauth", admin.password);
    if (options.replicaOf) {
      const [host, port] = options.replicaOf.split(":");
      args.push("--replicaof", host ?? "127.0.0.1", port ?? "6379");
    }
    args.push(...(options.extraArgs ?? []));
    const [command, argv]: [string, string[]] = this.network
      ? ["ip", ["netns", "exec", this.network.namespace, "redis-server", ...args]]
      : ["redis-server", args];
    this.proc = startProcess(
      `redis-server :${this.port}`,
      command,
      argv,
      this.env ? { env: { ...process.env, ...this.env } } : {},
    );
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

  /** A new client to this node (as the admin user, over TLS when the node serves TLS); the caller disconnects it. */
  client(options: RedisOptions = {}): Redis {
    const tls = this.security.tls?.(this.id);
    return new Redis(this.port, this.network?.host ?? "127.0.0.1", {
      ...(this.security.admin ?? {}),
      ...(tls
        ? {
            tls: {
              ca: readFileSync(tls.caFile),
              cert: readFileSync(tls.certFile),
              key: readFileSync(tls.keyFile),
            },
          }
        : {}),
      ...options,
    });
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
export async function startRedisNodes(
  count: number,
  security: RedisSecurity = {},
  env?: (id: string) => NodeJS.ProcessEnv | undefined,
  network?: (id: string) => NodeNetwork | undefined,
): Promise<RedisNode[]> {
  if (count <= 0) return [];
  checkRedisServer();
  const nodes: RedisNode[] = [];
  try {
    for (let index = 0; index < count; index++) {
      const node = new RedisNode(await freePort(), `node-${index + 1}`, security);
      node.env = env?.(node.id);
      node.network = network?.(node.id);
      nodes.push(node);
      await node.start(index === 0 ? {} : { replicaOf: nodes[0]?.address });
    }
    return nodes;
  } catch (error) {
    await Promise.all(nodes.map((node) => node.destroy()));
    throw error;
  }
}
