import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { RedisDatabase, redisConnectSettings } from "../../src/agent/database.ts";
import { parseAgentOptions, resolveAgentOptions } from "../../src/agent/options.ts";
import { RecordingLogger } from "../support/agent-harness.ts";

const required = { shard: "s1", redis: "10.0.0.1:6380" };
let dir: string | undefined;

afterEach(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
});

function files(contents: Record<string, string>): Record<string, string> {
  dir = mkdtempSync(join(tmpdir(), "shardguard-connection-test-"));
  const paths: Record<string, string> = {};
  for (const [name, text] of Object.entries(contents)) {
    paths[name] = join(dir, name);
    writeFileSync(paths[name], text);
  }
  return paths;
}

describe("agent TLS and ACL options", () => {
  it("turns TLS on from the --redis-tls switch, a variable or a rediss:// address, and strips the scheme", () => {
    // Act
    const flag = resolveAgentOptions({ flags: { ...required, redisTls: true }, env: {} });
    const variable = resolveAgentOptions({ flags: required, env: { SHARDGUARD_REDIS_TLS: "yes" } });
    const url = resolveAgentOptions({ flags: { shard: "s1", redis: "rediss://db.internal:6380" }, env: {} });
    const plain = resolveAgentOptions({ flags: required, env: {} });

    // Assess
    expect(flag.agent.redisTls).toBe(true);
    expect(variable.agent.redisTls).toBe(true);
    expect(url.agent).toMatchObject({ redis: "db.internal:6380", redisTls: true });
    expect(plain.agent).toMatchObject({ redis: "10.0.0.1:6380", redisTls: false, redisTlsInsecure: false });
  });

  it("reads every TLS setting from the config file", () => {
    // Prepare
    const inFile = {
      redisTls: true,
      redisCa: "/etc/shardguard/tls/ca.crt",
      redisCert: "/etc/shardguard/tls/agent.crt",
      redisKey: "/etc/shardguard/tls/agent.key",
      redisServername: "db.internal",
      redisUsername: "shardguard-agent",
      redisPasswordFile: "/etc/shardguard/redis-password",
    };

    // Act
    const config = resolveAgentOptions({
      flags: required,
      env: {},
      configFile: "/etc/shardguard/agent.json",
      readFile: () => JSON.stringify(inFile),
    });

    // Assess
    expect(config.agent).toMatchObject(inFile);
  });

  it("names every conflicting or malformed TLS and password setting at once", () => {
    // Act
    const attempt = () =>
      resolveAgentOptions({
        flags: { ...required, redisCa: "/ca.crt", redisCert: "/agent.crt", redisPasswordFile: "/pw" },
        env: { SHARDGUARD_REDIS_PASSWORD: "secret" },
      });
    const badSwitch = () => resolveAgentOptions({ flags: required, env: { SHARDGUARD_REDIS_TLS: "maybe" } });

    // Assess
    expect(attempt).toThrow(
      /--redis-password-file: names a second password beside SHARDGUARD_REDIS_PASSWORD/,
    );
    expect(attempt).toThrow(/--redis-ca: needs --redis-tls \(SHARDGUARD_REDIS_TLS\) true/);
    expect(attempt).toThrow(
      /--redis-cert: needs --redis-key \(SHARDGUARD_REDIS_KEY\) \(a client certificate and its key go together\)/,
    );
    expect(badSwitch).toThrow(/SHARDGUARD_REDIS_TLS: must be true or false, got "maybe"/);
  });
});

