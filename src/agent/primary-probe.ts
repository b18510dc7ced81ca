import { parseAddress } from "../core/address.ts";
import { errorMessage } from "../core/errors.ts";
import {
  holdsThroughLinks,
  type RememberedPrior,
  rememberPrior,
  supersededBy,
  syncWouldDestroy,
  withRememberedPrior,
} from "../core/identity.ts";
import type { Topology } from "../core/model.ts";
import type { Logger } from "../core/observability.ts";
import { refusesWrites } from "../core/write-guard.ts";
import type { Database, DatabaseLink } from "./database.ts";
import { topologyPrimary } from "./fencing.ts";
import type { AgentOptions } from "./options.ts";
import type { ReplicationInfo } from "./redis-info.ts";
import type { Mutex } from "./scheduling.ts";
import type { StateDir } from "./state-dir.ts";

/**
 * What the probe reads and changes of its agent (`AgentContext` is one): declared here so that the
 * probe does not import the context that creates it.
 */
export interface ProbeContext {
  readonly options: AgentOptions;
  readonly nodeId: string;
  readonly db: Database;
  readonly logger: Logger;
  readonly roleLock: Mutex;
  roleGeneration: number;
  pointedRunId?: string | undefined;
  readonly lastInfo: ReplicationInfo | undefined;
  readonly lastInfoGeneration: number;
  readonly heartbeatsWritten: number;
  readonly lastTopology: Topology | undefined;
  readonly highestEpoch: number;
  readonly epochContext: Record<string, unknown>;
  readonly wakeHeartbeat: () => void;
  readonly monotonicNow: () => number;
  /** Where the park is kept across agent restarts (\`parked\`). */
  readonly state: StateDir;
}
/**
 * A replica's own look at its primary, as Sentinel does: a connection to the primary's address
 * that (1) answers whether the primary serves within a timeout, so a hung primary (SIGSTOP, a
 * wedged host) is voted down long before Redis's `repl-timeout`, and (2) tells at once when the
 * primary's process went away, so the replica is *parked* (replicating from an address nobody
 * listens on) before its Redis reconnects by itself: a primary restarted empty by its supervisor
 * would otherwise hand every replica an empty dataset in a full resync. The replica is unparked
 * when the primary is back as the same process or one that continues its lineage; otherwise it
 * waits for the controller (the primary, fenced by its own agent, is failed over).
 *
 * The connection also carries a witness the other way: its client name is
 * `shardguard-probe.<node id>.<heartbeats written>`, so the primary's agent, when its own writes
 * to the coordination store fail, can tell from `CLIENT LIST` whether its replicas still reach the
 * store (their counts move: it alone is cut off, and fences so that it can be replaced) or not (a
 * store outage: it keeps serving under the replica-set guard). docs/agent.md#fence-policies.
 */

/** Where a parked replica points: no listener on port 1, so Redis keeps the dataset and retries. */
export const PARKED_HOST = "127.0.0.1";
export const PARKED_PORT = 1;
export const PARKED_ADDRESS = `${PARKED_HOST}:${PARKED_PORT}`;

export type ProbeResult = "ok" | "unreachable" | "restarted" | "fenced";

/**
 * Probes in a row without an answer after which a replica is parked, as when the primary's
 * connection closes: a partition hides a death (no close arrives, and Redis counts the link up
 * until its 60 s \`repl-timeout\`), and the replica would full-sync from a primary restarted empty
 * meanwhile the moment the partition heals (nemesis seed 5501: every replica wiped so). A replica
 * that cannot hear its primary acknowledges nothing anyway; the probe unparks it when the primary
 * answers as the same process (or one continuing its data).
 */
export const PARK_AFTER_SILENT_PROBES = 3;

const PROBE_NAME_PREFIX = "shardguard-probe.";

/** The probe connection's client name: who probes and how many heartbeats it has written. */
export function probeName(nodeId: string, heartbeatsWritten: number): string {
  return `${PROBE_NAME_PREFIX}${nodeId}.${heartbeatsWritten}`;
}

