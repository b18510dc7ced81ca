import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { SQSClient } from "@aws-sdk/client-sqs";
import type { DynamoDBDocumentClient } from "@aws-sdk/lib-dynamodb";
import { AwsClock } from "../../adapters/clock.ts";
import { createDynamoCoordinationStore } from "../../adapters/dynamo-coordination-store.ts";
import { discardMetrics, silentLogger } from "../../adapters/observability.ts";
import { SqsCommandBus } from "../../adapters/sqs-command-bus.ts";
import { SqsWakeQueue } from "../../adapters/sqs-wake-queue.ts";
import { type AgentHandle, startAgent } from "../../agent/agent.ts";
import { endpointOf } from "../../client/primary-resolver.ts";
import { newOwnerToken } from "../../controller/deps.ts";
import { ControllerLoop } from "../../controller/loop.ts";
import { type FailoverConfig, parseFailoverConfig } from "../../core/config.ts";
import { errorMessage } from "../../core/errors.ts";
import { topologySchema } from "../../core/model.ts";
import type { Logger } from "../../core/observability.ts";
import { keys } from "../../core/table.ts";
import { type CheckResult, check, type FinalRead } from "../nemesis/checker.ts";
import { agentProtects, soleCopies } from "../nemesis/copies.ts";
import { cooldownFor, History } from "../nemesis/history.ts";
import { availabilityLimitMs, FENCE_WINDOW_MS } from "../nemesis/runner.ts";
import { type CallerFaults, DynamoTable, SimDynamoClient } from "./dynamo-model.ts";
import { machineOf, Network } from "./network.ts";
import { SimConnection, SimDatabase } from "./redis-client.ts";
import { REDIS_PORT, RedisCluster, RedisServer, type RestartMode } from "./redis-model.ts";
import { Scheduler } from "./scheduler.ts";
import { SimSqsClient, SqsService } from "./sqs-model.ts";

/**
 * One simulated shard: three machines (n1..n3), each running a redis-server model and the REAL
 * agent (src/agent/agent.ts); the REAL controller loop on `ctl`; the REAL DynamoDB and SQS
 * adapters against the table and queue models on `aws`; a workload on `client` that writes like the
 * nemesis's (SET then WAIT 1, plus stray writes to any other master) and samples who accepts
 * writes; a nemesis drawing faults from the seed. The history is judged by the nemesis's own
 * checker (src/dev/nemesis/checker.ts).
 */

export const SHARD = "s1";
const NODES = ["n1", "n2", "n3"] as const;
/** The machine of `unmanaged-replica`'s replica (no agent, no node id). */
const UNMANAGED = "n4";
const TABLE = "shardguard";
const PREFIX = "sim";

export interface SimOptions {
  readonly seed: number;
  /** Simulated minutes of faults (then a heal and a settle period). @default 5 */
  readonly minutes?: number;
  /** Inject faults. @default true */
  readonly faults?: boolean;
  /** Workload writes per simulated second. @default 25 */
  readonly writesPerSecond?: number;
  /** Simulated seconds after the last heal before the final read. @default 60 */
  readonly settleSeconds?: number;
  /**
   * Fault kinds to draw from (`FAULT_KINDS` and `EXTRA_FAULT_KINDS`, any repeated to weigh it).
   * @default FAULT_KINDS
   */
  readonly faultKinds?: readonly FaultKind[];
  /**
   * Faults overlap: the next fault is drawn `gap` after the previous one began, not after it
   * healed, so two or three are active at once (an isolated primary and a slow replica). @default false
   */
  readonly overlap?: boolean;
  /**
   * The lowest level of the agents' log lines that go into the trace (`info` and `debug` show the
   * steps of a chain of events between the warnings; the run is the same). @default "warn"
   */
  readonly agentLog?: "debug" | "info" | "warn";
}

export interface SimResult {
  readonly seed: number;
  readonly simulatedMs: number;
  readonly wallMs: number;
  /** CPU time (user) this process spent on the run: the figure a loaded machine does not distort. */
  readonly cpuMs: number;
  readonly valid: CheckResult["valid"];
  /** The checker's violations and the simulator's own (the shard must end online). */
  readonly violations: readonly string[];
  readonly check: CheckResult;
  readonly faults: number;
  /**
   * Faults drawn but not injected: a kill of redis that would destroy the last copy of
   * acknowledged writes (beyond guarantee 1: the copies rule, `#destroysLastCopy`).
   */
  readonly faultsSkipped: number;
  readonly timersFired: number;
  readonly writes: number;
  /** Broken invariants of the models themselves: the run says nothing about Shardguard while any. */
  readonly modelErrors: readonly string[];
  /** The event trace: nemesis actions, topology changes, warnings of agents and controller. */
  readonly trace: readonly string[];
}

interface Fault {
  readonly id: number;
  readonly kind: string;
  readonly target: string;
  readonly nodes: readonly string[];
  readonly heal: () => void;
  /** How long it lasts, when the kind decides (else the nemesis's draw). */
  readonly durationMs?: number;
}

const FAULT_KINDS = [
  "kill-redis",
  "hang-redis",
  "kill-agent",
  "pause-agent",
  "partition-node",
  "partition-oneway",
  "partition-redis-link",
  "store-outage-node",
  "store-outage-all",
  "store-flaky",
  "clock-step",
  "pause-controller",
  "sqs-unreliable",
] as const;

