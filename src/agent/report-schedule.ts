import { reportSignature } from "../core/agent-cycle.ts";
import type { HeartbeatInput } from "../core/model.ts";

/**
 * When the agent reports: what it last wrote and when, whether the next cycle must read and write
 * whatever changed, the stretch of doubt that speeds its cadence up, and what it last woke the
 * controller for. Owned by the heartbeat loop; a REPORT command asks for reports (`askUntil`), a
 * wake-up or a failed store call for the next cycle's (`request`).
 */
export class ReportSchedule {
  /**
   * The next cycle reads the topology and writes the heartbeat whatever changed: at start, after a
   * failed store call, when woken or asked by a command.
   */
  storeRequested = true;
  /** The last heartbeat written. */
  lastHeartbeat: HeartbeatInput | undefined;
  /**
   * The last heartbeat built from a database answer, written or not (a store cut off, a quiet
   * cycle): the template for \`db_status: down\` heartbeats, so that they carry the dead process's
   * last offset, not the one of the last write (nemesis 5301: a replica cut off from the store
   * acknowledged writes, died, and its down report showed the offset of before the cut).
   */
  lastAnswered: HeartbeatInput | undefined;
  /** What the last heartbeat written said, volatile fields left out (`reportSignature`). */
  writtenSignature: string | undefined;
  /** Monotonic ms of the last heartbeat write that succeeded (start time before the first). */
  lastWrittenAt: number;
  /** Heartbeats written by this process: published on the probe connection as a witness. */
  heartbeatsWritten = 0;
  /** Monotonic ms until which the controller asked this agent to report every cycle (REPORT). */
  reportUntil = Number.NEGATIVE_INFINITY;
  /** Monotonic ms since which the database or the link to the primary is in doubt (fast heartbeats). */
  doubtSince: number | undefined;
  /** What the controller was last woken for (`crash:<first_seen>`, `link_down:<since>`): once each. */
  wokeFor: string | undefined;
  /**
   * A replica's last topology read showed something to watch (the shard not online, another
   * primary named, the primary's heartbeat stale): it reports every cycle until it reads otherwise.
   */
  topologyDoubt = false;
  /** The shard is registered in the shard index (after the first heartbeat written). */
  registered = false;

  constructor(startedAt: number) {
    this.lastWrittenAt = startedAt;
  }

  /** The next cycle reads and writes whatever changed. */
  request(): void {
    this.storeRequested = true;
  }

  /** A REPORT command: report every cycle until `until` (monotonic ms). */
  askUntil(until: number): void {
    this.reportUntil = Math.max(this.reportUntil, until);
  }

  /** `heartbeat` was written at monotonic `at`. */
  written(heartbeat: HeartbeatInput, at: number): void {
    this.lastHeartbeat = heartbeat;
    this.writtenSignature = reportSignature(heartbeat);
    this.heartbeatsWritten++;
    this.lastWrittenAt = at;
  }

  /** The last write as the cycle's plan reads it (undefined before the first). */
  get lastWritten(): { keepaliveMs: number; signature: string; at: number } | undefined {
    if (this.lastHeartbeat === undefined || this.writtenSignature === undefined) return undefined;
    return {
      keepaliveMs: this.lastHeartbeat.keepalive_ms ?? 0,
      signature: this.writtenSignature,
      at: this.lastWrittenAt,
    };
  }
}
