import { setTimeout as sleep } from "node:timers/promises";
import type { ControllerDeps } from "../../controller/deps.ts";
import { REPORT_WAIT_TIMEOUTS, reportWindowMs, requestReports } from "../../controller/reports.ts";
import { comparableLag, reportState } from "../../core/node-age.ts";
import type { ShardSnapshot } from "../../core/ports.ts";

/**
 * The nodes asked to report and when, per shard: `--fresh` sends a REPORT (the agent writes at once
 * and every cycle for the report window) to every node but the topology's primary, which writes at
 * its own short keepalive, and asks again when half the window has passed while watching.
 */
export class ReportRequests {
  readonly #deps: ControllerDeps;
  readonly #asked = new Map<string, Record<string, number>>();

  constructor(deps: ControllerDeps) {
    this.#deps = deps;
  }

  askedAt(shard: string): Readonly<Record<string, number>> {
    return this.#asked.get(shard) ?? {};
  }

  /** Sends REPORT to the nodes not asked within half the window; returns whether it sent any. */
  async ask(snapshot: ShardSnapshot): Promise<boolean> {
    const now = this.#deps.clock.now();
    const window = reportWindowMs(this.#deps);
    const asked = { ...this.askedAt(snapshot.shard) };
    const due = snapshot.nodes
      .map((node) => node.node_id)
      .filter((id) => id !== snapshot.topology?.primary_node_id)
      .filter((id) => asked[id] === undefined || now - (asked[id] ?? 0) > window / 2);
    if (due.length === 0) return false;
    // Recorded before the send, so that a second caller meanwhile (a live frame) does not ask again.
    for (const id of due) asked[id] = now;
    this.#asked.set(snapshot.shard, asked);
    await requestReports(this.#deps, snapshot.shard, snapshot.topology?.epoch ?? 0, due, window);
    return true;
  }

  /**
   * Every asked node whose agent still reports has written since it was asked, with an offset read
   * no earlier than the primary's (so its lag can be told), or the primary is not answering.
   */
  answered(snapshot: ShardSnapshot): boolean {
    const now = this.#deps.clock.now();
    const config = this.#deps.config;
    const asked = this.askedAt(snapshot.shard);
    const primary = snapshot.nodes.find((node) => node.node_id === snapshot.topology?.primary_node_id);
    return snapshot.nodes.every((node) => {
      const at = asked[node.node_id];
      if (at === undefined || reportState(node, config, now) === "stale") return true;
      if ((node.agent_updated ?? node.last_updated) < at * 1000) return false;
      const lag = comparableLag(primary, node, config, now);
      return lag.known || lag.code !== "read_before_primary";
    });
  }

  /** Asks, then re-reads until every asked node answered or REPORT_WAIT_TIMEOUTS failure timeouts passed. */
  async fresh(shard: string, snapshot: ShardSnapshot): Promise<ShardSnapshot> {
    await this.ask(snapshot);
    if (this.answered(snapshot)) return snapshot;
    const deadline = this.#deps.clock.now() + REPORT_WAIT_TIMEOUTS * this.#deps.config.failureTimeoutMs;
    let current = snapshot;
    while (this.#deps.clock.now() < deadline) {
      await sleep(Math.max(50, this.#deps.config.heartbeatIntervalMs / 4));
      current = await this.#deps.store.heartbeats.snapshot(shard);
      if (this.answered(current)) break;
    }
    return current;
  }
}