/**
 * Kinds drawn only when asked for (`--faults`): the default schedule stays as it was, so seeds keep
 * replaying. `controller-overlap`: the controller pauses past its lock's lease (40-90 s) while a new
 * invocation takes over, then wakes and runs on beside it for 2-20 s before it stops after its
 * current cycle (a Lambda frozen mid-run, thawed, then ending); a quarter of them hit the controller the moment a failover begins (the
 * observer sees the topology leave `online`). `restart-redis-fast`: redis-server dies and its
 * supervisor restarts it 0.1-1.5 s later, empty or from its RDB: back before the failure timeout,
 * while the topology still names it.
 *
 * `unmanaged-replica`: a replica no agent runs on (an analytics or backup replica, `n4`) attaches
 * to a node for the fault's length, then goes away; it stays where it was attached through
 * failovers (nobody repoints it). `replica-lag`: the link from the primary to one replica slows by
 * 0.2-5 s, or is cut one way (the replica's acknowledgements still arrive, so Redis counts it good
 * while its offset falls behind). `store-ops`: one machine's DynamoDB reads or writes fail (500 or
 * no answer, all or half of them) while the other kind goes through. `store-outage-agents`: every
 * node loses DynamoDB and SQS, the controller does not (an endpoint of the nodes' subnet).
 * `sqs-late`: a third of the messages sent are delivered once more 5-60 s later, after newer ones
 * (at-least-once). `controller-stall-failover`: arms for 30-120 s; the controller's next write
 * that changes the topology's epoch or status (a failover's plan, its confirmation) freezes it
 * before it hears the answer, for 2-30 s or past its lease (40-90 s), while a new invocation
 * starts; it wakes with its plan pending and runs on for 2-20 s. `agent-lost-state`: the agent dies
 * and starts again without its state dir (a machine rebuilt from its image, keeping its address and
 * node id; nemesis seed 5803): it knows no epoch, fence or lineage of its own until it reads them.
 */
export const EXTRA_FAULT_KINDS = [
  "controller-overlap",
  "restart-redis-fast",
  "unmanaged-replica",
  "replica-lag",
  "store-ops",
  "store-outage-agents",
  "sqs-late",
  "controller-stall-failover",
  "agent-lost-state",
] as const;

export type FaultKind = (typeof FAULT_KINDS)[number] | (typeof EXTRA_FAULT_KINDS)[number];

/** Every fault kind, for `--faults all`. */
export const ALL_FAULT_KINDS: readonly FaultKind[] = [...FAULT_KINDS, ...EXTRA_FAULT_KINDS];

export class SimWorld {
  readonly sched: Scheduler;
  readonly net: Network;
  readonly cluster: RedisCluster;
  readonly table = new DynamoTable();
  readonly sqs: SqsService;
  readonly history: History;
  readonly trace: string[] = [];
  readonly config: FailoverConfig;
  readonly #callerFaults = new Map<string, CallerFaults>();
  /** Per-operation store faults (`store-ops`), by machine, over `store-flaky`'s. */
  readonly #opFaults = new Map<string, CallerFaults>();
  /** An armed `controller-stall-failover`: the topology's epoch/status when armed. */
  #stall: { from: string } | undefined;
  readonly #agents = new Map<
    string,
    { host: string; handle: AgentHandle | undefined; incarnation: number; startedAt: number }
  >();
  #controllerHost = "ctl/controller#0";
  #controllerIncarnation = 0;
  readonly #stateRoot: string;
  readonly #abort = new AbortController();
  /** Every agent process the run started, the killed ones too: `#endProcesses` stops them all. */
  readonly #started: AgentHandle[] = [];
  /** The run has returned its result: nothing more goes into the trace. */
  #ended = false;
  #faultIds = 0;
  #faultsSkipped = 0;
  #writes = 0;
  /** The keys of the writes a replica acknowledged (`WAIT` answered at least 1), for the copies rule. */
  readonly #acknowledged: string[] = [];

  constructor(seed: number) {
    this.sched = new Scheduler(seed);
    this.net = new Network(this.sched);
    this.cluster = new RedisCluster(this.sched, this.net);
    this.sqs = new SqsService(this.sched);
    this.history = new History({ now: () => this.sched.elapsed });
    this.config = parseFailoverConfig({ cooldownMs: 30_000 });
    // State dirs on tmpfs when there is one: the agent fsyncs every state write, and a simulated
    // hour writes thousands of them.
    this.#stateRoot = mkdtempSync(join(existsSync("/dev/shm") ? "/dev/shm" : tmpdir(), "shardguard-sim-"));
  }

  log(line: string): void {
    if (this.#ended) return;
    this.trace.push(`${(this.sched.elapsed / 1000).toFixed(3).padStart(9)} ${line}`);
  }

  /** The lowest level of the agents' lines in the trace (`SimOptions.agentLog`). */
  #agentLog: "debug" | "info" | "warn" = "warn";

  #logger(who: string, minimum: "debug" | "info" | "warn"): Logger {
    const record = (level: string) => (message: string, attributes?: Record<string, unknown>) => {
      this.log(
        `${who} ${level} ${message}${attributes && Object.keys(attributes).length > 0 ? ` ${JSON.stringify(attributes)}` : ""}`,
      );
    };
    return {
      debug: minimum === "debug" ? record("debug") : () => {},
      info: minimum === "warn" ? () => {} : record("info"),
      warn: record("warn"),
      error: record("error"),
    };
  }

