import { mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { parseAgentOptions, resolveAgentOptions } from "../../src/agent/options.ts";
import { sentinelPassword } from "../../src/agent/sentinel-endpoint.ts";
import { StateDir } from "../../src/agent/state-dir.ts";

/**
 * Secrets stay secret: never echoed in an error, readable from a file instead of the
 * environment, and the agent's state is never written through a path someone else placed.
 */

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

function aDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "shardguard-secrets-"));
  dirs.push(dir);
  return dir;
}

function messageOf(action: () => unknown): string {
  try {
    action();
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
  throw new Error("expected an error");
}

describe("secrets", () => {
  it("never echoes a config file that is not JSON (a password file passed by mistake)", () => {
    // Act
    const message = messageOf(() =>
      resolveAgentOptions({
        flags: {},
        env: {},
        configFile: "/etc/shardguard/sentinel-password",
        readFile: () => "hunter2-Sup3rSecret\n",
      }),
    );

    // Assess
    expect(message).toMatch(/config file \/etc\/shardguard\/sentinel-password is not valid JSON/);
    expect(message).not.toMatch(/hunter2|Sup3r|'h'/);
  });

  it("reads the Sentinel password from SHARDGUARD_SENTINEL_PASSWORD_FILE, one trailing newline dropped", () => {
    // Prepare
    const file = join(aDir(), "sentinel-password");
    writeFileSync(file, "s3cret\n", { mode: 0o600 });

    // Act
    const { agent } = resolveAgentOptions({
      flags: {},
      env: {
        SHARDGUARD_SHARD: "s1",
        SHARDGUARD_REDIS: "10.0.0.1:6379",
        SHARDGUARD_SENTINEL_PASSWORD_FILE: file,
      },
    });

    // Assess
    expect(agent.sentinelPasswordFile).toBe(file);
    expect(sentinelPassword(agent)).toBe("s3cret");
  });

  it("refuses a Sentinel password given both as a variable and as a file, and names an unreadable file", () => {
    // Act
    const both = messageOf(() =>
      resolveAgentOptions({
        flags: { sentinelPasswordFile: "/nope" },
        env: { SHARDGUARD_SHARD: "s1", SHARDGUARD_REDIS: "10.0.0.1:6379", SHARDGUARD_SENTINEL_PASSWORD: "x" },
      }),
    );
    const unreadable = messageOf(() =>
      sentinelPassword(
        parseAgentOptions({ shard: "s1", redis: "10.0.0.1:6379", sentinelPasswordFile: "/nope" }),
      ),
    );

    // Assess
    expect(both).toMatch(
      /--sentinel-password-file: names a second password beside SHARDGUARD_SENTINEL_PASSWORD/,
    );
    expect(unreadable).toMatch(
      /--sentinel-password-file \(SHARDGUARD_SENTINEL_PASSWORD_FILE\): cannot read \/nope/,
    );
  });

  it("wants the endpoint's own certificate under --sentinel-tls, not the agent's client certificate", () => {
    // Act
    const message = messageOf(() =>
      resolveAgentOptions({
        flags: {
          sentinelPort: "26379",
          sentinelTls: true,
          redisTls: true,
          redisCert: "/a.crt",
          redisKey: "/a.key",
        },
        env: { SHARDGUARD_SHARD: "s1", SHARDGUARD_REDIS: "10.0.0.1:6379" },
      }),
    );

    // Assess
    expect(message).toMatch(
      /--sentinel-tls: needs --sentinel-cert \(SHARDGUARD_SENTINEL_CERT\) and --sentinel-key/,
    );
  });

  it("writes the state file through a fresh temporary file, never through a link placed at a predictable name", () => {
    // Prepare: the name the agent used to write to, pointing at a file it must not touch.
    const dir = aDir();
    const victim = join(aDir(), "victim");
    writeFileSync(victim, "untouched\n");
    symlinkSync(victim, join(dir, `state.json.${process.pid}.tmp`));

    // Act
    const state = StateDir.open(dir, { shard: "s1", now: 1 });
    state.update({ highest_epoch: 7 });
    state.release();

    // Assess
    expect(readFileSync(victim, "utf8")).toBe("untouched\n");
    expect(JSON.parse(readFileSync(join(dir, "state.json"), "utf8")).highest_epoch).toBe(7);
    expect(readdirSync(dir).filter((name) => name.endsWith(".tmp"))).toEqual([
      `state.json.${process.pid}.tmp`,
    ]);
  });
});
