import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { Redis } from "ioredis";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LocalCluster } from "../../src/dev/local-cluster.ts";
import type { RedisNode, RedisSecurity } from "../../src/dev/local-stack/redis-nodes.ts";
import {
  countKeys,
  startChaosCluster,
  WAIT_MS,
  waitForFollowers,
  waitForNewPrimary,
  withClient,
  writeKeys,
} from "../support/chaos-cluster.ts";
import { TestCertificates } from "../support/tls-certs.ts";

/**
 * The agent against production-style Redis: TLS-only ports with client certificates,
 * `tls-replication yes`, the default user off, and the agent logged in as an ACL user limited to
 * the rule docs/agent.md#tls-and-acl-users documents. The rule and the agent's config file are
 * read from that page, so neither can drift from what the code calls.
 */

const run = promisify(execFile);
const CLI = "src/cli/main.ts";
const AGENT_USER = "shardguard-agent";
const AGENT_PASSWORD = "agent-secret-1";
const ADMIN = { username: "admin", password: "admin-secret-1" };

/** The agent's ACL rule and its config file, as docs/agent.md shows them. */
function documented(): { rule: string; configJson: string } {
  const page = readFileSync("docs/agent.md", "utf8");
  const section = page.slice(page.indexOf("## TLS and ACL users"));
  const rule = /^user shardguard-agent on \S+ (.+)$/m.exec(section)?.[1];
  const configJson = /```json\n([\s\S]+?)```/.exec(section)?.[1];
  if (!rule || !configJson) throw new Error("docs/agent.md lost its TLS and ACL users section");
  // README and the deploy guide show the same user line and config file.
  for (const other of ["README.md", "docs/deploy.md"]) {
    const text = readFileSync(other, "utf8");
    if (!text.includes(configJson)) throw new Error(`${other} no longer shows docs/agent.md's agent.json`);
  }
  if (
    !readFileSync("README.md", "utf8").includes(
      `user shardguard-agent on <agent-password> ${rule}`.replace(" <", " ><"),
    )
  )
    throw new Error("README.md no longer shows docs/agent.md's user shardguard-agent line");
  return { rule, configJson };
}

/** TLS-only nodes, the agent user limited to `rule`, an admin for replication and the test's own clients. */
function security(certs: TestCertificates, rule: string): RedisSecurity {
  return {
    tls: certs.nodeFiles,
    users: [
      "default off",
      `${ADMIN.username} on >${ADMIN.password} ~* &* +@all`,
      `${AGENT_USER} on >${AGENT_PASSWORD} ${rule}`,
    ],
    admin: ADMIN,
  };
}

/** Writes the documented agent.json (paths under the certificates' dir) and the password file. */
function agentConfig(certs: TestCertificates, configJson: string): string {
  writeFileSync(join(certs.dir, "redis-password"), `${AGENT_PASSWORD}\n`);
  const file = join(certs.dir, "agent.json");
  writeFileSync(file, configJson.replaceAll("/etc/shardguard", certs.dir));
  return file;
}

/** Commands the database refused to the agent's user (ACL LOG), on every node. */
async function refusedToAgent(nodes: readonly RedisNode[]): Promise<string[]> {
  const refused: string[] = [];
  for (const node of nodes) {
    if (!node.running) continue;
    const entries = (await withClient(node, (client) => client.call("ACL", "LOG"))) as unknown[][];
    for (const entry of entries) {
      const fields = new Map<string, unknown>();
      for (let index = 0; index + 1 < entry.length; index += 2)
        fields.set(String(entry[index]), entry[index + 1]);
      if (fields.get("username") === AGENT_USER)
        refused.push(`${node.id}: ${fields.get("reason")} ${fields.get("object")}`);
    }
  }
  return refused;
}

let certs: TestCertificates;
let docs: { rule: string; configJson: string };
let configFile: string;

beforeAll(() => {
  certs = new TestCertificates();
  docs = documented();
  configFile = agentConfig(certs, docs.configJson);
});

afterAll(() => certs.destroy());

