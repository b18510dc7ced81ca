import type { Redis } from "ioredis";
import { afterEach, describe, expect, it } from "vitest";
import { parseReplicationInfo } from "../../src/agent/redis-info.ts";
import { type RedisNode, startRedisNodes } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  type Driver,
  ModelDriver,
  type NodeName,
  type Observation,
  SCENARIOS,
} from "../../src/dev/sim/conformance.ts";

/**
 * Fidelity of the simulator's redis-server model (src/dev/sim/redis-model.ts): each scenario of
 * src/dev/sim/conformance.ts runs against three real redis-server processes and against the model,
 * and what a client observes must be the same. A difference is a bug in the model.
 */

class RealDriver implements Driver {
  readonly nodes: Record<NodeName, RedisNode>;
  readonly #clients = new Map<NodeName, Redis>();

  constructor(nodes: readonly RedisNode[]) {
    const [a, b, c] = nodes as [RedisNode, RedisNode, RedisNode];
    this.nodes = { a, b, c };
  }

  #client(node: NodeName): Redis {
    let client = this.#clients.get(node);
    if (!client) {
      client = this.nodes[node].client();
      this.#clients.set(node, client);
    }
    return client;
  }

  async command(node: NodeName, args: readonly string[]) {
    const [name, ...rest] = args as [string, ...string[]];
    return (await this.#client(node).call(name, ...rest)) as string | number | string[];
  }

  async info(node: NodeName) {
    const text = String(await this.#client(node).info());
    const field = (name: string) => Number(new RegExp(`^${name}:(\\d+)`, "m").exec(text)?.[1] ?? 0);
    const keys = Number(await this.#client(node).dbsize());
    return {
      ...parseReplicationInfo(text),
      syncFull: field("sync_full"),
      syncPartialOk: field("sync_partial_ok"),
      keys,
      backlog: field("repl_backlog_active") === 1,
    };
  }

  async replicaOf(node: NodeName, primary: NodeName) {
    await this.#client(node).replicaof("127.0.0.1", this.nodes[primary].port);
  }

  async pause(node: NodeName) {
    this.nodes[node].signal("SIGSTOP");
  }

  async resume(node: NodeName) {
    this.nodes[node].signal("SIGCONT");
  }

  /**
   * SAVE, once no background save runs: a replica's full sync starts a BGSAVE on its master, and
   * Redis refuses SAVE meanwhile ("ERR Background save already in progress"; a CI run's flake).
   */
  async save(node: NodeName) {
    const client = this.#client(node);
    const deadline = Date.now() + 10_000;
    for (;;) {
      try {
        await client.save();
        return;
      } catch (error) {
        const busy = error instanceof Error && /Background save already in progress/.test(error.message);
        if (!busy || Date.now() > deadline) throw error;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    }
  }

  async restart(node: NodeName, from: "rdb" | "empty") {
    this.#clients.get(node)?.disconnect();
    this.#clients.delete(node);
    const server = this.nodes[node];
    server.signal("SIGKILL");
    await server.stop();
    if (from === "empty") server.wipeData();
    await server.start();
  }

  async kill(node: NodeName) {
    for (const clients of [this.#clients, this.#asides]) {
      clients.get(node)?.disconnect();
      clients.delete(node);
    }
    const server = this.nodes[node];
    server.signal("SIGKILL");
    await server.stop();
  }

  async startKilled(node: NodeName, _from: "rdb", options: { replicaOf?: NodeName | "unreachable" } = {}) {
    const { replicaOf } = options;
    await this.nodes[node].start(
      replicaOf === undefined
        ? {}
        : { replicaOf: replicaOf === "unreachable" ? "127.0.0.1:1" : this.nodes[replicaOf].address },
    );
  }

  readonly #asides = new Map<NodeName, Redis>();

  async send(node: NodeName, args: readonly string[]) {
    let client = this.#asides.get(node);
    if (!client) {
      client = this.nodes[node].client();
      this.#asides.set(node, client);
    }
    const [name, ...rest] = args as [string, ...string[]];
    const reply = client.call(name, ...rest) as Promise<string | number | string[]>;
    // Handled by the scenario when it awaits it; not an unhandled rejection meanwhile.
    reply.catch(() => {});
    return { reply };
  }

  async sleep(ms: number) {
    await new Promise((resolve) => setTimeout(resolve, ms));
  }

  close() {
    for (const client of [...this.#clients.values(), ...this.#asides.values()]) client.disconnect();
  }
}

let nodes: RedisNode[] = [];
let real: RealDriver | undefined;
afterEach(async () => {
  real?.close();
  real = undefined;
  for (const node of nodes) {
    node.signal("SIGCONT");
    await node.stop();
  }
  nodes = [];
});

async function onModel(scenario: (driver: Driver) => Promise<Observation>): Promise<Observation> {
  const model = new ModelDriver();
  await model.start();
  try {
    return await scenario(model);
  } finally {
    model.stop();
  }
}

describe("the redis-server model conforms to redis-server", () => {
  for (const [name, scenario] of Object.entries(SCENARIOS)) {
    it(name, async () => {
      // Prepare
      nodes = await startRedisNodes(3);
      real = new RealDriver(nodes);

      // Act
      const expected = await scenario(real);
      const observed = await onModel(scenario);

      // Assess
      expect(observed).toEqual(expected);
    }, 60_000);
  }
});
