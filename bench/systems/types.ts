import type { HaproxyBackend } from "../../src/dev/local-stack/haproxy.ts";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import type { SentinelClientTarget } from "../lib/sentinel-client-workload.ts";

/** What every system under test is set up with, so both sides run at the same failure timeout. */
export interface SystemConfig {
  /** How long the primary must be unreachable before the system may fail over (Sentinel: down-after-milliseconds). */
  readonly failureTimeoutMs: number;
  /** redis-server nodes in the shard: one primary, the rest replicas. */
  readonly nodeCount: number;
  /** One line of progress for stderr. */
  readonly log: (line: string) => void;
  /**
   * The run's clients are Sentinel clients (`sentinelClient()`): Shardguard starts every agent with
   * `--sentinel-port`; Sentinel has its sentinels anyway. @default false
   */
  readonly sentinelEndpoints?: boolean;
  /**
   * The run's clients go through a real HAProxy checking `GET /primary` (`haproxyBackends()`):
   * Shardguard starts every agent with `--http-port`. @default false
   */
  readonly httpEndpoints?: boolean;
}

/**
 * How the primary fails in a trial: `crash` SIGKILLs its redis-server (an agent beside it stays
 * up), `host` SIGKILLs the redis-server and the Shardguard agent beside it together (Sentinel has
 * no agent: the same as crash), `hang` SIGSTOPs the redis-server (the process and its sockets stay).
 * `switchover` fails nothing: the operator's planned move of the primary (Shardguard's
 * `switchover`, Sentinel's `SENTINEL FAILOVER`), timed from the request.
 */
export const FAULTS = ["crash", "host", "hang", "switchover"] as const;
export type Fault = (typeof FAULTS)[number];

/**
 * Rows of the benchmark (`--faults`): one per fault with the benchmark's own writer, which asks the
 * system where the primary is, plus `sentinel-client`: a `crash` with an unmodified ioredis client in
 * Sentinel mode (WAIT-confirmed writes) pointed at the sentinels, or at Shardguard's agents; and
 * `haproxy`: a `crash` with the same client pointed at a real HAProxy whose `option httpchk GET
 * /primary` asks the agents' HTTP endpoints (docs/clients.md).
 */
export const ROWS = [...FAULTS, "sentinel-client", "haproxy"] as const;
export type Row = (typeof ROWS)[number];

/** The fault a row injects. */
export function faultOf(row: Row): Fault {
  return row === "sentinel-client" || row === "haproxy" ? "crash" : row;
}

/** The primary that was killed and the instant of the kill (performance.now() ms, the writer's clock). */
export interface KillResult {
  readonly killedAt: number;
  readonly oldPrimary: string;
}

/**
 * A failover system under test. The benchmark driver owns the writer and the measurements; a
 * system only brings its shard up, says where its primary is, kills it, and restores the shard.
 * Adding a system is one file implementing this and one line in `registry.ts`.
 */
export interface FailoverSystem {
  readonly name: string;
  /** Starts the redis-server nodes (1 primary + replicas) and the system's own parts; resolves when it is ready to fail over. */
  setup(config: SystemConfig): Promise<void>;
  /**
   * host:port of the primary as this system advertises it now, from its newest view (Sentinel:
   * the answer of the sentinel with the highest config epoch; Shardguard: its topology), undefined
   * when it advertises none. The driver polls it to time the switch and to catch false failovers.
   */
  primaryAddress(): Promise<string | undefined>;
  /**
   * How a client of this system finds the primary, with its own state (Sentinel: ask the sentinels
   * in turn). The writer resolves through this after every failed write, so it must be as fast as a
   * client lookup. When absent, the writer calls `primaryAddress()`.
   */
  createResolver?(): () => Promise<string | undefined>;
  /**
   * Where a Sentinel client of this system connects (after a setup with `sentinelEndpoints`): the
   * sentinels, or the agents' Sentinel endpoints, and the master name.
   */
  sentinelClient?(): SentinelClientTarget;
  /** The nodes with their role-check HTTP endpoints, for HAProxy (after a setup with `httpEndpoints`). */
  haproxyBackends?(): HaproxyBackend[];
  /** The redis-server nodes of the shard, including a killed one. */
  nodes(): readonly RedisNode[];
  /** Fails the primary the system currently has by `fault`; `killedAt` is taken right before the signal. */
  killPrimary(fault: Fault): Promise<KillResult>;
  /**
   * Durations in ms of the system's failover phases for the last trial, in order, the first
   * starting at `killedAt` (Shardguard: detection, lock, promote, confirm, repoint). Undefined when
   * the system cannot tell.
   */
  phaseTimings?(kill: KillResult): Promise<Record<string, number> | undefined>;
  /**
   * Restores 1 primary + replicas after a trial: restarts the killed (or hung) node as a replica of the new
   * primary and waits until it is in sync and the system again sees a healthy shard, so the next
   * trial starts from the same state.
   */
  resetTrial(): Promise<void>;
  /** Stops everything setup started. Safe to call after a failed setup. */
  teardown(): Promise<void>;
}
