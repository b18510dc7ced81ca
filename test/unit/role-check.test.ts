import { describe, expect, it } from "vitest";
import { answerCheck } from "../../src/agent/http-endpoint.ts";
import { type RoleFacts, runCheck } from "../../src/core/role-check.ts";

/** The facts of a healthy primary the topology confirms; each row changes one. */
const PRIMARY: RoleFacts = {
  dbUp: true,
  role: "primary",
  confirmedPrimary: true,
  fencedBecause: undefined,
  topologyPrimary: "10.0.0.1:6379",
  link: undefined,
  maxIoSilenceSeconds: 3,
};

const REPLICA: RoleFacts = {
  ...PRIMARY,
  role: "replica",
  confirmedPrimary: false,
  unconfirmedReason: "the topology names n1",
  link: { primary: "10.0.0.1:6379", up: true, lastIoSecondsAgo: 0, syncing: false },
};

describe("the HTTP role checks", () => {
  it.each<[string, RoleFacts, boolean, string]>([
    ["a confirmed, unfenced primary", PRIMARY, true, "primary, confirmed by the topology, accepting writes"],
    ["a database down", { ...PRIMARY, dbUp: false }, false, "the database does not answer"],
    ["a replica", REPLICA, false, "the database is a replica"],
    [
      "a primary the topology does not name (deposed, or another named)",
      { ...PRIMARY, confirmedPrimary: false, unconfirmedReason: "the topology names n2 at epoch 8" },
      false,
      "the topology does not name this node primary (the topology names n2 at epoch 8)",
    ],
    [
      "a primary before its first topology read",
      { ...PRIMARY, confirmedPrimary: undefined },
      false,
      "the topology does not name this node primary (not read yet)",
    ],
    [
      "a fenced primary",
      { ...PRIMARY, fencedBecause: "the agent fenced this primary" },
      false,
      "writes fenced: the agent fenced this primary",
    ],
  ])("/primary: %s", (_name, facts, ok, reason) => {
    expect(runCheck("primary", facts)).toEqual({ ok, reason });
  });

  it.each<[string, RoleFacts, boolean, string]>([
    ["a linked replica of the topology's primary", REPLICA, true, "replica of 10.0.0.1:6379, link up"],
    ["a primary", PRIMARY, false, "the database is a primary"],
    [
      "a replica of another node",
      { ...REPLICA, link: { primary: "10.0.0.9:6379", up: true, lastIoSecondsAgo: 0, syncing: false } },
      false,
      "follows 10.0.0.9:6379, not the topology's primary 10.0.0.1:6379",
    ],
    [
      "a replica whose link is down",
      { ...REPLICA, link: { primary: "10.0.0.1:6379", up: false, lastIoSecondsAgo: 5, syncing: false } },
      false,
      "link to 10.0.0.1:6379 down",
    ],
    [
      "a replica in a full sync",
      {
        ...REPLICA,
        link: { primary: "10.0.0.1:6379", up: false, lastIoSecondsAgo: undefined, syncing: true },
      },
      false,
      "link to 10.0.0.1:6379 syncing",
    ],
    [
      "a replica silent past the failure timeout",
      { ...REPLICA, link: { primary: "10.0.0.1:6379", up: true, lastIoSecondsAgo: 4, syncing: false } },
      false,
      "nothing from 10.0.0.1:6379 for 4 s (more than 3 s)",
    ],
    [
      "a replica of an offline shard",
      { ...REPLICA, topologyPrimary: undefined },
      false,
      "the topology names no primary",
    ],
  ])("/replica: %s", (_name, facts, ok, reason) => {
    expect(runCheck("replica", facts)).toEqual({ ok, reason });
  });

  it("/health is the database answering, whatever its role", () => {
    expect(runCheck("health", REPLICA).ok).toBe(true);
    expect(runCheck("health", { ...PRIMARY, fencedBecause: "x" }).ok).toBe(true);
    expect(runCheck("health", { ...PRIMARY, dbUp: false }).ok).toBe(false);
  });

  it("answers Patroni's paths and aliases; /read-only is a primary or a replica; others are unknown", () => {
    expect(answerCheck("/master", PRIMARY)?.ok).toBe(true);
    expect(answerCheck("/leader", PRIMARY)?.ok).toBe(true);
    expect(answerCheck("/read-write", REPLICA)?.ok).toBe(false);
    expect(answerCheck("/read-only", PRIMARY)?.ok).toBe(true);
    expect(answerCheck("/read-only", REPLICA)?.ok).toBe(true);
    expect(answerCheck("/read-only", { ...REPLICA, dbUp: false })?.ok).toBe(false);
    expect(answerCheck("/standby", PRIMARY)).toBeUndefined();
  });

  it("never answers 200 on /primary and /replica at once", () => {
    const samples: RoleFacts[] = [
      PRIMARY,
      REPLICA,
      { ...PRIMARY, link: REPLICA.link },
      { ...REPLICA, role: "primary" },
    ];
    for (const facts of samples) {
      expect(runCheck("primary", facts).ok && runCheck("replica", facts).ok).toBe(false);
    }
  });
});
