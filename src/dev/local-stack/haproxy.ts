import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { freePort, type ManagedProcess, requireCommand, startProcess, waitUntilReady } from "./processes.ts";

/**
 * A real HAProxy in front of a shard's nodes, routing TCP to the one node whose agent answers
 * `GET /primary` with 200 (docs/http.md): the configuration users put in front of Shardguard
 * for clients that cannot speak Sentinel. Tests and `bench:failover` start it on 127.0.0.1.
 */

export interface HaproxyBackend {
  readonly id: string;
  /** host:port of the node's database. */
  readonly redis: string;
  /** host:port of the node's agent HTTP endpoint (`--http-port`). */
  readonly http: string;
}

export interface HaproxyOptions {
  /** ms between two checks of a server (`inter`). @default 500 */
  readonly checkIntervalMs?: number;
}

/** One server's state in HAProxy's `show stat`. */
export interface ServerState {
  readonly id: string;
  /** `UP`, `DOWN`, `MAINT`, `UP 1/2`, ... as HAProxy prints it. */
  readonly status: string;
}

/** The haproxy.cfg of a primary-only TCP frontend, checked by the agents' `/primary`. */
export function haproxyConfig(
  listen: string,
  socket: string,
  backends: readonly HaproxyBackend[],
  options: HaproxyOptions = {},
): string {
  const inter = options.checkIntervalMs ?? 500;
  const servers = backends.map((backend) => {
    const [host, port] = splitAddress(backend.http);
    return `  server ${backend.id} ${backend.redis} check addr ${host} port ${port}`;
  });
  return [
    "global",
    "  maxconn 512",
    `  stats socket ${socket} mode 600 level admin`,
    "defaults",
    "  mode tcp",
    "  timeout connect 1s",
    "  timeout client 60s",
    "  timeout server 60s",
    "  timeout check 1s",
    "frontend redis_primary",
    `  bind ${listen}`,
    "  default_backend primary",
    "backend primary",
    "  option httpchk GET /primary",
    "  http-check expect status 200",
    // A server marked down drops its clients at once, so none keeps writing to a deposed primary.
    `  default-server inter ${inter} fall 1 rise 1 on-marked-down shutdown-sessions`,
    ...servers,
    "",
  ].join("\n");
}

function splitAddress(address: string): [string, string] {
  const colon = address.lastIndexOf(":");
  return [address.slice(0, colon), address.slice(colon + 1)];
}

/** Parses `show stat` CSV: the servers of backend `primary`. */
export function parseServerStates(csv: string): ServerState[] {
  const lines = csv.split("\n").filter((line) => line.length > 0);
  const header = lines[0]?.replace(/^# /, "").split(",") ?? [];
  const proxy = header.indexOf("pxname");
  const server = header.indexOf("svname");
  const status = header.indexOf("status");
  return lines
    .slice(1)
    .map((line) => line.split(","))
    .filter(
      (fields) =>
        fields[proxy] === "primary" && fields[server] !== "BACKEND" && fields[server] !== "FRONTEND",
    )
    .map((fields) => ({ id: fields[server] ?? "", status: fields[status] ?? "" }));
}

export class Haproxy {
  readonly address: string;
  readonly #dir: string;
  readonly #socket: string;
  readonly #process: ManagedProcess;

  private constructor(address: string, dir: string, socket: string, process: ManagedProcess) {
    this.address = address;
    this.#dir = dir;
    this.#socket = socket;
    this.#process = process;
  }

  static async start(backends: readonly HaproxyBackend[], options: HaproxyOptions = {}): Promise<Haproxy> {
    requireCommand("haproxy", ["-v"], "install it with `apt-get install haproxy`");
    const dir = mkdtempSync(join(tmpdir(), "shardguard-haproxy-"));
    const socket = join(dir, "admin.sock");
    const address = `127.0.0.1:${await freePort()}`;
    const config = join(dir, "haproxy.cfg");
    writeFileSync(config, haproxyConfig(address, socket, backends, options));
    // -db: stay in the foreground, so the process is ours to stop by its PID.
    const process = startProcess("haproxy", "haproxy", ["-db", "-f", config]);
    const proxy = new Haproxy(address, dir, socket, process);
    try {
      await waitUntilReady(process, () => proxy.servers(), 10_000, `haproxy -f ${config}`);
    } catch (error) {
      await proxy.stop();
      throw error;
    }
    return proxy;
  }

  /** The last lines HAProxy printed (alerts, warnings). */
  output(): string {
    return this.#process.output();
  }

  /** `show stat` as HAProxy prints it (CSV), for a failure message. */
  rawStats(): Promise<string> {
    return this.#ask("show stat");
  }

  /** The backend's servers as HAProxy sees them now. */
  async servers(): Promise<ServerState[]> {
    return parseServerStates(await this.#ask("show stat"));
  }

  #ask(command: string): Promise<string> {
    return new Promise((resolve, reject) => {
      const socket = connect(this.#socket);
      let reply = "";
      socket.setTimeout(2000, () => socket.destroy(new Error(`haproxy: no answer to "${command}"`)));
      socket.on("data", (chunk) => {
        reply += chunk.toString();
      });
      socket.on("error", reject);
      socket.on("end", () => resolve(reply));
      socket.write(`${command}\n`);
    });
  }

  async stop(): Promise<void> {
    await this.#process.stop();
    rmSync(this.#dir, { recursive: true, force: true });
  }
}