/** node id -> heartbeats written, from the client names of the probes connected to a primary. */
export function probeCounts(names: readonly string[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const name of names) {
    if (!name.startsWith(PROBE_NAME_PREFIX)) continue;
    const rest = name.slice(PROBE_NAME_PREFIX.length);
    const dot = rest.lastIndexOf(".");
    const count = Number(rest.slice(dot + 1));
    if (dot <= 0 || !Number.isSafeInteger(count)) continue;
    const id = rest.slice(0, dot);
    // Two connections of one node (a reconnect not yet closed): the higher count is the newer.
    counts.set(id, Math.max(count, counts.get(id) ?? 0));
  }
  return counts;
}

export class PrimaryProbe {
  #client: DatabaseLink | undefined;
  #address: string | undefined;
  /** Monotonic ms when the connection to `#address` was opened. */
  #trackedAt = 0;
  /** The client name last set on the connection (undefined after a reconnect). */
  #published: string | undefined;
  /** run_id of the primary while this replica was linked to it. */
  #runId: string | undefined;
  /** This replica's replication id while it was linked to that primary (the lineage its data is). */
  #linkedReplId: string | undefined;
  /** The primary's replication offset in the last probe's answer (undefined: no answer). */
  #primaryOffset: number | undefined;
  /** Probes in a row the primary did not answer (PARK_AFTER_SILENT_PROBES). */
  #silent = 0;
  /**
   * Closes of the probe's connection so far: an answer is about the process that gave it only while
   * no close came after it was asked (\`#unpark\`).
   */
  #closes = 0;
  /**
   * The earlier lineage this replica's data continues by its primary's report (\`rememberPrior\`):
   * learnt while linked on the primary's replication id, kept while the replica is on that id
   * (whatever it follows, parked or not, its database restarted on that id or not), forgotten once
   * it left it.
   */
  #remembered: RememberedPrior | undefined;

  /** The primary's `master_repl_offset` read by the last `probe()` (the heartbeat's `primary_probe_offset`). */
  get primaryOffset(): number | undefined {
    return this.#primaryOffset;
  }
  /**
   * Topology epoch when the replica was parked. A newer topology that names the same address
   * again is a new decision (the controller promoted whatever runs there now): follow it.
   */
  parkedAtEpoch: number | undefined;
  /**
   * The last probe of the address this replica is parked from found a process there that does not
   * hold its data (\`restarted\`): a newer topology naming that address again is no decision to give
   * the data up (an abandoned failover returns the shard to its old primary under a new epoch,
   * unjudged: simulator seed 150370, 200 acknowledged writes lost). Cleared by any other answer and
   * by a new address.
   */
  lacksMyData = false;
  /**
   * The address this agent parked the replica from, kept when the database process restarts (as a
   * master, from its RDB: the park is not in its config) and cleared once the replica follows a
   * primary again or is promoted. Its step-down to that address waits as its park did
   * (\`staysParked\`): simulator seed 7053, n2 parked from n1 at epoch 8, its process restarted from
   * its RDB, stepped down to n1 restarted empty, was wiped: 389 acknowledged writes lost.
   */
  get parkedFrom(): string | undefined {
    return this.#parkedFrom;
  }

  /** Kept in the state dir too (with \`parkedAtEpoch\`, set first): an agent restart keeps the park. */
  set parkedFrom(address: string | undefined) {
    this.#parkedFrom = address;
    const saved = this.#ctx.state.state.parked;
    if (address === undefined) {
      if (saved !== undefined) this.#ctx.state.update({ parked: undefined });
      return;
    }
    const atEpoch = this.parkedAtEpoch ?? 0;
    if (saved?.from !== address || saved.at_epoch !== atEpoch)
      this.#ctx.state.update({ parked: { from: address, at_epoch: atEpoch } });
  }

