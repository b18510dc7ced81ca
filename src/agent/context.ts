import type { AgentCycleState } from "../core/agent-cycle.ts";
import type { DatabaseIdentity, PeerPoint } from "../core/identity.ts";
import type { CrashReport, HeartbeatInput, Topology } from "../core/model.ts";
import type { Logger } from "../core/observability.ts";
import type {
  Clock,
  CommandBus,
  HeartbeatStore,
  ReplicaSetStore,
  ShardIndex,
  TopologyStore,
} from "../core/ports.ts";
import type { WakeSender } from "../core/wake.ts";
import type { Database } from "./database.ts";
import { DatabaseRecord } from "./db-record.ts";
import type { AgentOptions } from "./options.ts";
import { PauseWatch } from "./pause-watch.ts";
import { PrimaryProbe } from "./primary-probe.ts";
import type { ReplicationInfo } from "./redis-info.ts";
import { ReportSchedule } from "./report-schedule.ts";
import { Mutex } from "./scheduling.ts";
import type { StateDir } from "./state-dir.ts";
import { StoreHealth } from "./store-health.ts";

/** The ports the agent needs; entry points pass the AWS adapters, in-process callers may share theirs. */
export interface AgentDeps {
  readonly heartbeats: HeartbeatStore;
  readonly replicaSets: ReplicaSetStore;
  readonly topology: TopologyStore;
  readonly shards: ShardIndex;
  readonly commands: CommandBus;
  /** AWS-aligned clock for heartbeat timestamps. */
  readonly clock: Clock;
  /** @default JSON lines on stdout at level info */
  readonly logger?: Logger;
  /** Monotonic ms for durations (fence timeout, loop pacing). @default performance.now */
  readonly monotonicNow?: () => number;
  /** Tells the controller to look at the shard now (the crash fast path). @default none: it waits a tick */
  readonly wake?: WakeSender;
}

/** The replica's probe of its primary runs this many times per failure timeout (between 100 ms and 1 s apart). */
const PROBES_PER_FAILURE_TIMEOUT = 3;

/** Events the agent counts: commands by outcome, failed store calls by operation. */
export type AgentEvent = "command" | "store_error";

/** Everything the agent's loops share. One per running agent. */
export class AgentContext {
  readonly options: AgentOptions;
  readonly nodeId: string;
  /** host:port other nodes reach this database on. */
  readonly address: string;
  readonly deps: AgentDeps;
  readonly db: Database;
  readonly state: StateDir;
  readonly logger: Logger;
  readonly monotonicNow: () => number;
  readonly storeTimeoutMs: number;
  /** Held while the database's role or write fence changes, so that no two changes interleave. */
  readonly roleLock = new Mutex();
  /** Times this process did not run for a heartbeat interval (run by the heartbeat loop). */
  readonly pauses: PauseWatch;
  /** When this agent reports (src/agent/report-schedule.ts). */
  readonly schedule: ReportSchedule;
  /** Whether the coordination store answers (src/agent/store-health.ts). */
  readonly store: StoreHealth;
  /** What the agent knows of its database's process (src/agent/db-record.ts). */
  readonly dbRecord: DatabaseRecord;

  /** Bumped on every change of role; a heartbeat built before a change is not written after it. */
  roleGeneration = 0;
  /**
   * run_id of the database process this agent last pointed at a primary (REPLICAOF, or a
   * follow it judged and kept): a replica process with another run_id follows whatever its
   * config file (or an operator) named.
   */
  pointedRunId: string | undefined;
  /** The last INFO replication that answered. */
  lastInfo: ReplicationInfo | undefined;
  /** `roleGeneration` when `lastInfo` was read: it still describes the role if nothing changed since. */
  lastInfoGeneration = -1;
  /** The topology names this node primary while its database answers as a replica (logged once per stretch). */
  namedButReplica = false;
  dbUp = false;
  /** The latest heartbeat cycle read the topology (a fence is lifted only then). */
  topologyFresh = false;
  /**
   * The replicas' published heartbeat counts when this agent's own writes began to fail;
   * undefined while they succeed.
   */
  witnessBaseline: ReadonlyMap<string, number> | undefined;
  /** Members seen writing to the store since this agent's writes began to fail. */
  storeWitnesses: readonly string[] = [];
  /** AWS-aligned ms when this primary's writes to the store began to fail (failsafe), if they do. */
  failsafeSince: number | undefined;
  /** Whether the topology was read since start: a primary claims nothing before it was. */
  topologyRead = false;
  lastTopology: Topology | undefined;
  /** node address -> node id, learned from heartbeats, the topology and commands. */
  readonly knownNodes = new Map<string, string>();

