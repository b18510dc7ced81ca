import { readFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import fc from "fast-check";
import { Redis, type RedisOptions } from "ioredis";
import { afterEach, describe, expect, it, vi } from "vitest";
import { silentLogger } from "../../src/adapters/observability.ts";
import type { AgentDeps } from "../../src/agent/context.ts";
import { parseAgentOptions, resolveAgentOptions } from "../../src/agent/options.ts";
import { maxSentinelConnections, SentinelEndpoint, sentinelBind } from "../../src/agent/sentinel-endpoint.ts";
import { applicationClientIds } from "../../src/agent/sentinel-eviction.ts";
import { SentinelFeed } from "../../src/agent/sentinel-feed.ts";
import { encodeFrame, RequestReader } from "../../src/agent/sentinel-resp.ts";
import {
  announcedAddress,
  type SentinelLimits,
  SentinelServer,
  type SentinelTls,
} from "../../src/agent/sentinel-server.ts";
import type { AuthThrottlePolicy } from "../../src/agent/sentinel-throttle.ts";
import type { Topology } from "../../src/core/model.ts";
import type { ShardSnapshot } from "../../src/core/ports.ts";
import { RecordingLogger } from "../support/agent-harness.ts";
import { aHeartbeat, NOW } from "../support/builders.ts";
import { aTopology } from "../support/sentinel-builders.ts";
import { TestCertificates } from "../support/tls-certs.ts";
import { holdsFor, waitFor } from "../support/wait.ts";

/**
 * The Sentinel endpoint over real sockets with a scripted shard: what clients see on the wire
 * (RESP2 and RESP3, AUTH, pub/sub) and what bad input costs (an error reply or a closed
 * connection, never the server).
 */

const ONLINE = aTopology();

class ScriptedShard {
  topology: Topology | undefined = ONLINE;
  reads = 0;
  snapshot = async (): Promise<ShardSnapshot> => {
    this.reads++;
    return {
      shard: "s1",
      nodes: [
        aHeartbeat({
          node_id: "p1",
          role: "primary",
          node_address: "10.0.0.1:6379",
          primary_node_id: undefined,
        }),
        aHeartbeat({ node_id: "r1", node_address: "10.0.0.2:6379", sentinel_address: "10.0.0.2:26379" }),
      ],
      replicaSets: {},
      replicaSetVersions: {},
      topology: this.topology,
      lock: undefined,
      malformed: [],
    };
  };
}

const servers: SentinelServer[] = [];
const feeds: SentinelFeed[] = [];
const sockets: Socket[] = [];
const clients: Redis[] = [];

afterEach(async () => {
  for (const client of clients.splice(0)) client.disconnect();
  for (const socket of sockets.splice(0)) socket.destroy();
  for (const feed of feeds.splice(0)) feed.stop();
  await Promise.all(servers.splice(0).map((server) => server.close()));
});

async function anEndpoint(
  options: {
    password?: string;
    maxConnections?: number;
    refreshMs?: number;
    limits?: Partial<SentinelLimits>;
    authThrottle?: Partial<AuthThrottlePolicy>;
    tls?: SentinelTls;
  } = {},
): Promise<{ shard: ScriptedShard; feed: SentinelFeed; server: SentinelServer; port: number }> {
  const shard = new ScriptedShard();
  const feed = new SentinelFeed({
    shard: "s1",
    nodeId: "p1",
    failureTimeoutMs: 3000,
    refreshMs: options.refreshMs ?? 0,
    storeTimeoutMs: 1000,
    read: shard.snapshot,
    clock: { now: () => NOW },
    monotonicNow: () => performance.now(),
    logger: silentLogger,
  });
  const server = new SentinelServer({
    shard: "s1",
    host: "127.0.0.1",
    port: 0,
    password: options.password,
    feed,
    logger: silentLogger,
    limits: {
      ...options.limits,
      ...(options.maxConnections === undefined ? {} : { maxConnections: options.maxConnections }),
    },
    authThrottle: options.authThrottle,
    tls: options.tls,
  });
  feeds.push(feed);
  servers.push(server);
  const { port } = await server.listen();
  return { shard, feed, server, port };
}

function aClient(port: number, options: RedisOptions = {}): Redis {
  const client = new Redis({
    port,
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
    ...options,
  });
  client.on("error", () => {});
  clients.push(client);
  return client;
}

/** Sends raw bytes; resolves with everything the server wrote until it closed (or `untilMs`). */
function raw(
  port: number,
  bytes: string | Buffer,
  untilMs = 2000,
): Promise<{ text: string; closed: boolean }> {
  return new Promise((resolve) => {
    const socket = connect(port, "127.0.0.1");
    sockets.push(socket);
    let text = "";
    const timer = setTimeout(() => resolve({ text, closed: false }), untilMs);
    socket.on("data", (chunk) => {
      text += chunk.toString();
    });
    socket.on("error", () => {});
    socket.on("close", () => {
      clearTimeout(timer);
      resolve({ text, closed: true });
    });
    socket.write(bytes);
  });
}

describe("Sentinel endpoint: what clients see", () => {
  it.each([2, 3] as const)(
    "answers ioredis over RESP%s: the primary, the masters entry and ROLE",
    async (protocol) => {
      // Prepare
      const { port } = await anEndpoint();
      const client = aClient(port, { protocol });
      await client.connect();

      // Act
      const address = await client.call("SENTINEL", "get-master-addr-by-name", "s1");
      const masters = (await client.call("SENTINEL", "masters")) as unknown[];
      const role = await client.call("ROLE");

      // Assess
      expect(address).toEqual(["10.0.0.1", "6379"]);
      expect(masters).toHaveLength(1);
      expect(JSON.stringify(masters[0])).toContain("num-other-sentinels");
      expect(role).toEqual(["sentinel", ["s1"]]);
    },
  );

  it("answers HELLO with mode sentinel in the protocol asked, and NOPROTO for an unknown version", async () => {
    // Act
    const { port } = await anEndpoint();
    const hello3 = await raw(port, "*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n", 300);
    const hello4 = await raw(port, "*2\r\n$5\r\nHELLO\r\n$1\r\n4\r\n", 300);

    // Assess
    expect(hello3.text).toMatch(/^%7\r\n/);
    expect(hello3.text).toContain("$4\r\nmode\r\n$8\r\nsentinel\r\n");
    expect(hello3.text).toContain("$5\r\nproto\r\n:3\r\n");
    expect(hello4.text).toBe("-NOPROTO unsupported protocol version\r\n");
  });

  it("answers null, never the old primary, while the shard fails over", async () => {
    // Prepare
    const { shard, port } = await anEndpoint();
    shard.topology = { ...ONLINE, epoch: 4, status: "failing_over" };
    const client = aClient(port, { protocol: 2 });

    // Act
    const address = await client.call("SENTINEL", "get-master-addr-by-name", "s1");

    // Assess
    expect(address).toBeNull();
  });

  it("publishes +switch-master to SUBSCRIBE and PSUBSCRIBE clients when the topology names a new primary", async () => {
    // Prepare
    const { shard, feed, port } = await anEndpoint();
    const subscriber = aClient(port);
    const patterns = aClient(port, { protocol: 2 });
    const messages: string[] = [];
    subscriber.on("message", (channel: string, message: string) => messages.push(`${channel} ${message}`));
    patterns.on("pmessage", (pattern: string, channel: string) => messages.push(`${pattern} ${channel}`));
    await subscriber.subscribe("+switch-master");
    await patterns.psubscribe("+s*");
    await feed.refresh();

    // Act
    shard.topology = { ...ONLINE, epoch: 4, status: "failing_over" };
    await feed.refresh();
    shard.topology = { ...ONLINE, epoch: 4, primary_node_id: "r1", primary_address: "10.0.0.2:6379" };
    await feed.refresh();
    await waitFor(() => messages.length >= 3, "three published messages", 2000, 10);

    // Assess
    expect(messages.sort()).toEqual([
      "+s* +sdown",
      "+s* +switch-master",
      "+switch-master s1 10.0.0.1 6379 10.0.0.2 6379",
    ]);
  });

  it("requires the password when one is set, over AUTH (RESP2) and HELLO AUTH (RESP3)", async () => {
    // Prepare
    const { port } = await anEndpoint({ password: "s3cret" });

    // Act
    const none = await raw(port, "*1\r\n$4\r\nPING\r\n", 300);
    const wrong = await raw(port, "*2\r\n$4\r\nAUTH\r\n$4\r\nnope\r\n", 300);
    const resp2 = aClient(port, { protocol: 2, password: "s3cret" });
    const resp3 = aClient(port, { protocol: 3, password: "s3cret" });
    await resp2.connect();
    await resp3.connect();

    // Assess
    expect(none.text).toBe("-NOAUTH Authentication required.\r\n");
    expect(wrong.text).toBe("-WRONGPASS invalid username-password pair or user is disabled.\r\n");
    expect(await resp2.call("SENTINEL", "get-master-addr-by-name", "s1")).toEqual(["10.0.0.1", "6379"]);
    expect(await resp3.call("SENTINEL", "get-master-addr-by-name", "s1")).toEqual(["10.0.0.1", "6379"]);
  });

  it("accepts CLIENT SETNAME / SETINFO and keeps the connection after an unknown command", async () => {
    // Act
    const { port } = await anEndpoint();
    const answer = await raw(
      port,
      "*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$3\r\napp\r\n*1\r\n$3\r\nGET\r\n*2\r\n$6\r\nCLIENT\r\n$7\r\nGETNAME\r\n*1\r\n$4\r\nPING\r\n",
      300,
    );

    // Assess
    expect(answer.closed).toBe(false);
    expect(answer.text).toBe(
      "+OK\r\n-ERR unknown command 'GET', with args beginning with: \r\n$3\r\napp\r\n+PONG\r\n",
    );
  });

  it("reads the shard once for a crowd of clients asking at the same moment", async () => {
    // Prepare
    const { shard, port } = await anEndpoint({ refreshMs: 60_000 });
    const crowd = Array.from({ length: 20 }, () => aClient(port, { protocol: 2 }));

    // Act
    await Promise.all(crowd.map((client) => client.call("SENTINEL", "get-master-addr-by-name", "s1")));

    // Assess
    expect(shard.reads).toBe(1);
  });
});

describe("Sentinel endpoint: bad input costs a reply or a connection, never the server", () => {
  const cases: Array<{ what: string; bytes: string | Buffer; reply: RegExp }> = [
    { what: "an inline command", bytes: "PING\r\n", reply: /^-ERR Protocol error/ },
    { what: "a nested array", bytes: "*2\r\n*1\r\n$1\r\na\r\n$1\r\nb\r\n", reply: /^-ERR Protocol error/ },
    { what: "an array too long for any array", bytes: "*99999999999999\r\n", reply: /^-ERR Protocol error/ },
    {
      what: "a bulk string larger than the request limit",
      bytes: Buffer.concat([Buffer.from("*2\r\n$4\r\nPING\r\n$100000000\r\n"), Buffer.alloc(200_000, 97)]),
      reply: /^-ERR Protocol error: request larger than/,
    },
    {
      what: "too many arguments",
      bytes: `*100\r\n${"$1\r\na\r\n".repeat(100)}`,
      reply: /^-ERR Protocol error: more than 64 arguments/,
    },
  ];
  it.each(cases)(
    "closes the connection after an error reply on $what, and still serves others",
    async ({ bytes, reply }) => {
      // Prepare
      const { port } = await anEndpoint();

      // Act
      const answer = await raw(port, bytes);
      const after = aClient(port, { protocol: 2 });

      // Assess
      expect(answer.text).toMatch(reply);
      expect(answer.closed).toBe(true);
      expect(await after.ping()).toBe("PONG");
    },
  );

  it("refuses connections past its limit with Redis's error while idle ones stay open", async () => {
    // Prepare
    const { server, port } = await anEndpoint({ maxConnections: 50 });
    const idle: Socket[] = [];
    for (let index = 0; index < 50; index++) {
      const socket = connect(port, "127.0.0.1");
      socket.on("error", () => {});
      sockets.push(socket);
      idle.push(socket);
    }
    await waitFor(() => server.connections >= 50, "50 open connections", 5000, 10);

    // Act
    const refused = await raw(port, "*1\r\n$4\r\nPING\r\n");
    for (const socket of idle) socket.destroy();
    await waitFor(() => server.connections === 0, "every connection closed", 5000, 10);
    const later = aClient(port, { protocol: 2 });

    // Assess
    expect(refused.text).toBe("-ERR max number of clients reached\r\n");
    expect(refused.closed).toBe(true);
    expect(await later.ping()).toBe("PONG");
  });

  it("keeps its request buffer bounded whatever length a bulk string declares", () => {
    // Prepare
    const fatal: string[] = [];
    const reader = new RequestReader({
      maxPendingBytes: 1024,
      maxArguments: 8,
      onCommand: () => {},
      onFatal: (message) => fatal.push(message),
    });

    // Act
    reader.feed(Buffer.from("*1\r\n$1000000000\r\n"));
    for (let index = 0; index < 10 && !reader.failed; index++) reader.feed(Buffer.alloc(200, 97));

    // Assess
    expect(reader.failed).toBe(true);
    expect(fatal).toEqual(["ERR Protocol error: request larger than 1024 bytes"]);
  });
});

describe("Sentinel endpoint: reading requests", () => {
  function aReader() {
    const commands: string[][] = [];
    const fatal: string[] = [];
    const reader = new RequestReader({
      maxPendingBytes: 64 * 1024,
      maxArguments: 64,
      onCommand: (args) => commands.push(args),
      onFatal: (message) => fatal.push(message),
    });
    return { reader, commands, fatal };
  }

  const encode = (args: readonly string[]) =>
    `*${args.length}\r\n${args.map((arg) => `$${Buffer.byteLength(arg)}\r\n${arg}\r\n`).join("")}`;

  it("reads the same commands however the bytes are split", () => {
    fc.assert(
      fc.property(
        fc.array(fc.array(fc.string({ maxLength: 40, unit: "grapheme" }), { minLength: 1, maxLength: 6 }), {
          minLength: 1,
          maxLength: 8,
        }),
        fc.array(fc.integer({ min: 1, max: 50 }), { minLength: 1, maxLength: 20 }),
        (commands, cuts) => {
          // Prepare
          const bytes = Buffer.from(commands.map(encode).join(""));
          const { reader, commands: read, fatal } = aReader();

          // Act
          let offset = 0;
          for (let index = 0; offset < bytes.length; index++) {
            const size = cuts[index % cuts.length] as number;
            reader.feed(bytes.subarray(offset, offset + size));
            offset += size;
          }

          // Assess
          expect(fatal).toEqual([]);
          expect(read).toEqual(commands);
        },
      ),
      { numRuns: 300 },
    );
  });

  it.each([
    ["a header that never ends", Buffer.alloc(60_000, 42)],
    ["digits that never end", Buffer.from(`*1\r\n$${"1".repeat(60_000)}`)],
    ["an argument trickled in", Buffer.from(encode(["PING", "a".repeat(60_000)]))],
  ])("costs linear time on %s sent a byte at a time", (_what, bytes) => {
    // Prepare
    const { reader } = aReader();

    // Act
    const started = performance.now();
    for (let index = 0; index < bytes.length && !reader.failed; index++)
      reader.feed(bytes.subarray(index, index + 1));
    const elapsedMs = performance.now() - started;

    // Assess: redis-parser, which re-scanned the partial frame on every chunk, took 14 s here.
    expect(elapsedMs).toBeLessThan(1000);
  });
});

describe("Sentinel endpoint helpers", () => {
  it("writes maps as flat arrays in RESP2 and as maps in RESP3; nulls as each protocol spells them", () => {
    const map = { type: "map", entries: [["ip", { type: "bulk", value: "h" }]] } as const;
    expect(encodeFrame(map, 2)).toBe("*2\r\n$2\r\nip\r\n$1\r\nh\r\n");
    expect(encodeFrame(map, 3)).toBe("%1\r\n$2\r\nip\r\n$1\r\nh\r\n");
    expect(encodeFrame({ type: "nullArray" }, 2)).toBe("*-1\r\n");
    expect(encodeFrame({ type: "null" }, 2)).toBe("$-1\r\n");
    expect(encodeFrame({ type: "nullArray" }, 3)).toBe("_\r\n");
    expect(encodeFrame({ type: "error", message: "ERR a\r\nb" }, 2)).toBe("-ERR a b\r\n");
  });

  it("closes application connections only, never Shardguard's own (agent, probes, eviction)", () => {
    // Prepare
    const list = [
      "id=3 addr=127.0.0.1:5001 laddr=127.0.0.1:6379 fd=8 name=shardguard-agent age=9 db=0 flags=N",
      "id=4 addr=127.0.0.1:5002 laddr=127.0.0.1:6379 fd=9 name=shardguard-probe.n2.17 age=9 db=0 flags=N",
      "id=7 addr=127.0.0.1:5003 laddr=127.0.0.1:6379 fd=10 name= age=2 db=0 flags=N",
      "id=9 addr=127.0.0.1:5004 laddr=127.0.0.1:6379 fd=11 name=checkout-api age=1 db=0 flags=P",
      "",
    ].join("\n");

    // Act
    const ids = applicationClientIds(list);

    // Assess
    expect(ids).toEqual(["7", "9"]);
  });

  it("serves at most half the open-file limit, between 16 and 4096 connections", () => {
    expect(
      maxSentinelConnections("Max open files            1024                4096                files"),
    ).toBe(512);
    expect(
      maxSentinelConnections("Max open files            1048576             1048576             files"),
    ).toBe(4096);
    expect(
      maxSentinelConnections("Max open files            20                  20                  files"),
    ).toBe(16);
    expect(maxSentinelConnections("")).toBe(512);
  });

  it("announces the bind address, or the host of --address when it listens on every interface", () => {
    expect(announcedAddress("10.0.1.17", 26379, "10.0.1.17:6379")).toBe("10.0.1.17:26379");
    expect(announcedAddress("0.0.0.0", 26379, "redis-a.internal:6379")).toBe("redis-a.internal:26379");
    expect(announcedAddress("::", 26379, "10.0.1.17:6379")).toBe("10.0.1.17:26379");
  });
});

describe("Sentinel endpoint options", () => {
  const base = { SHARDGUARD_SHARD: "orders-1", SHARDGUARD_REDIS: "127.0.0.1:6379" };

  it("reads the port and bind address from flags and the password from the environment only", () => {
    // Act
    const config = resolveAgentOptions({
      flags: { sentinelPort: "26379", sentinelBind: "0.0.0.0" },
      env: { ...base, SHARDGUARD_SENTINEL_PASSWORD: "s3cret" },
    });

    // Assess
    expect(config.agent).toMatchObject({
      sentinelPort: 26379,
      sentinelBind: "0.0.0.0",
      sentinelPassword: "s3cret",
    });
  });

  it("is off unless a port is given", () => {
    expect(resolveAgentOptions({ flags: {}, env: base }).agent.sentinelPort).toBeUndefined();
  });

  it("names the variable of a bad port", () => {
    expect(() =>
      resolveAgentOptions({ flags: {}, env: { ...base, SHARDGUARD_SENTINEL_PORT: "70000" } }),
    ).toThrow(/SHARDGUARD_SENTINEL_PORT/);
  });
});

describe("Sentinel endpoint: limits a hostile client meets", () => {
  it("refuses a pattern or channel longer than 256 bytes and keeps the connection", async () => {
    // Prepare
    const { port } = await anEndpoint();
    const long = `${"*".repeat(300)}X`;

    // Act
    const answer = await raw(
      port,
      `*2\r\n$10\r\nPSUBSCRIBE\r\n$${long.length}\r\n${long}\r\n*2\r\n$9\r\nSUBSCRIBE\r\n$${long.length}\r\n${long}\r\n*1\r\n$4\r\nPING\r\n`,
      300,
    );

    // Assess
    expect(answer.text).toBe(
      "-ERR pattern longer than 256 bytes\r\n-ERR channel longer than 256 bytes\r\n+PONG\r\n",
    );
    expect(answer.closed).toBe(false);
  });

  it("publishes to a pattern subscriber at once beside 60 malicious patterns (CVE-2022-36021 shape)", async () => {
    // Prepare
    const { shard, feed, port } = await anEndpoint();
    const subscriber = aClient(port, { protocol: 2 });
    const messages: string[] = [];
    subscriber.on("pmessage", (pattern: string, channel: string) => messages.push(`${pattern} ${channel}`));
    const malicious = Array.from({ length: 60 }, (_, n) => `${"*".repeat(100)}X${n}`);
    await subscriber.psubscribe(...malicious, "+s*");
    await feed.refresh();

    // Act
    const started = performance.now();
    shard.topology = { ...ONLINE, epoch: 4, status: "failing_over" };
    await feed.refresh();
    const elapsedMs = performance.now() - started;
    await waitFor(() => messages.length >= 1, "+sdown published", 2000, 10);

    // Assess
    expect(messages).toEqual(["+s* +sdown"]);
    expect(elapsedMs).toBeLessThan(100);
  });

  it("closes a connection that stays idle without a subscription, and keeps an idle subscriber", async () => {
    // Prepare
    const { server, port } = await anEndpoint({ limits: { idleTimeoutMs: 200 } });
    const subscriber = aClient(port, { protocol: 2 });
    await subscriber.subscribe("+switch-master");

    // Act
    const idle = await raw(port, "*1\r\n$4\r\nPING\r\n", 5000);

    // Assess
    expect(idle).toEqual({ text: "+PONG\r\n", closed: true });
    await holdsFor(() => server.subscribers === 1, "the subscriber kept", 600);
    expect(await subscriber.ping()).toEqual(["pong", ""]);
  });

  it("closes a connection after its third wrong password", async () => {
    // Prepare
    const { port } = await anEndpoint({ password: "s3cret" });
    const auth = "*2\r\n$4\r\nAUTH\r\n$4\r\nnope\r\n";

    // Act
    const answer = await raw(port, `${auth}${auth}${auth}*1\r\n$4\r\nPING\r\n`);

    // Assess
    expect(answer.text).toBe("-WRONGPASS invalid username-password pair or user is disabled.\r\n".repeat(3));
    expect(answer.closed).toBe(true);
  });

  it("refuses every password from an address past its free failures, the right one too, on new connections", async () => {
    // Prepare
    const { port } = await anEndpoint({
      password: "s3cret",
      authThrottle: { freeFailures: 2, baseBlockMs: 60_000 },
    });
    const auth = (password: string) => `*2\r\n$4\r\nAUTH\r\n$${password.length}\r\n${password}\r\n`;

    // Act
    const failures = [];
    for (let attempt = 0; attempt < 3; attempt++) failures.push(await raw(port, auth("nope"), 300));
    const blocked = await raw(port, auth("s3cret"));

    // Assess
    expect(failures.map((answer) => answer.text)).toEqual(
      Array(3).fill("-WRONGPASS invalid username-password pair or user is disabled.\r\n"),
    );
    expect(blocked.text).toBe(
      "-ERR too many failed authentication attempts from this address; retry later\r\n",
    );
    expect(blocked.closed).toBe(true);
  });

  it("verifies client certificates against --sentinel-ca and serves its own certificate", async () => {
    // Prepare
    const certs = new TestCertificates();
    try {
      const server = certs.issue("sentinel", 2);
      const { port } = await anEndpoint({
        tls: {
          cert: readFileSync(server.certFile, "utf8"),
          key: readFileSync(server.keyFile, "utf8"),
          ca: readFileSync(certs.caFile, "utf8"),
        },
      });
      const ca = readFileSync(certs.caFile);
      const withCert = aClient(port, {
        protocol: 2,
        tls: { ca, cert: readFileSync(certs.agent.certFile), key: readFileSync(certs.agent.keyFile) },
      });
      const withoutCert = aClient(port, { protocol: 2, tls: { ca } });

      // Act
      await withCert.connect();
      const answered = await withCert.call("SENTINEL", "get-master-addr-by-name", "s1");
      const refused = await withoutCert.connect().then(
        () => withoutCert.ping(),
        (error: unknown) => error,
      );

      // Assess
      expect(answered).toEqual(["10.0.0.1", "6379"]);
      expect(String(refused)).toMatch(/certificate|closed|ECONNRESET|alert/i);
    } finally {
      certs.destroy();
    }
  });
});

describe("Sentinel endpoint: protected mode", () => {
  const base = { address: "10.0.1.17:6379", redis: "127.0.0.1:6379", sentinelProtectedMode: true };

  it.each([
    ["no password, no bind", {}, false, "127.0.0.1", true],
    ["a password", {}, true, "10.0.1.17", false],
    ["an explicit bind", { sentinelBind: "0.0.0.0" }, false, "0.0.0.0", false],
    ["protected mode off", { sentinelProtectedMode: false }, false, "10.0.1.17", false],
  ] as const)("with %s listens on the expected host", (_what, options, hasPassword, host, protectedMode) => {
    expect(sentinelBind({ ...base, ...options }, hasPassword)).toMatchObject({ host, protectedMode });
  });

  it("listens on loopback only and says so once at start when no password is set", async () => {
    // Prepare: 127.0.0.2 is this host's too, but not the protected address.
    const logger = new RecordingLogger();
    const shard = new ScriptedShard();
    const options = parseAgentOptions({ shard: "s1", redis: "127.0.0.2:6379", sentinelPort: 0 });
    const endpoint = new SentinelEndpoint({
      options,
      nodeId: "p1",
      deps: { heartbeats: { snapshot: shard.snapshot }, clock: { now: () => NOW } } as unknown as AgentDeps,
      logger,
    });
    try {
      // Act
      await endpoint.listen();
      const port = Number(endpoint.address?.split(":")[1]);
      const elsewhere = await canConnect("127.0.0.2", port);
      const local = await canConnect("127.0.0.1", port);

      // Assess
      expect(endpoint.address).toBe(`127.0.0.1:${port}`);
      expect(local).toBe(true);
      expect(elsewhere).toBe(false);
      const said = logger.lines.filter((line) => /protected mode/.test(line.message));
      expect(said).toHaveLength(1);
      expect(said[0]?.message).toMatch(/listens on 127\.0\.0\.1 only/);
    } finally {
      await endpoint.close();
    }
  });
});

describe("Sentinel endpoint: what heartbeats announce", () => {
  it.each([
    ["protected on a node other hosts reach", "10.0.1.17:6379", {}, undefined],
    ["protected on a loopback-only node", "127.0.0.1:6379", {}, "127.0.0.1"],
    ["bound by the operator", "10.0.1.17:6379", { sentinelBind: "127.0.0.1" }, "127.0.0.1"],
  ] as const)("%s: %s", async (_what, address, extra, announcedHost) => {
    // Prepare
    const shard = new ScriptedShard();
    const put = vi.fn(async () => {});
    const options = parseAgentOptions({
      shard: "s1",
      redis: "127.0.0.1:6379",
      address,
      sentinelPort: 0,
      ...extra,
    });
    const endpoint = new SentinelEndpoint({
      options,
      nodeId: "p1",
      deps: {
        heartbeats: { snapshot: shard.snapshot, put },
        clock: { now: () => NOW },
      } as unknown as AgentDeps,
      logger: silentLogger,
    });
    try {
      await endpoint.listen();

      // Act
      await endpoint
        .wrap({ heartbeats: { snapshot: shard.snapshot, put } } as unknown as AgentDeps)
        .heartbeats.put(aHeartbeat({ node_id: "p1" }));

      // Assess
      const sent = (put.mock.calls[0] as unknown as [{ sentinel_address?: string }])[0];
      expect(sent.sentinel_address?.split(":")[0]).toBe(announcedHost);
    } finally {
      await endpoint.close();
    }
  });
});

function canConnect(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, host, () => {
      socket.destroy();
      resolve(true);
    });
    socket.on("error", () => resolve(false));
  });
}