  #faultsOf = (machine: string): CallerFaults | undefined => {
    const flaky = this.#callerFaults.get(machine);
    const ops = this.#opFaults.get(machine);
    return ops === undefined ? flaky : { ...flaky, ...ops };
  };

  /** After every applied store write: an armed stall freezes the controller that changed the plan. */
  #applied = (caller: string): void => {
    if (this.#stall === undefined) return;
    const topology = this.#topology();
    const now = `${topology?.epoch}/${topology?.status}`;
    if (now === this.#stall.from) return;
    if (caller !== this.controllerHost) {
      this.#stall.from = now;
      return;
    }
    this.#stall = undefined;
    this.sched.onHost("nemesis", () => {
      const fault = this.#inject("controller-stall", 0);
      if (fault) this.#activate(fault, fault.durationMs ?? 60_000);
    });
  };

  /** AWS clients, clock and monotonic time of one process. */
  #aws(host: () => string, machine: string) {
    const monotonic = () => performance.now();
    const clock = new AwsClock({
      source: { wallNow: () => this.cluster.wallNow(machine), monotonicNow: monotonic },
    });
    const transport = {
      sched: this.sched,
      net: this.net,
      caller: host,
      faults: this.#faultsOf,
      applied: this.#applied,
    };
    const documents = new SimDynamoClient(transport, {
      table: this.table,
      observe: (date, sentAt, receivedAt) => clock.observe(date, sentAt, receivedAt),
      monotonic,
    }) as unknown as DynamoDBDocumentClient;
    const sqs = new SimSqsClient(transport, this.sqs) as unknown as SQSClient;
    const store = createDynamoCoordinationStore({ documents, tableName: TABLE, clock, logger: silentLogger });
    const bus = new SqsCommandBus({ sqs, queuePrefix: PREFIX, managedSse: false, logger: silentLogger });
    const wake = new SqsWakeQueue({
      sqs,
      queuePrefix: PREFIX,
      create: machine === "ctl",
      logger: silentLogger,
    });
    return { clock, store, bus, wake, monotonic };
  }

  // ---- processes --------------------------------------------------------------------------

  async startAgent(node: string): Promise<void> {
    const entry = this.#agents.get(node) ?? { host: "", handle: undefined, incarnation: 0, startedAt: 0 };
    // One agent per machine, as its supervisor and its state dir's lock keep it: two faults on the
    // same agent overlapping heal twice, and the second start replaces the first process.
    if (entry.host !== "") this.sched.kill(entry.host);
    entry.incarnation++;
    entry.host = `${node}/agent#${entry.incarnation}`;
    entry.startedAt = this.sched.elapsed;
    this.#agents.set(node, entry);
    const host = entry.host;
    const stateDir = join(this.#stateRoot, node);
    mkdirSync(stateDir, { recursive: true });
    // The previous process is gone: its lock file is stale (a real kill leaves no pid behind).
    rmSync(join(stateDir, "agent.lock"), { force: true });
    const aws = this.#aws(() => host, node);
    const timings = {
      heartbeatIntervalMs: this.config.heartbeatIntervalMs,
      failureTimeoutMs: this.config.failureTimeoutMs,
      fenceTimeoutMs: this.config.fenceTimeoutMs,
    };
    await this.sched.onHost(host, async () => {
      try {
        const handle = await startAgent(
          {
            shard: SHARD,
            nodeId: node,
            redis: `127.0.0.1:${REDIS_PORT}`,
            address: `${node}:${REDIS_PORT}`,
            stateDir,
            commandWaitSeconds: 20,
            ...timings,
          },
          {
            heartbeats: aws.store.heartbeats,
            replicaSets: aws.store.replicaSets,
            topology: aws.store.topology,
            shards: aws.store.shards,
            commands: aws.bus,
            clock: aws.clock,
            logger: this.#logger(host, this.#agentLog),
            monotonicNow: aws.monotonic,
            wake: aws.wake,
          },
          { database: new SimDatabase(this.cluster, () => host, `127.0.0.1:${REDIS_PORT}`, 1000) },
        );
        entry.handle = handle;
        this.#started.push(handle);
      } catch (error) {
        this.log(`${host} failed to start: ${errorMessage(error)}; retrying in 2 s`);
        this.sched.schedule(2000, () => void this.startAgent(node), undefined);
      }
    });
  }

  killAgent(node: string): void {
    const entry = this.#agents.get(node);
    if (!entry) return;
    this.sched.kill(entry.host);
    entry.handle = undefined;
  }

  agentHost(node: string): string | undefined {
    return this.#agents.get(node)?.host;
  }

  /** Stops one controller's loop after its current cycle (an invocation ending). */
  readonly #controllerStops = new Map<string, AbortController>();
  /**
   * When a controller's invocation ends (virtual ms), once the nemesis has set it: what Lambda's
   * `getRemainingTimeInMillis` counts down to. Unset: a process with no deadline.
   */
  readonly #controllerDeadlines = new Map<string, number>();
  /**
   * Per controller host: the lock owner tokens it drew and its AWS clock, so that the lease it holds
   * when the nemesis decides its end can be cut to that end (#cutLease).
   */
  readonly #controllerOwners = new Map<string, { owners: Set<string>; clock: AwsClock }>();

  startController(): void {
    this.#controllerIncarnation++;
    const host = `ctl/controller#${this.#controllerIncarnation}`;
    this.#controllerHost = host;
    const stop = new AbortController();
    this.#controllerStops.set(host, stop);
    const signal = AbortSignal.any([this.#abort.signal, stop.signal]);
    const aws = this.#aws(() => host, "ctl");
    const log = this.#logger(host, "info");
    const owners = new Set<string>();
    this.#controllerOwners.set(host, { owners, clock: aws.clock });
    this.sched.onHost(host, () => {
      const loop = new ControllerLoop({
        // The product's own token (src/controller/deps.ts), remembered for #cutLease.
        newOwner: () => {
          const owner = newOwnerToken();
          owners.add(owner);
          return owner;
        },
        store: aws.store,
        bus: aws.bus,
        events: { publish: async () => {} },
        clock: aws.clock,
        config: this.config,
        log,
        metrics: discardMetrics,
      });
      // The invocation's remaining time, as the Lambda handler passes it: once the nemesis has
      // decided when this invocation ends (#thawController), the loop cuts its leases to that end
      // and starts no phase that would not fit, as docs/controller.md ("Time budget") says.
      const remainingMs = () =>
        (this.#controllerDeadlines.get(host) ?? Number.POSITIVE_INFINITY) - this.sched.elapsed;
      void loop.run({ signal, wake: aws.wake, remainingMs }).catch((error) => {
        this.log(`${host} loop ended: ${errorMessage(error)}`);
      });
    });
  }

  get controllerHost(): string {
    return this.#controllerHost;
  }

  // ---- the workload -----------------------------------------------------------------------

  #topology():
    | { epoch: number; primary?: string; address?: string; status?: string; cooldownUntil?: number }
    | undefined {
    const item = this.table.peek({ pk: keys.controlPk(SHARD), sk: keys.topology });
    if (!item) return undefined;
    return {
      epoch: Number(item.epoch),
      primary: item.primary_node_id as string | undefined,
      address: item.primary_address as string | undefined,
      status: item.status as string | undefined,
      cooldownUntil: item.cooldown_until === undefined ? undefined : Number(item.cooldown_until),
    };
  }

  /**
   * The node the topology advertises to clients as the client library reads it (`endpointOf`,
   * src/client/primary-resolver.ts; the nemesis's writer resolves alike), undefined when none.
   */
  #advertisedPrimary(): string | undefined {
    const item = this.table.peek({ pk: keys.controlPk(SHARD), sk: keys.topology });
    const parsed = item === undefined ? undefined : topologySchema.safeParse(item);
    return parsed?.success ? endpointOf(parsed.data)?.nodeId : undefined;
  }

  readonly #clientConnections = new Map<string, SimConnection>();

  #connection(node: string): SimConnection {
    let connection = this.#clientConnections.get(node);
    if (!connection) {
      connection = new SimConnection(this.cluster, () => "client/app", `${node}:${REDIS_PORT}`, {
        name: "workload",
        connectTimeoutMs: 500,
        commandTimeoutMs: 1000,
        reconnectMs: 100,
      });
      this.#clientConnections.set(node, connection);
    }
    return connection;
  }

  /** One write: SET then WAIT 1, recorded as the nemesis's writer records it. */
  async #write(node: string, seq: number, stray: boolean): Promise<void> {
    this.history.append({
      process: "writer",
      type: "invoke",
      f: "write",
      value: { seq, ...(stray ? { stray } : {}) },
      node,
    });
    const connection = this.#connection(node);
    try {
      await connection.call(["SET", `k:${seq}`, String(seq)]);
    } catch (error) {
      const message = errorMessage(error);
      // Refused before it ran (READONLY, NOREPLICAS, not connected): a failure; a timeout: unknown.
      const definite = /READONLY|NOREPLICAS|closed/.test(message);
      this.history.append({
        process: "writer",
        type: definite ? "fail" : "info",
        f: "write",
        value: { seq, error: message, ...(stray ? { stray } : {}) },
        node,
      });
      return;
    }
    let replicas = 0;
    try {
      replicas = Number(await connection.call(["WAIT", "1", "500"]));
    } catch {
      replicas = 0;
    }
    if (replicas >= 1) this.#acknowledged.push(`k:${seq}`);
    this.history.append({
      process: "writer",
      type: "ok",
      f: "write",
      value: { seq, replicas, ...(stray ? { stray } : {}) },
      node,
    });
  }

  #startWorkload(writesPerSecond: number, until: number): void {
    const host = "client/app";
    let seq = 0;
    let lastEpoch: { epoch: number; primary?: string; status?: string } | undefined;
    this.sched.onHost(host, () => {
      const writeTick = () => {
        if (this.sched.elapsed >= until) return;
        this.sched.schedule(1000 / writesPerSecond, writeTick);
        const topology = this.#topology();
        const target = topology?.primary ?? "n1";
        // A failover's target once confirmed (phases repoint and cleanup) is the primary clients
        // take (endpointOf, docs/benchmark.md, issue 34): a write it takes is the shard's, not stray.
        const advertised = topology?.status === "failing_over" ? this.#advertisedPrimary() : undefined;
        seq++;
        this.#writes++;
        void this.#write(target, seq, false);
        // A client that never re-read the topology: any other node answering as master gets the write too.
        for (const node of NODES) {
          const server = this.cluster.servers.get(node);
          if (node !== target && server?.up && server.role === "master" && this.sched.random.chance(0.2)) {
            seq++;
            void this.#write(node, seq, node !== advertised);
          }
        }
      };
      const sampleTick = () => {
        this.sched.schedule(200, sampleTick);
        const writable: string[] = [];
        const refused: string[] = [];
        const unreachable: string[] = [];
        for (const node of NODES) {
          const server = this.cluster.servers.get(node) as RedisServer;
          if (!server.up || this.net.isCut("client", node) || this.net.isCut(node, "client"))
            unreachable.push(node);
          else if (server.acceptsWrites()) writable.push(node);
          else refused.push(node);
        }
        this.history.append({
          process: "sampler",
          type: "ok",
          f: "probe",
          value: { writable, refused, unreachable },
        });
        const topology = this.#topology();
        if (topology && (topology.epoch !== lastEpoch?.epoch || topology.primary !== lastEpoch?.primary)) {
          this.history.append({
            process: "observer",
            type: "ok",
            f: "epoch",
            value: {
              epoch: topology.epoch,
              primary: topology.primary,
              status: topology.status,
              previousEpoch: lastEpoch?.epoch,
              previousPrimary: lastEpoch?.primary,
              ...cooldownFor(topology.cooldownUntil, Date.now()),
            },
          });
          this.log(`topology epoch ${topology.epoch} primary ${topology.primary} status ${topology.status}`);
          if (topology.status !== lastEpoch?.status) this.#midFailoverPause(topology.status);
          lastEpoch = topology;
        }
      };
      this.sched.schedule(0, writeTick);
      this.sched.schedule(0, sampleTick);
    });
  }

  // ---- the nemesis ------------------------------------------------------------------------

  #primaryNode(): string {
    return this.#topology()?.primary ?? "n1";
  }

  /** A controller frozen (the old invocation) while a new one starts; wakes, runs on, then stops. */
  #freezeController(old: string): void {
    this.sched.pause(old);
    this.startController();
  }

  #thawController(old: string, lingerMs: number): void {
    // The frozen invocation wakes with lingerMs left before its end (a Lambda's deadline): a lease
    // it takes or renews from now on is cut to that end, so its lock does not outlive it.
    this.#controllerDeadlines.set(old, this.sched.elapsed + lingerMs);
    this.#cutLease(old, lingerMs);
    this.sched.resume(old);
    this.sched.schedule(lingerMs, () => {
      this.#controllerStops.get(old)?.abort();
      this.log(`nemesis ${old} stops after its current cycle`);
    });
  }

  /**
   * A lease `host` took before the nemesis froze it was asked for with no deadline known (the sim
   * decides on the freeze, and so on the invocation's end, only afterwards). A Lambda's deadline
   * is fixed when it starts, and every lease is `min(lockLeaseMs, remaining time)` (src/core/budget.ts
   * `leaseWithin`), so the lock of an invocation that ends in `remainingMs` expires by then at the
   * latest: the stored lease is cut to that, as the product would have asked for it.
   */
  #cutLease(host: string, remainingMs: number): void {
    const controller = this.#controllerOwners.get(host);
    const lock = this.table.peek({ pk: keys.controlPk(SHARD), sk: keys.lock });
    if (!controller || !lock || !controller.owners.has(String(lock.owner))) return;
    const end = controller.clock.now() + remainingMs;
    if (Number(lock.expires_at) <= end) return;
    this.table.execute("UpdateCommand", {
      Key: { pk: keys.controlPk(SHARD), sk: keys.lock },
      UpdateExpression: "SET expires_at = :end",
      ConditionExpression: "#owner = :owner",
      ExpressionAttributeNames: { "#owner": "owner" },
      ExpressionAttributeValues: { ":end": end, ":owner": lock.owner },
    });
    this.log(
      `nemesis ${host}'s lease cut to its end (${remainingMs} ms from now), as its deadline would have cut it`,
    );
  }

  #inject(kind: FaultKind | "controller-stall", durationMs: number): Fault | undefined {
    const random = this.sched.random;
    const target = random.chance(0.6) ? "primary" : "random";
    const node = target === "primary" ? this.#primaryNode() : random.pick(NODES);
    const server = this.cluster.servers.get(node) as RedisServer;
    const others = NODES.filter((n) => n !== node);
    const id = ++this.#faultIds;
    const fault = (
      nodes: readonly string[],
      heal: () => void,
      params?: Record<string, unknown>,
      ownDurationMs?: number,
    ): Fault => {
      this.history.append({
        process: "nemesis",
        type: "info",
        f: "inject",
        value: { id, kind, target, nodes, params },
      });
      this.log(
        `nemesis inject #${id} ${kind} ${target} ${nodes.join(",")} ${params ? JSON.stringify(params) : ""} for ${ownDurationMs ?? durationMs} ms`,
      );
      return { id, kind, target, nodes, heal, durationMs: ownDurationMs };
    };
    switch (kind) {
      case "kill-redis": {
        const mode = random.pick<RestartMode>(["empty", "rdb", "rdb", "replicaof"]);
        const saves = random.chance(0.5);
        if (this.#destroysLastCopy(kind, node)) return undefined;
        if (saves) server.save();
        server.crash();
        // The config files are the deployment's: n2 and n3 start as replicas of n1 (the first
        // primary), n1's has no `replicaof`, so it restarts from its RDB as a master (a restart of n1
        // replicating from itself never happens).
        const restartAs = mode === "replicaof" && node === "n1" ? "rdb" : mode;
        return fault([node], () => server.restart(restartAs, "n1:6379"), { mode: restartAs });
      }
      case "hang-redis":
        this.sched.pause(server.host);
        return fault([node], () => this.sched.resume(server.host));
      case "kill-agent":
        this.killAgent(node);
        return fault([node], () => void this.startAgent(node));
      case "agent-lost-state":
        this.killAgent(node);
        return fault([node], () => {
          rmSync(join(this.#stateRoot, node), { recursive: true, force: true });
          void this.startAgent(node);
        });
      case "pause-agent": {
        const host = this.agentHost(node);
        if (!host) return undefined;
        this.sched.pause(host);
        return fault([node], () => this.sched.resume(host));
      }
      case "partition-node": {
        for (const other of [...others, "aws", "client", "ctl"]) {
          this.net.cut(node, other);
          this.net.cut(other, node);
        }
        return fault([node], () => {
          for (const other of [...others, "aws", "client", "ctl"]) {
            this.net.heal(node, other);
            this.net.heal(other, node);
          }
        });
      }
      case "partition-oneway": {
        const inbound = random.chance(0.5);
        for (const other of others) inbound ? this.net.cut(other, node) : this.net.cut(node, other);
        return fault(
          [node],
          () => {
            for (const other of others) inbound ? this.net.heal(other, node) : this.net.heal(node, other);
          },
          { inbound },
        );
      }
      case "partition-redis-link": {
        const other = random.pick(others);
        this.net.cut(node, other);
        this.net.cut(other, node);
        return fault([node, other], () => {
          this.net.heal(node, other);
          this.net.heal(other, node);
        });
      }
      case "store-outage-node":
        this.net.cut(node, "aws");
        this.net.cut("aws", node);
        return fault([node], () => {
          this.net.heal(node, "aws");
          this.net.heal("aws", node);
        });
      case "store-outage-all":
        for (const machine of [...NODES, "ctl"]) {
          this.net.cut(machine, "aws");
          this.net.cut("aws", machine);
        }
        return fault([...NODES], () => {
          for (const machine of [...NODES, "ctl"]) {
            this.net.heal(machine, "aws");
            this.net.heal("aws", machine);
          }
        });
      case "store-flaky": {
        const faults: CallerFaults = { throttle: 0.2, ambiguous: 0.1, slowMs: random.int(0, 400) };
        for (const machine of [...NODES, "ctl"]) this.#callerFaults.set(machine, faults);
        return fault([...NODES], () => this.#callerFaults.clear(), { ...faults });
      }
      case "clock-step": {
        const step = random.int(-1500, 1500);
        this.cluster.clockOffset.set(node, (this.cluster.clockOffset.get(node) ?? 0) + step);
        return fault([node], () => this.cluster.clockOffset.set(node, 0), { stepMs: step });
      }
      case "pause-controller": {
        const host = this.controllerHost;
        this.sched.pause(host);
        return fault([], () => this.sched.resume(host));
      }
      case "sqs-unreliable": {
        const faults = { duplicate: 0.3, delayMs: random.int(0, 2000) };
        this.sqs.faults = { ...this.sqs.faults, ...faults };
        return fault(
          [],
          () => {
            const { duplicate: _d, delayMs: _m, ...rest } = this.sqs.faults;
            this.sqs.faults = rest;
          },
          faults,
        );
      }
      case "sqs-late": {
        const faults = { late: 0.3, lateMs: [5000, 60_000] as const };
        this.sqs.faults = { ...this.sqs.faults, ...faults };
        return fault(
          [],
          () => {
            const { late: _l, lateMs: _m, ...rest } = this.sqs.faults;
            this.sqs.faults = rest;
          },
          { late: faults.late },
        );
      }
      case "unmanaged-replica": {
        // A replica no agent runs on (analytics, backups): the agents know no node at its address.
        const existing = this.cluster.servers.get(UNMANAGED);
        if (existing?.up) return undefined;
        const replica =
          existing ??
          new RedisServer(this.cluster, {
            machine: UNMANAGED,
            backlogBytes: 1024 * 1024,
            configFile: new Map(),
          });
        if (existing) existing.restart("empty");
        replica.command(0, ["REPLICAOF", node, String(REDIS_PORT)], () => {});
        return fault([node], () => replica.crash(), { replica: UNMANAGED });
      }
      case "replica-lag": {
        const primary = this.#primaryNode();
        const replica = random.pick(NODES.filter((n) => n !== primary));
        const cut = random.chance(0.3);
        const extraMs = random.int(200, 5000);
        if (cut) this.net.cut(primary, replica);
        else this.net.slow(primary, replica, extraMs);
        return fault(
          [primary, replica],
          () => (cut ? this.net.heal(primary, replica) : this.net.slow(primary, replica, 0)),
          cut ? { cut } : { extraMs },
        );
      }
      case "store-ops": {
        const machine = random.chance(0.25) ? "ctl" : node;
        const reads = random.chance(0.5);
        const failAs = random.pick(["error", "timeout"] as const);
        const rate = random.pick([1, 1, 0.5]);
        const faults: CallerFaults = reads ? { failReads: rate, failAs } : { failWrites: rate, failAs };
        this.#opFaults.set(machine, faults);
        return fault(machine === "ctl" ? [] : [machine], () => this.#opFaults.delete(machine), {
          machine,
          ...faults,
        });
      }
      case "store-outage-agents":
        for (const machine of NODES) {
          this.net.cut(machine, "aws");
          this.net.cut("aws", machine);
        }
        return fault([...NODES], () => {
          for (const machine of NODES) {
            this.net.heal(machine, "aws");
            this.net.heal("aws", machine);
          }
        });
      case "controller-stall-failover": {
        const topology = this.#topology();
        this.#stall = { from: `${topology?.epoch}/${topology?.status}` };
        return fault(
          [],
          () => {
            this.#stall = undefined;
          },
          undefined,
          random.int(30_000, 120_000),
        );
      }
      case "controller-stall": {
        const old = this.controllerHost;
        if (this.sched.isPaused(old) || this.sched.isDead(old)) return undefined;
        this.#freezeController(old);
        const lingerMs = random.int(2000, 20_000);
        const pauseMs = random.chance(0.5) ? random.int(2000, 30_000) : random.int(40_000, 90_000);
        return fault([], () => this.#thawController(old, lingerMs), { old, lingerMs }, pauseMs);
      }
      case "restart-redis-fast": {
        const mode = random.pick<RestartMode>(["empty", "rdb"]);
        if (this.#destroysLastCopy(kind, node)) return undefined;
        server.crash();
        return fault([node], () => server.restart(mode), { mode }, random.int(100, 1500));
      }
      case "controller-overlap": {
        const old = this.controllerHost;
        if (this.sched.isPaused(old) || this.sched.isDead(old)) return undefined;
        this.#freezeController(old);
        const lingerMs = random.int(2000, 20_000);
        return fault(
          [],
          () => this.#thawController(old, lingerMs),
          { old, lingerMs },
          random.int(40_000, 90_000),
        );
      }
    }
  }

  /**
   * Whether a kill of `node`'s redis now would destroy the last copy of acknowledged writes, and
   * so is not injected (said in the trace): guarantee 1 keeps a write through the loss of one
   * copy, and two destroyed copies lose what no failover system can keep. The nemesis's copies
   * rule (src/dev/nemesis/copies.ts), read off the datasets themselves: simulator seed 510142
   * restarted n1, n3 and then n2, the last holder, from RDBs behind 226 writes. What the node's
   * own RDB holds does not count (a restart may come from it or not). Another node's copy counts
   * while its process lives (hung or cut off too: it still holds the data); a replica's only while
   * its agent protects it (`agentProtects`: running, not paused, up long enough to have watched
   * its primary), for Redis resyncs a replica from its restarted primary otherwise (guarantee 1's
   * assumption, docs/safety.md). n4, a replica no agent runs on, never counts.
   */
  #destroysLastCopy(kind: string, node: string): boolean {
    const target = this.cluster.servers.get(node) as RedisServer;
    if (!target.up) return false;
    const others = NODES.filter((other) => other !== node).flatMap((other) => {
      const server = this.cluster.servers.get(other) as RedisServer;
      if (!server.up) return [];
      if (server.role === "master") return [server.data];
      const entry = this.#agents.get(other);
      // An entry is in the map only once its agent has a host and a start time (startAgent).
      const running = entry !== undefined && !this.sched.isDead(entry.host);
      const protects = agentProtects({
        running,
        busy: running && this.sched.isPaused(entry.host),
        upForMs: entry === undefined ? undefined : this.sched.elapsed - entry.startedAt,
      });
      return protects ? [server.data] : [];
    });
    const sole = soleCopies(target.data, this.#acknowledged, others);
    if (sole.length === 0) return false;
    this.#faultsSkipped++;
    this.log(
      `nemesis skips ${kind} ${node}: it holds the only copy of ${sole.length} acknowledged writes (${sole[0]} … ${sole[sole.length - 1]}); a second destroyed copy is beyond guarantee 1`,
    );
    return true;
  }

  #heal(fault: Fault): void {
    fault.heal();
    this.history.append({
      process: "nemesis",
      type: "info",
      f: "heal",
      value: { id: fault.id, kind: fault.kind, target: fault.target, nodes: fault.nodes },
    });
    this.log(`nemesis heal #${fault.id} ${fault.kind}`);
  }

  #startNemesis(until: number, kinds: readonly FaultKind[], overlap: boolean): void {
    this.sched.onHost("nemesis", () => {
      const next = () => {
        if (this.sched.elapsed >= until) return;
        const random = this.sched.random;
        const kind = random.pick(kinds);
        const drawn = random.int(2000, 30_000);
        const fault = this.#inject(kind, drawn);
        const duration = fault?.durationMs ?? drawn;
        const gap = random.int(5000, 25_000);
        if (fault) this.#activate(fault, duration);
        this.sched.schedule(overlap ? gap : duration + gap, next);
      };
      this.sched.schedule(15_000, next);
    });
  }

  #activate(fault: Fault, duration: number): void {
    this.active.add(fault);
    this.sched.schedule(
      duration,
      () => {
        if (!this.active.has(fault)) return;
        this.active.delete(fault);
        this.#heal(fault);
      },
      "nemesis",
    );
  }

  /**
   * With `controller-overlap` drawn: a failover's first step (the topology leaves `online`) pauses
   * the controller there, a quarter of the time, while the faults last.
   */
  #midFailoverPause(status: string | undefined): void {
    if (!this.#overlapOnFailover || status === "online" || this.sched.elapsed >= this.#faultsUntil) return;
    this.sched.onHost("nemesis", () => {
      if (!this.sched.random.chance(0.25)) return;
      const fault = this.#inject("controller-overlap", 0);
      if (fault) this.#activate(fault, fault.durationMs ?? 60_000);
    });
  }

  #overlapOnFailover = false;
  #faultsUntil = 0;

  readonly active = new Set<Fault>();

  // ---- a run ------------------------------------------------------------------------------

  async run(options: SimOptions): Promise<SimResult> {
    const started = process.hrtime.bigint();
    const cpuStarted = process.cpuUsage();
    const minutes = options.minutes ?? 5;
    const faultsUntil = minutes * 60_000;
    const settle = (options.settleSeconds ?? 60) * 1000;
    this.#agentLog = options.agentLog ?? "warn";
    this.sched.install();
    try {
      for (const node of NODES) new RedisServer(this.cluster, { machine: node, backlogBytes: 1024 * 1024 });
      for (const node of ["n2", "n3"]) {
        const server = this.cluster.servers.get(node) as RedisServer;
        server.command(0, ["REPLICAOF", "n1", String(REDIS_PORT)], () => {});
      }
      // Each replica's RDB is saved now and then: a restart from it may be minutes old.
      this.sched.onHost("rdb", () => {
        const save = () => {
          this.sched.schedule(this.sched.random.int(5000, 60_000), save);
          for (const server of this.cluster.servers.values())
            if (this.sched.random.chance(0.5)) server.save();
        };
        this.sched.schedule(5000, save);
      });
      this.startController();
      for (const node of NODES) void this.startAgent(node);
      this.#startWorkload(options.writesPerSecond ?? 25, faultsUntil + settle);
      const kinds = options.faultKinds ?? FAULT_KINDS;
      this.#overlapOnFailover = options.faults !== false && kinds.includes("controller-overlap");
      this.#faultsUntil = faultsUntil;
      if (options.faults !== false) this.#startNemesis(faultsUntil, kinds, options.overlap === true);
      await this.sched.runUntil(this.sched.now + faultsUntil);
      // Heal everything, bring every process back, let the shard settle.
      for (const fault of [...this.active]) {
        this.active.delete(fault);
        this.#heal(fault);
      }
      this.net.healAll();
      for (const node of NODES) {
        const server = this.cluster.servers.get(node) as RedisServer;
        if (!server.up) server.restart("rdb");
        if (this.sched.isPaused(server.host)) this.sched.resume(server.host);
        const host = this.agentHost(node);
        if (host === undefined || this.sched.isDead(host)) void this.startAgent(node);
      }
      await this.sched.runUntil(this.sched.now + settle);
      const final = this.#finalRead();
      this.#checkModel();
      this.log(
        `final ${JSON.stringify(final.nodes.map((n) => ({ node: n.node, role: n.role, following: n.following, linkUp: n.linkUp, keys: n.seqs?.length })))} topology ${final.topologyPrimary}/${final.topologyStatus}`,
      );
      // The nemesis's own options (src/dev/nemesis/runner.ts): the same rules judge both.
      const result = check(this.history.ops, final, {
        fenceWindowMs: FENCE_WINDOW_MS,
        causeWindowMs: 15_000,
        maxWriteGapMs: 10_000,
        availabilityLimitMs: availabilityLimitMs(this.config),
      });
      // The checker lets a missing topology pass (the nemesis always has one); here every run starts
      // from nothing, so a shard never initialised or left offline after the settle is a failure.
      const violations = [...result.violations];
      if (final.topologyPrimary === undefined || final.topologyStatus !== "online")
        violations.push(
          `(d) after ${settle / 1000} s healed the topology is ${final.topologyStatus ?? "absent"} with primary ${final.topologyPrimary ?? "none"}`,
        );
      return {
        seed: options.seed,
        simulatedMs: this.sched.elapsed,
        wallMs: Number((process.hrtime.bigint() - started) / 1_000_000n),
        cpuMs: Math.round(process.cpuUsage(cpuStarted).user / 1000),
        valid: violations.length > result.violations.length ? false : result.valid,
        violations,
        check: result,
        faults: this.#faultIds - this.#faultsSkipped,
        faultsSkipped: this.#faultsSkipped,
        timersFired: this.sched.fired,
        writes: this.#writes,
        modelErrors: this.cluster.modelErrors,
        trace: this.trace,
      };
    } finally {
      await this.#endProcesses();
      this.sched.uninstall();
      rmSync(this.#stateRoot, { recursive: true, force: true });
    }
  }

  /**
   * Ends every process of the run (controllers, agents, killed agents too) once its result is
   * taken, while the virtual timers are still installed, so nothing they schedule on the way out
   * ever runs. A simulated kill, like the end of the run, only drops a host's timers: its code
   * stays suspended where it was. An agent's heartbeat loop sleeps on `AbortSignal.any([...])`
   * with an abort listener, and Node keeps such a signal in a process-wide set until the listener
   * is removed (by the timer or an abort). Through the listener's closure that signal held the
   * agent, and the agent this world (its history, trace, models and timers): every seed's world
   * stayed in memory for the rest of a batch (issue 32). Aborting removes the listeners.
   */
  async #endProcesses(): Promise<void> {
    this.#ended = true;
    this.#abort.abort();
    for (const handle of this.#started) handle.stop().catch(() => {});
    this.#started.length = 0;
    await this.sched.settle();
  }

  /** A replica linked at its master's offset holds exactly its master's data, or the model is wrong. */
  #checkModel(): void {
    for (const server of this.cluster.servers.values()) {
      if (!server.up || server.role !== "slave" || !server.linkUp || server.link === undefined) continue;
      const master = server.link.master;
      if (master.offset !== server.offset) continue;
      const same =
        master.data.size === server.data.size && [...master.data.keys()].every((key) => server.data.has(key));
      if (!same)
        this.cluster.modelErrors.push(
          `${server.machine}: at its master's offset ${server.offset} with other data`,
        );
    }
    for (const error of this.cluster.modelErrors) this.log(`MODEL ERROR ${error}`);
  }

  #finalRead(): FinalRead {
    const topology = this.#topology();
    const byAddress = new Map(NODES.map((node) => [`${node}:${REDIS_PORT}`, node]));
    return {
      nodes: NODES.map((node) => {
        const server = this.cluster.servers.get(node) as RedisServer;
        if (!server.up) return { node, reachable: false };
        return {
          node,
          reachable: true,
          role: server.role,
          following: server.following === undefined ? undefined : byAddress.get(server.following),
          linkUp: server.linkUp,
          seqs: [...server.data.keys()]
            .filter((key) => key.startsWith("k:"))
            .map((key) => Number(key.slice(2))),
        };
      }),
      topologyPrimary: topology?.primary,
      topologyStatus: topology?.status,
    };
  }
}

/** Runs one seed. */
export async function simulate(options: SimOptions): Promise<SimResult> {
  return new SimWorld(options.seed).run(options);
}

export { machineOf };