describe("agent over TLS with a least-privilege ACL user", () => {
  let cluster: LocalCluster | undefined;
  afterAll(async () => {
    await cluster?.stop();
  });

  it("fails over a SIGKILLed primary with no acknowledged write lost, then switches over", {
    timeout: 90_000,
  }, async () => {
    // Prepare
    cluster = await startChaosCluster({
      redisSecurity: security(certs, docs.rule),
      agentEnv: () => ({ SHARDGUARD_AGENT_CONFIG: configFile }),
    });
    const active = cluster;
    await writeKeys(active.node("node-1"), "before-kill", 200, 2);
    const before = await active.topology();

    // Act: kill -9
    active.node("node-1").signal("SIGKILL");
    const after = await waitForNewPrimary(active, before?.epoch ?? 0);
    const winner = after.primary_node_id ?? "none";
    const other = winner === "node-2" ? "node-3" : "node-2";
    await waitForFollowers(active, winner, [other]);
    const survived = await countKeys(active.node(winner), "before-kill", 200);
    // The new primary takes writes once its promotion fence lifts: retried until it does.
    await active.waitFor(
      "the new primary taking the before-switch writes",
      () => writeKeys(active.node(winner), "before-switch", 100, 1).then(() => true),
      WAIT_MS,
    );

    // Act: switchover to the other replica
    const { stdout } = await run(process.execPath, [CLI, "switchover", "--shard", active.shard, "--json"], {
      env: active.env,
      timeout: 60_000,
    });
    const switched = JSON.parse(stdout) as { ok: boolean; outcome: string; primary: string };
    await waitForFollowers(active, switched.primary, [winner]);

    // Assess
    expect(survived).toBe(200);
    expect(switched).toMatchObject({ ok: true, outcome: "completed", primary: other });
    expect(await countKeys(active.node(other), "before-kill", 200)).toBe(200);
    expect(await countKeys(active.node(other), "before-switch", 100)).toBe(100);
    expect(await refusedToAgent(active.redis)).toEqual([]);
    // The crash watch tells a dead database from a live one over TLS, as over plain TCP: its open
    // connection reset by the kill, or the reconnect refused (which comes first is a race; a suite
    // run on a loaded machine saw "reset").
    expect(
      active.logLines("agent-node-1.log").find((line) => line.message === "database died"),
    ).toMatchObject({
      state: expect.stringMatching(/^(refused|reset)$/),
    });
    const clients = String(await withClient(active.node(other), (client) => client.call("CLIENT", "LIST")));
    const agentConnections = clients.split("\n").filter((line) => / name=shardguard-/.test(line));
    expect(agentConnections.some((line) => / name=shardguard-agent /.test(line))).toBe(true);
    expect(agentConnections.some((line) => / name=shardguard-probe\./.test(line))).toBe(true);
    expect(agentConnections.filter((line) => !line.includes(` user=${AGENT_USER} `))).toEqual([]);
    for (const id of ["node-1", "node-2", "node-3"]) {
      const lines = active.logLines(`agent-${id}.log`);
      expect(lines.filter((line) => /NOPERM|WRONGPASS/.test(String(line.error ?? "")))).toEqual([]);
    }
  });
});