  /**
   * Whether the topology confirms this node as primary (last read); undefined before the first
   * read. While the store is unreachable the last answer stands.
   */
  confirmed: boolean | undefined;
  unconfirmedReason: string | undefined;
  /** This primary's stored replica set: the write guard's membership. */
  guardMembers: readonly string[] = [];
  /**
   * What the shard's other nodes hold by their stored heartbeats in the last snapshot, however old
   * (`peerPointOf`): a restarted primary is fenced when one of them may hold its data (`judgeRestart`).
   */
  othersHold: readonly PeerPoint[] = [];
  /**
   * When the snapshot \`othersHold\` comes from was read (AWS-aligned ms, before the request) and
   * when each other node's agent last wrote by it (ms): a restart is judged on peers' reports
   * written after it (src/agent/db-identity.ts, \`pendingRestart\`).
   */
  othersRead: { readonly from: number; readonly writtenMs: ReadonlyMap<string, number> } | undefined;
  /** What the write guard last set on the database ("fence", "open", "guard:<n>", "replica"). */
  appliedGuard: string | undefined;
  /**
   * The topology epoch at which the guard was last set: a newer one sets it again, since another
   * node may have set this database's fence meanwhile (a successor's, src/core/depose.ts).
   */
  appliedGuardEpoch: number | undefined;
  /**
   * Old primaries this node, promoted at \`epoch\`, could not fence yet (src/agent/depose.ts): tried
   * again every cycle while the topology names this node primary at that epoch.
   */
  deposePending: { readonly epoch: number; addresses: string[] } | undefined;
  /** A retry of \`deposePending\` is running (one at a time). */
  deposeInFlight = false;
  /** Monotonic ms until which a freshly promoted node refuses writes (the old primary's guard window). */
  promotionFenceUntil = Number.NEGATIVE_INFINITY;
  /** Monotonic ms of this replica's last contact with its primary (link up, recent I/O). */
  primaryContactAt: number | undefined;
  /** A replica's own connection to its primary. */
  readonly probe: PrimaryProbe;
  /**
   * What this agent saw of its database's death since it last answered (src/agent/crash-watch.ts),
   * written in its `db_status: down` heartbeats; cleared when the database answers again.
   */
  crash: CrashReport | undefined;
  /** Runs the heartbeat cycle now instead of at its next tick (set by the heartbeat loop). */
  wakeHeartbeat: () => void = () => {};
  /** Counts an event for `/metrics` (src/agent/http-endpoint.ts); nothing without the HTTP endpoint. */
  count: (event: AgentEvent, label: string) => void = () => {};

  constructor(init: {
    options: AgentOptions;
    nodeId: string;
    deps: AgentDeps;
    db: Database;
    state: StateDir;
    logger: Logger;
  }) {
    this.options = init.options;
    this.nodeId = init.nodeId;
    this.address = init.options.address ?? init.options.redis;
    this.deps = init.deps;
    this.db = init.db;
    this.state = init.state;
    this.logger = init.logger;
    this.monotonicNow = init.deps.monotonicNow ?? (() => performance.now());
    this.storeTimeoutMs = init.options.storeTimeoutMs ?? Math.max(init.options.heartbeatIntervalMs, 1000);
    this.pauses = new PauseWatch(this.monotonicNow, init.options.heartbeatIntervalMs);
    this.schedule = new ReportSchedule(this.monotonicNow());
    this.dbRecord = new DatabaseRecord(init.state.state);
    this.store = new StoreHealth(init.logger, init.options.failureTimeoutMs, (what) =>
      this.count("store_error", what),
    );
    this.probe = new PrimaryProbe(
      this,
      Math.max(100, Math.min(1000, Math.floor(init.options.failureTimeoutMs / PROBES_PER_FAILURE_TIMEOUT))),
    );
  }

  /** What the heartbeat cycle's plan reads of this agent (src/core/agent-cycle.ts). */
  cycleState(): AgentCycleState {
    const { schedule } = this;
    return {
      storeRequested: schedule.storeRequested,
      topologyRead: this.topologyRead,
      confirmed: this.confirmed,
      lastWritten: schedule.lastWritten,
      doubtSince: schedule.doubtSince,
      wokeFor: schedule.wokeFor,
      reportUntil: schedule.reportUntil,
      topologyDoubt: schedule.topologyDoubt,
      dbUp: this.dbUp,
      dbRestarted: this.dbRestarted,
      crash: this.crash,
    };
  }

  /** The database's identity as last read (`dbRecord`). */
  get identity(): DatabaseIdentity | undefined {
    return this.dbRecord.identity;
  }

  /** The database restarted without its data while primary: fenced until it follows (`dbRecord`). */
  get dbRestarted(): boolean {
    return this.dbRecord.restarted;
  }

  get storeUp(): boolean {
    return this.store.up;
  }

  /** The last heartbeat written (`schedule`). */
  get lastHeartbeat(): HeartbeatInput | undefined {
    return this.schedule.lastHeartbeat;
  }

  /** The last heartbeat built from a database answer, written or not (\`schedule\`). */
  get lastAnswered(): HeartbeatInput | undefined {
    return this.schedule.lastAnswered;
  }

  /** Monotonic ms of the last heartbeat write that succeeded (start time before the first). */
  get lastHeartbeatWrittenAt(): number {
    return this.schedule.lastWrittenAt;
  }

  get heartbeatsWritten(): number {
    return this.schedule.heartbeatsWritten;
  }

  get shard(): string {
    return this.options.shard;
  }

  get highestEpoch(): number {
    return this.state.state.highest_epoch;
  }

  /** Log attributes that every line about this node carries besides the persistent keys. */
  get epochContext(): Record<string, unknown> {
    return { epoch: this.highestEpoch };
  }
}