  #parkedFrom: string | undefined;
  readonly #ctx: ProbeContext;
  readonly #timeoutMs: number;

  constructor(ctx: ProbeContext, timeoutMs: number) {
    this.#ctx = ctx;
    this.#timeoutMs = timeoutMs;
    // A park from before this agent's restart (nemesis seed 6601).
    const saved = ctx.state.state.parked;
    if (saved !== undefined) {
      this.parkedAtEpoch = saved.at_epoch;
      this.#parkedFrom = saved.from;
    }
  }

  /**
   * A parked replica whose park this agent restored from its state dir (\`parked\`) but watches no
   * address yet: probes the address it was parked from again, keeping the park, so that it is
   * unparked once that address holds its data again (or stays parked while it does not).
   */
  resumeParkedWatch(): void {
    if (this.#address !== undefined) return;
    const saved = this.#parkedFrom;
    const adopted = saved === undefined ? this.#adoptablePark() : undefined;
    const from = saved ?? adopted?.address;
    const atEpoch = saved !== undefined ? this.parkedAtEpoch : adopted?.epoch;
    if (from === undefined) return;
    this.track(from);
    this.parkedAtEpoch = atEpoch;
    this.parkedFrom = from;
    if (adopted !== undefined) {
      this.#ctx.logger.info("parked replica: watching the topology's primary for its data", {
        ...this.#ctx.epochContext,
        primaryAddress: adopted.address,
        topologyEpoch: adopted.epoch,
      });
    }
  }

  /**
   * A park this agent does not know where from (its state dir lost, or the database parked before
   * this process started) is taken as a park from the primary a committed (\`online\`) topology
   * names: the probe then follows that primary once it is known to hold this replica's data, and
   * never before (\`staysParked\` holds the repoint at that epoch). Without it such a replica waited
   * for a newer epoch, for ever while that primary stayed healthy (guarantee 3; simulator seed
   * 420081: n3's agent restarted without its state, n2 healthy and ahead on n3's lineage).
   */
  #adoptablePark(): { address: string; epoch: number } | undefined {
    const topology = this.#ctx.lastTopology;
    if (topology === undefined || topology.status !== "online") return undefined;
    const named = topologyPrimary(topology);
    if (named === undefined || named.node_id === this.#ctx.nodeId) return undefined;
    return { address: named.address, epoch: topology.epoch };
  }

  get address(): string | undefined {
    return this.#address;
  }

  /**
   * \`info\` with the earlier lineage its data continues: Redis's own \`master_replid2\`, else the
   * one remembered from its primary's report while it is on that primary's replication id (a full
   * sync clears the replica's own: \`RememberedPrior\`). The probe judges its primary on it, and the
   * heartbeat reports it as \`prior_lineage\`.
   */
  withPrior(info: ReplicationInfo): ReplicationInfo {
    return withRememberedPrior(info, this.#remembered);
  }

  /** run_id of the primary process this replica last replicated from (kept while parked). */
  get lastPrimaryRunId(): string | undefined {
    return this.#runId;
  }

  /** Watches `address` (the primary this replica follows or was parked from). */
  track(address: string): void {
    // The replica follows a primary (not parked): any park is over.
    this.parkedFrom = undefined;
    if (this.#address === address && this.#client) return;
    this.close();
    if (this.#address !== address) this.lacksMyData = false;
    this.#address = address;
    this.#trackedAt = this.#ctx.monotonicNow();
    this.#runId = undefined;
    this.#linkedReplId = undefined;
    this.#silent = 0;
    const client = this.#ctx.db.dial(address, {
      name: probeName(this.#ctx.nodeId, this.#ctx.heartbeatsWritten),
      connectTimeoutMs: this.#timeoutMs,
      commandTimeoutMs: this.#timeoutMs,
      reconnectMs: 100,
    });
    client.on("close", () => {
      this.#closes++;
      void this.#lost(address);
    });
    client.on("ready", () => {
      this.#published = undefined;
    });
    this.#client = client;
  }

  /**
   * Publishes this replica's heartbeat count, then reads INFO of the primary and whether it
   * refuses every write (`refusesWrites`), within the timeout; undefined when it does not answer.
   */
  async #info(): Promise<{ info: ReplicationInfo; fenced: boolean } | undefined> {
    const client = this.#client;
    if (client === undefined || !(await this.#ready(client))) return undefined;
    try {
      const name = probeName(this.#ctx.nodeId, this.#ctx.heartbeatsWritten);
      if (name !== this.#published) {
        await client.setName(name);
        this.#published = name;
      }
      const info = await client.replicationInfo();
      const minReplicas = await client.configGet("min-replicas-to-write");
      return { info, fenced: refusesWrites(Number(minReplicas), info.goodReplicas) };
    } catch {
      return undefined;
    }
  }

  /**
   * The connection is ready, or becomes so within what is left of the timeout since it was opened:
   * a probe opened a moment ago (the replica was just pointed at this primary) has had no time to
   * get an answer, and "unreachable" from it would be a vote against a primary nobody asked.
   */
  async #ready(client: DatabaseLink): Promise<boolean> {
    if (client.ready) return true;
    const left = this.#timeoutMs - (this.#ctx.monotonicNow() - this.#trackedAt);
    if (left <= 0) return false;
    return await new Promise<boolean>((resolve) => {
      const done = (ready: boolean) => {
        clearTimeout(timer);
        client.off("ready", onReady);
        resolve(ready);
      };
      const onReady = () => done(true);
      const timer = setTimeout(() => done(false), left);
      client.on("ready", onReady);
    });
  }

  /**
   * Probes the primary; `read` is this replica's INFO. Unparks a parked replica whose primary is
   * back as itself (or continues its lineage).
   */
  async probe(read: ReplicationInfo): Promise<ProbeResult> {
    const closesBefore = this.#closes;
    const answer = await this.#info();
    this.#primaryOffset = answer?.info.role === "primary" ? answer.info.offset : undefined;
    // Forgotten as soon as the replica left the id it was learnt on; learnt below, once linked.
    this.#remembered = rememberPrior(this.#remembered, read, { replId: "", offset: 0 }, false);
    // This replica's data as the probe judges it: with the earlier lineage remembered from its
    // primary's report when Redis shows none (a full sync clears it: simulator seeds 343143, 372957).
    const mine = this.withPrior(read);
    if (answer === undefined) {
      this.#silent++;
      const address = this.#address;
      if (this.#silent >= PARK_AFTER_SILENT_PROBES && address !== undefined && !isParked(mine)) {
        await this.#lost(address, `no answer to ${this.#silent} probes in a row`);
      }
      return "unreachable";
    }
    this.#silent = 0;
    const primary = answer.info;
    const parked = isParked(mine);
    // The primary continues this replica's data also through either one's earlier lineage
    // (`holdsAllOf`), or through the shard's recorded lineage history (`topology.ancestry`: a
    // replica restarted from an RDB saved before a later promotion; simulator seed 52256).
    const continues =
      primary.role === "primary" && holdsThroughLinks(primary, mine, this.#ctx.lastTopology?.ancestry ?? []);
    // Only a replica that still holds the lineage it was linked on can say its primary lost it (and
    // has data a sync could destroy): one whose own database restarted empty has a new replication
    // id that is no evidence against the primary, and nothing to keep parked.
    const lostOwnData =
      this.#linkedReplId !== undefined &&
      mine.replId !== this.#linkedReplId &&
      mine.prior?.replId !== this.#linkedReplId;
    if (!parked && this.#runId !== undefined && primary.runId !== this.#runId && !continues && !lostOwnData) {
      // The primary came back as another process that does not continue this replica's lineage,
      // and the replica has not synced from it yet (the park on close did not happen: the replica
      // was hung, or the close went unseen): park now, before a full sync replaces its data.
      await this.#lost(this.#address ?? "");
      return "restarted";
    }
    const linked = !parked && mine.primary?.link === "up";
    this.#remembered = rememberPrior(this.#remembered, read, primary, linked);
    // A replica process this agent never pointed (its database restarted with its config file's
    // \`replicaof\`, or an operator's) that has not synced yet, following a process that does not
    // hold its data and took over from it by no recorded promotion (\`syncWouldDestroy\`): park
    // now, before its first full sync replaces the data. Redis connects at once on start, but a
    // master's full sync waits \`repl-diskless-sync-delay\` (5 s by default) before the replica
    // flushes: that is the window (docs/deploy.md). Simulator seed 7032 (796 acknowledged writes
    // lost): n3, the only copy of the shard's last writes, restarted from its RDB as a replica of
    // n1 (its deployment config), n1 a replica on another lineage; the full sync wiped the last copy.
    if (
      !parked &&
      !linked &&
      mine.runId !== undefined &&
      mine.runId !== this.#ctx.pointedRunId &&
      syncWouldDestroy(primary, mine, this.#ctx.lastTopology?.ancestry ?? [])
    ) {
      await this.#lost(this.#address ?? "", undefined, true);
      // Parked for its own data, not for a close: the primary being the process this agent linked
      // to before is no reason to unpark it (its next probe would, as "the same process").
      this.#runId = undefined;
      this.#linkedReplId = undefined;
      this.lacksMyData = true;
      return "restarted";
    }
    if (linked && primary.runId !== undefined) this.#runId = primary.runId;
    if (linked) this.#linkedReplId = mine.replId;
    const sameProcess = this.#runId !== undefined && primary.runId === this.#runId;
    if (parked) {
      // A primary on a lineage the shard's history records as taking over from this replica's
      // (`supersededBy`): what the replica holds past the promotion is the branch a deposed
      // primary took unacknowledged, which its step-down to this primary already gave up. Waiting
      // for a newer epoch would leave it parked for good (simulator seeds 281090, 280962, 281137:
      // a deposed primary parked by a partition before its first sync from its successor).
      const superseded =
        primary.role === "primary" && supersededBy(primary, mine, this.#ctx.lastTopology?.ancestry ?? []);
      // Only toward the primary the topology stands for (\`#namedPrimary\`): a failover past its
      // PROMOTE names its target, and the address this replica was parked from is then a deposed
      // primary; the replica waits parked for its repoint, or for its own PROMOTE when it is the
      // target. Simulator seed 250903: n2, the target awaiting its PROMOTE, followed n1 back,
      // restarted from its RDB under a new replication id; n2 and n3 took that id, which the
      // shard's history does not record, and after n2's PROMOTE no node held the lineage the
      // offline shard waited for.
      const why = sameProcess
        ? "the same process"
        : continues
          ? "a process continuing its lineage"
          : superseded
            ? "a process on the lineage that took over from this replica's by a recorded promotion"
            : lostOwnData
              ? "none: this replica's own database restarted without the lineage it was parked to keep"
              : undefined;
      if (why !== undefined) {
        if (this.#namedPrimary()) await this.#unpark(why, closesBefore);
      } else {
        this.lacksMyData = true;
        return "restarted";
      }
    }
    this.lacksMyData = false;
    // A primary that refuses every write serves nobody: its agent fenced it (cut off from the
    // store, restarted, not confirmed), or it lacks the good replicas its replica-set guard asks
    // for (a member dead while its agent cannot shrink the set). With its heartbeat stale, that is
    // a failed primary.
    return answer.fenced && primary.role === "primary" ? "fenced" : "ok";
  }

  /**
   * The address this replica watches is the primary the last topology read stands for, or that
   * topology names none (no topology yet, an offline shard): only then may a parked replica follow
   * it again by itself.
   */
  #namedPrimary(): boolean {
    const topology = this.#ctx.lastTopology;
    const named = topology === undefined ? undefined : topologyPrimary(topology);
    return named === undefined || named.address === this.#address;
  }

  /**
   * Parks the replica following \`address\`; \`silent\`: after probes without an answer, not a close;
   * \`unsynced\`: a restarted replica process that has not synced from it yet.
   */
  async #lost(address: string, silent?: string, unsynced = false): Promise<void> {
    if (this.#address !== address) return;
    const ctx = this.#ctx;
    await ctx.roleLock.run(async () => {
      try {
        // A replica that does not answer (hung, SIGSTOPped) is parked all the same, from what it
        // last said: the command waits in its socket and runs when it wakes, before the once-a-second
        // reconnect could full-sync it from a primary restarted empty meanwhile.
        const generation = ctx.roleGeneration;
        const mine = await ctx.db
          .replicationInfo()
          .catch(() => (ctx.lastInfoGeneration === generation ? ctx.lastInfo : undefined));
        if (
          mine === undefined ||
          mine.role !== "replica" ||
          !mine.primary ||
          `${mine.primary.host}:${mine.primary.port}` !== address
        )
          return;
        await ctx.db.replicaOf(PARKED_HOST, PARKED_PORT);
        ctx.roleGeneration++;
        this.parkedAtEpoch = ctx.lastTopology?.epoch ?? ctx.highestEpoch;
        this.parkedFrom = address;
        // The controller learns of the link down now, not at the next heartbeat tick.
        ctx.wakeHeartbeat();
        const message = unsynced
          ? "replica restarted following a process without its data: parked before its first sync, until a primary known to hold it"
          : silent === undefined
            ? "primary's connection closed: replica parked until the primary is known to hold its data"
            : "primary silent: replica parked until the primary is known to hold its data";
        ctx.logger.warn(message, {
          ...ctx.epochContext,
          primaryAddress: address,
          ...(silent === undefined ? {} : { why: silent }),
          ...(unsynced ? { replId: mine.replId, offset: mine.offset } : {}),
        });
      } catch (error) {
        ctx.logger.warn("could not park the replica", { ...ctx.epochContext, error: errorMessage(error) });
      }
    });
  }

  /**
   * Points the parked replica at its primary again, on an answer asked while \`closes\` connections
   * had closed. A close since then means the process that answered may be gone and another one, not
   * holding this replica's data, listening in its place: the replica would connect to it, and the
   * park on that close found the replica still parked and did nothing. It then stays parked, and
   * the next probe judges whatever answers now (guarantee 1; a restart empty in the moment between
   * the answer and the \`REPLICAOF\`, seen with real processes and \`repl-diskless-sync-delay 0\`).
   * A close after the \`REPLICAOF\` parks it as any close does (\`#lost\` waits for the role lock).
   */
  async #unpark(why: string, closes: number): Promise<void> {
    const ctx = this.#ctx;
    const address = this.#address;
    if (!address) return;
    await ctx.roleLock.run(async () => {
      const mine = await ctx.db.replicationInfo();
      if (!isParked(mine)) return;
      if (this.#closes !== closes || this.#address !== address) {
        ctx.logger.info(
          "replica stays parked: its primary's connection closed after the answer it would follow",
          {
            ...ctx.epochContext,
            primaryAddress: address,
            why,
          },
        );
        return;
      }
      const { host, port } = parseAddress(address);
      await ctx.db.replicaOf(host, port);
      ctx.roleGeneration++;
      ctx.pointedRunId = mine.runId;
      this.parkedFrom = undefined;
      ctx.logger.info("replica unparked: its primary is back", {
        ...ctx.epochContext,
        primaryAddress: address,
        why,
      });
    });
  }

  close(): void {
    this.#address = undefined;
    this.#client?.disconnect();
    this.#client = undefined;
  }
}

export function isParked(info: ReplicationInfo): boolean {
  return info.role === "replica" && info.primary?.host === PARKED_HOST && info.primary.port === PARKED_PORT;
}