describe("agent over TLS on one node: the Sentinel endpoint, and bad input reported, retried and survived", () => {
  let cluster: LocalCluster;
  let node: RedisNode;

  beforeAll(async () => {
    cluster = await startChaosCluster({
      nodes: 1,
      redisSecurity: security(certs, docs.rule),
      agentEnv: () => ({ SHARDGUARD_AGENT_CONFIG: configFile }),
    });
    node = cluster.node("node-1");
  }, 60_000);

  afterAll(async () => {
    await cluster?.stop();
  });

  /** Agent log lines written after `from` lines whose error matches. */
  const errorsSince = (from: number, pattern: RegExp) =>
    cluster
      .logLines("agent-node-1.log")
      .slice(from)
      .filter((line) => pattern.test(String(line.error ?? "")));

  /** Waits for `db_status: down` heartbeats, two of them, written by a live agent. */
  async function expectDownAndAlive(): Promise<void> {
    let first: number | undefined;
    await cluster.waitFor(
      "two heartbeats reporting the database down",
      async () => {
        const beat = cluster.heartbeatOf(await cluster.snapshot(), "node-1");
        if (beat?.db_status !== "down") return false;
        first ??= beat.agent_updated;
        return beat.agent_updated !== undefined && first !== undefined && beat.agent_updated > first;
      },
      WAIT_MS,
    );
    expect(cluster.agentRunning("node-1")).toBe(true);
  }

  async function expectUp(): Promise<void> {
    await cluster.waitFor(
      "a heartbeat reporting the database up",
      async () => cluster.heartbeatOf(await cluster.snapshot(), "node-1")?.db_status === "up",
      WAIT_MS,
    );
  }

  /** Restarts the agent with `env` over the documented config, waits for `pattern` in its errors. */
  async function restartWith(
    env: NodeJS.ProcessEnv,
    pattern: RegExp,
  ): Promise<Array<Record<string, unknown>>> {
    const from = cluster.logLines("agent-node-1.log").length;
    cluster.startAgent("node-1", { env });
    await cluster.waitFor(
      `an agent error matching ${pattern}`,
      () => errorsSince(from, pattern).length > 0,
      WAIT_MS,
    );
    return errorsSince(from, pattern);
  }

  it("serves the Sentinel protocol over TLS with its own certificate, to clients with a certificate --sentinel-ca signed", {
    timeout: 40_000,
  }, async () => {
    // Prepare
    const from = cluster.logLines("agent-node-1.log").length;
    const served = certs.issue("sentinel-endpoint", 2);
    cluster.startAgent("node-1", {
      env: {
        SHARDGUARD_SENTINEL_PORT: "0",
        SHARDGUARD_SENTINEL_TLS: "true",
        SHARDGUARD_SENTINEL_CERT: served.certFile,
        SHARDGUARD_SENTINEL_KEY: served.keyFile,
        SHARDGUARD_SENTINEL_CA: certs.caFile,
      },
    });
    const listening = () =>
      cluster
        .logLines("agent-node-1.log")
        .slice(from)
        .find((line) => line.message === "sentinel endpoint listening");
    await cluster.waitFor("the Sentinel endpoint listening", () => listening() !== undefined, WAIT_MS);
    const client = (tls: { cert?: Buffer; key?: Buffer }) => {
      const connection = new Redis({
        host: "127.0.0.1",
        port: Number(listening()?.port),
        tls: { ca: readFileSync(certs.caFile), ...tls },
        lazyConnect: true,
        maxRetriesPerRequest: 0,
        retryStrategy: () => null,
      });
      connection.on("error", () => {});
      return connection;
    };
    const sentinel = client({
      cert: readFileSync(certs.agent.certFile),
      key: readFileSync(certs.agent.keyFile),
    });
    const anonymous = client({});

    // Act
    let primary: unknown;
    try {
      await sentinel.connect();
      await cluster.waitFor(
        "the endpoint naming node-1",
        async () => {
          primary = await sentinel.call("SENTINEL", "get-master-addr-by-name", cluster.shard);
          return Array.isArray(primary);
        },
        WAIT_MS,
      );
    } finally {
      sentinel.disconnect();
    }
    const refused = await anonymous.connect().then(
      () => anonymous.ping(),
      (error: unknown) => error,
    );
    anonymous.disconnect();

    // Assess
    expect(primary).toEqual(["127.0.0.1", String(node.port)]);
    expect(String(refused)).toMatch(/certificate|closed|ECONNRESET|alert/i);
    cluster.startAgent("node-1");
    await expectUp();
  });

  it("names --redis-ca and the verification failure when the CA did not sign the database's certificate", {
    timeout: 40_000,
  }, async () => {
    // Act
    const errors = await restartWith(
      { SHARDGUARD_REDIS_CA: certs.otherCaFile },
      /--redis-ca \(SHARDGUARD_REDIS_CA\)/,
    );
    await expectDownAndAlive();

    // Assess
    expect(String(errors[0]?.error)).toMatch(/verify|self.signed|issuer/i);
    cluster.startAgent("node-1");
    await expectUp();
  });

  it("names --redis-cert when the database rejects an expired client certificate, and connects once it stops asking", {
    timeout: 40_000,
  }, async () => {
    // Act
    const errors = await restartWith(
      {
        SHARDGUARD_REDIS_CERT: certs.expiredAgent.certFile,
        SHARDGUARD_REDIS_KEY: certs.expiredAgent.keyFile,
      },
      /--redis-cert \(SHARDGUARD_REDIS_CERT\)/,
    );
    await expectDownAndAlive();
    await withClient(node, (client) => client.config("SET", "tls-auth-clients", "no"));
    await expectUp();

    // Assess
    expect(String(errors[0]?.error)).toMatch(/certificate expired/i);
    await withClient(node, (client) => client.config("SET", "tls-auth-clients", "yes"));
    cluster.startAgent("node-1");
    await expectUp();
  });

  it("names the user and --redis-password-file with the WRONGPASS reply, and connects once the password is right", {
    timeout: 40_000,
  }, async () => {
    // Prepare
    const wrong = join(certs.dir, "wrong-password");
    writeFileSync(wrong, "not-the-password\n");

    // Act
    const errors = await restartWith({ SHARDGUARD_REDIS_PASSWORD_FILE: wrong }, /WRONGPASS/);
    await expectDownAndAlive();
    await withClient(node, (client) => client.call("ACL", "SETUSER", AGENT_USER, ">not-the-password"));
    await expectUp();

    // Assess
    expect(String(errors[0]?.error)).toContain(
      `check --redis-username (SHARDGUARD_REDIS_USERNAME) "${AGENT_USER}" and --redis-password-file (SHARDGUARD_REDIS_PASSWORD_FILE)`,
    );
    await withClient(node, (client) => client.call("ACL", "SETUSER", AGENT_USER, "<not-the-password"));
    cluster.startAgent("node-1");
    await expectUp();
  });

  it("names the ACL user and the documented rule with the NOPERM reply, and recovers once the permission is back", {
    timeout: 40_000,
  }, async () => {
    // Act
    const from = cluster.logLines("agent-node-1.log").length;
    await withClient(node, (client) => client.call("ACL", "SETUSER", AGENT_USER, "-info"));
    await cluster.waitFor("a NOPERM error", () => errorsSince(from, /^NOPERM/).length > 0, WAIT_MS);
    const errors = errorsSince(from, /^NOPERM/);
    await expectDownAndAlive();
    await withClient(node, (client) => client.call("ACL", "SETUSER", AGENT_USER, "+info"));
    await expectUp();

    // Assess
    expect(String(errors[0]?.error)).toMatch(/'info' command/);
    expect(String(errors[0]?.error)).toContain(
      `the ACL user --redis-username (SHARDGUARD_REDIS_USERNAME) "${AGENT_USER}" lacks a command the agent needs`,
    );
    expect(cluster.agentRunning("node-1")).toBe(true);
  });
});