describe("the settings every agent connection to a database shares", () => {
  it("reads the password file without its trailing newline and the PEM files once", () => {
    // Prepare
    const paths = files({ password: "s3cret\n", "ca.crt": "CA", "agent.crt": "CERT", "agent.key": "KEY" });
    const options = parseAgentOptions({
      ...required,
      redisTls: true,
      redisUsername: "shardguard-agent",
      redisPasswordFile: paths.password,
      redisCa: paths["ca.crt"],
      redisCert: paths["agent.crt"],
      redisKey: paths["agent.key"],
    });

    // Act
    const settings = redisConnectSettings(options);

    // Assess
    expect(settings.redisOptions).toMatchObject({
      username: "shardguard-agent",
      password: "s3cret",
      tls: { ca: "CA", cert: "CERT", key: "KEY", rejectUnauthorized: true },
      disableClientInfo: true,
    });
    expect(settings.insecure).toBe(false);
    expect(redisConnectSettings(options)).toBe(settings);
  });

  it("refuses to start with a file it cannot read, naming the setting", () => {
    // Act
    const attempt = () =>
      redisConnectSettings(
        parseAgentOptions({ ...required, redisTls: true, redisCa: "/nonexistent/ca.crt" }),
      );

    // Assess
    expect(attempt).toThrow(/--redis-ca \(SHARDGUARD_REDIS_CA\): cannot read \/nonexistent\/ca.crt/);
  });

  it("turns verification off only with --redis-tls-insecure, and says so", () => {
    // Act
    const settings = redisConnectSettings(
      parseAgentOptions({ ...required, redisTls: true, redisTlsInsecure: true }),
    );

    // Assess
    expect(settings.insecure).toBe(true);
    expect(settings.redisOptions.tls).toMatchObject({ rejectUnauthorized: false });
  });

  it("warns loudly when the database connection starts without certificate verification", async () => {
    // Prepare
    const logger = new RecordingLogger();
    const connection = redisConnectSettings(
      parseAgentOptions({ ...required, redisTls: true, redisTlsInsecure: true }),
    );

    // Act
    const db = new RedisDatabase({ address: "127.0.0.1:1", connection, commandTimeoutMs: 100, logger });
    await db.close();

    // Assess
    expect(logger.find(/^TLS certificate verification is OFF \(--redis-tls-insecure/)?.level).toBe("warn");
  });

  it("points each refusal at the setting to check and keeps the database's words", () => {
    // Prepare
    const settings = redisConnectSettings(
      parseAgentOptions({ ...required, redisTls: true, redisUsername: "agent", redisPassword: "x" }),
    );
    const tlsError = (code: string, message = code) => Object.assign(new Error(message), { code });

    // Act
    const hints = {
      wrongPassword: settings.hint(
        new Error("WRONGPASS invalid username-password pair or user is disabled."),
      ),
      noPermission: settings.hint(new Error("NOPERM this user has no permissions to run the 'info' command")),
      wrongCa: settings.hint(tlsError("SELF_SIGNED_CERT_IN_CHAIN")),
      serverExpired: settings.hint(tlsError("CERT_HAS_EXPIRED")),
      wrongName: settings.hint(tlsError("ERR_TLS_CERT_ALTNAME_INVALID")),
      clientRejected: settings.hint(
        tlsError("ERR_SSL_TLSV13_ALERT_CERTIFICATE_EXPIRED", "ssl/tls alert certificate expired"),
      ),
      refused: settings.hint(tlsError("ECONNREFUSED")),
    };

    // Assess
    expect(hints.wrongPassword).toContain(
      'check --redis-username (SHARDGUARD_REDIS_USERNAME) "agent" and SHARDGUARD_REDIS_PASSWORD',
    );
    expect(hints.noPermission).toContain("docs/agent.md#tls-and-acl-users");
    expect(hints.wrongCa).toContain("--redis-ca (SHARDGUARD_REDIS_CA)");
    expect(hints.serverExpired).toContain("CERT_HAS_EXPIRED");
    expect(hints.wrongName).toContain("--redis-servername (SHARDGUARD_REDIS_SERVERNAME)");
    expect(hints.clientRejected).toContain("--redis-cert (SHARDGUARD_REDIS_CERT)");
    expect(hints.refused).toBeUndefined();
  });
});
