import type { EpochValue, FaultValue, Op, ProbeValue, WriteValue } from "./history.ts";

/**
 * The nemesis checker: a pure function of the history and the final reads of every node. No I/O,
 * no clock; the same inputs always give the same verdict.
 *
 * Rules (shared/DESIGN.md "Guarantees"):
 * - (a) every write a replica acknowledged (`WAIT` answered >= 1) is on the final primary;
 * - (a) covers the writes of every node that answered `ROLE` as master when the workload wrote, not
 *   only the advertised primary's: a deposed primary's acknowledged writes count too;
 * - (b) no sample outside a fence window saw two nodes accept a write; a window of `fenceWindowMs`
 *   (the promotion window docs/agent.md states, 3000 ms) opens at every observed change of the
 *   epoch or the primary, and nowhere else (no allowance after a heal: a woken node that takes
 *   writes outside that window breaks guarantee 2);
 * - (c) writes the primary alone acknowledged (`WAIT` answered 0) and that are missing are
 *   `asyncOnly` losses: reported, not a violation;
 * - (d) the shard ends with exactly one primary, every live node following it with its link up,
 *   and the topology naming it. No master read while the topology's primary is a live node whose
 *   final read failed is `"unknown"` ("could not be read"), not "0 primaries" (nemesis seed 7336);
 *   (a) is then checked on the union of the keys of the replicas following it ("checked on replicas");
 * - (e) every epoch change has a cause: a fault active at that moment, or healed (or the
 *   nemesis's operator recovery, `recover`) at most
 *   `causeWindowMs` before it;
 * - (g3) guarantee 3: once no fault is active (every injected fault healed, and before the first),
 *   a write is acknowledged within `availabilityLimitMs` (the failure timeout plus the documented
 *   margin) and no two acknowledged writes are further apart than that until the next fault
 *   starts. Each breach is reported with its start, its end and the faults healed just before it.
 * Without a final read the verdict is `"unknown"`, never a pass; verdicts merge false > unknown > true.
 */

export interface FinalNodeRead {
  readonly node: string;
  /** False when the node is down (killed and not restarted) or did not answer. */
  readonly reachable: boolean;
  /**
   * Unreachable: why the read of a live node failed (the last error, after the re-reads). Absent
   * for a node that is down for good: the checker tells "not read" from "down" by it.
   */
  readonly error?: string;
  /** From ROLE / INFO replication. */
  readonly role?: "master" | "slave";
  /** A replica: the node id it follows (mapped from its master host:port). */
  readonly following?: string;
  /** A replica: master_link_status is up. */
  readonly linkUp?: boolean;
  /** Sequence numbers of the workload's keys this node holds. */
  readonly seqs?: readonly number[];
}

export interface FinalRead {
  readonly nodes: readonly FinalNodeRead[];
  /** The topology's primary and status at the end. */
  readonly topologyPrimary?: string;
  readonly topologyStatus?: string;
}

export interface CheckOptions {
  /** How long after an epoch change or a heal two writable nodes are tolerated. */
  readonly fenceWindowMs: number;
  /** How long after a fault was healed an epoch change may still be blamed on it. */
  readonly causeWindowMs: number;
  /** A stretch without an acknowledged write longer than this is reported as unavailability. @default 10000 */
  readonly maxWriteGapMs?: number;
  /**
   * (g3) With no fault active, the longest tolerated stretch without an acknowledged write (the
   * failure timeout plus the documented margin). Unset: guarantee 3 is reported, not checked.
   */
  readonly availabilityLimitMs?: number;
}

/** (g3) A stretch with every fault healed and no acknowledged write for longer than the limit. */
export interface AvailabilityBreach {
  /** When the clock started: the heal of the last active fault, or the last acknowledged write. */
  readonly from: number;
  /** The next acknowledged write, or the end of the quiet stretch (the next fault, the end of the run). */
  readonly to: number;
  readonly ms: number;
  readonly limitMs: number;
  /** The faults healed last before the stretch (`#id kind target nodes`), or why the clock started. */
  readonly cause: string;
}

/** A stretch with no acknowledged write, and the faults active during it (reported, not a violation). */
export interface Unavailability {
  readonly from: number;
  readonly to: number;
  readonly ms: number;
  readonly faults: readonly string[];
}

export type Verdict = true | false | "unknown";

export interface TwoWritableSample {
  readonly t: number;
  readonly nodes: readonly string[];
}

export interface CheckResult {
  readonly valid: Verdict;
  /** (a) Replica-acknowledged writes missing from the final primary (sequence numbers). */
  readonly lost: readonly number[];
  /** Keys on the final primary that the writer never attempted. */
  readonly unexpected: readonly number[];
  /** Writes that completed `fail` or `info` and are on the final primary anyway. */
  readonly recovered: readonly number[];
  /** (c) Writes acknowledged by the primary alone and missing from the final primary. */
  readonly asyncOnly: readonly number[];
  /** (b) Samples outside every fence window in which two or more nodes accepted a write. */
  readonly twoWritable: readonly TwoWritableSample[];
  readonly violations: readonly string[];
  /** Stretches without an acknowledged write longer than `maxWriteGapMs` (reported only). */
  readonly unavailable: readonly Unavailability[];
  /** (g3) Stretches with no fault active and no acknowledged write longer than `availabilityLimitMs`. */
  readonly availability: readonly AvailabilityBreach[];
  readonly stats: {
    readonly attempted: number;
    readonly acked: number;
    readonly ackedByReplica: number;
    readonly ackedAsyncOnly: number;
    readonly failed: number;
    readonly indeterminate: number;
    readonly samples: number;
    /** Samples with two writable nodes inside a fence window (tolerated). */
    readonly twoWritableInWindow: number;
    readonly epochChanges: number;
    readonly finalPrimary: string | undefined;
  };
}

export const DEFAULT_CHECK_OPTIONS: CheckOptions = { fenceWindowMs: 3000, causeWindowMs: 15_000 };

export function mergeVerdicts(...verdicts: Verdict[]): Verdict {
  if (verdicts.includes(false)) return false;
  if (verdicts.includes("unknown")) return "unknown";
  return true;
}

const fmt = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

const describeRole = (node: FinalNodeRead) =>
  `${node.node} (${node.role ?? "?"} of ${node.following ?? "none"}, link ${node.linkUp ? "up" : "down"})`;

function summarize(seqs: readonly number[], limit = 10): string {
  const shown = seqs.slice(0, limit).join(", ");
  return seqs.length > limit ? `${shown}, … (${seqs.length} in all)` : shown;
}

export function check(
  history: readonly Op[],
  final: FinalRead | undefined,
  options: CheckOptions = DEFAULT_CHECK_OPTIONS,
): CheckResult {
  const violations: string[] = [];
  const verdicts: Verdict[] = [];

  // Writes: the last completion of each seq wins (there is exactly one per invoke).
  const attempted = new Set<number>();
  const completion = new Map<number, { type: Op["type"]; replicas: number | undefined; node?: string }>();
  for (const op of history) {
    if (op.process !== "writer" || op.f !== "write") continue;
    const value = op.value as WriteValue | undefined;
    if (value === undefined || typeof value.seq !== "number") continue;
    if (op.type === "invoke") attempted.add(value.seq);
    else completion.set(value.seq, { type: op.type, replicas: value.replicas, node: op.node });
  }
  let ackedByReplica = 0;
  let ackedAsyncOnly = 0;
  let failed = 0;
  let indeterminate = 0;
  for (const done of completion.values()) {
    if (done.type === "ok" && (done.replicas ?? 0) >= 1) ackedByReplica++;
    else if (done.type === "ok") ackedAsyncOnly++;
    else if (done.type === "fail") failed++;
    else indeterminate++;
  }

  // (b) two writable nodes outside every fence window: windows open where the epoch or the
  // primary changed (a promotion), and nowhere else.
  const windowOpeners: number[] = [];
  const epochChanges: Array<{ t: number; value: EpochValue }> = [];
  for (const op of history) {
    if (op.process === "observer" && op.f === "epoch") {
      const value = op.value as EpochValue;
      const moved =
        value.previousEpoch !== undefined &&
        (value.previousEpoch !== value.epoch || value.previousPrimary !== value.primary);
      if (moved) windowOpeners.push(op.t);
      if (value.previousEpoch !== undefined && value.previousEpoch !== value.epoch)
        epochChanges.push({ t: op.t, value });
    }
  }
  const inWindow = (t: number) => windowOpeners.some((at) => at <= t && t < at + options.fenceWindowMs);
  const twoWritable: TwoWritableSample[] = [];
  let samples = 0;
  let twoWritableInWindow = 0;
  for (const op of history) {
    if (op.process !== "sampler" || op.f !== "probe" || op.type !== "ok") continue;
    samples++;
    const value = op.value as ProbeValue;
    if (value.writable.length < 2) continue;
    if (inWindow(op.t)) twoWritableInWindow++;
    else twoWritable.push({ t: op.t, nodes: [...value.writable].sort() });
  }
  if (twoWritable.length > 0) {
    const first = twoWritable[0] as TwoWritableSample;
    const last = twoWritable[twoWritable.length - 1] as TwoWritableSample;
    violations.push(
      `(b) two writable nodes: ${twoWritable.length} samples outside the ${options.fenceWindowMs} ms fence window, ` +
        `first at t=${fmt(first.t)} (${first.nodes.join(", ")}), last at t=${fmt(last.t)} (${last.nodes.join(", ")})`,
    );
    verdicts.push(false);
  }

  // (e) every epoch change has a cause.
  const faults = new Map<
    number,
    { kind: string; target: string; from: number; to: number; nodes: readonly string[] }
  >();
  for (const op of history) {
    if (op.process !== "nemesis") continue;
    const value = op.value as FaultValue;
    if (op.f === "inject") {
      if (op.type === "fail") continue; // skipped: never injected
      faults.set(value.id, {
        kind: value.kind,
        target: value.target,
        from: op.t,
        to: Number.POSITIVE_INFINITY,
        nodes: value.nodes,
      });
    } else if (op.f === "recover") {
      // The nemesis acting as the operator (`shardguard recover`): the epoch changes it causes.
      faults.set(-faults.size - 1, {
        kind: "operator-recover",
        target: "shard",
        from: op.t,
        to: op.t,
        nodes: [],
      });
    } else if (op.f === "heal") {
      const fault = faults.get(value.id);
      if (fault) fault.to = op.t;
      else
        faults.set(value.id, {
          kind: value.kind,
          target: value.target,
          from: op.t,
          to: op.t,
          nodes: value.nodes,
        });
    }
  }
  const faultLabels = new Map(
    [...faults.entries()]
      .filter(([id]) => id !== 0)
      .map(
        ([id, fault]) => [`#${id} ${fault.kind} ${fault.target} ${fault.nodes.join(",")}`, fault] as const,
      ),
  );
  // A cool-down in force when a fault healed defers the change it causes to the cool-down's end
  // (docs/controller.md rule 3): the window counts from the later of the two (simulator seed 44331).
  const cooldownEnds = history
    .filter((op) => op.process === "observer" && op.f === "epoch")
    .flatMap((op) => {
      const forMs = (op.value as EpochValue).cooldownForMs;
      return forMs === undefined ? [] : [{ t: op.t, end: op.t + forMs }];
    });
  const causeEnd = (fault: { to: number }) =>
    Math.max(
      fault.to,
      ...cooldownEnds.filter((cooldown) => cooldown.t <= fault.to).map((cooldown) => cooldown.end),
    );
  for (const change of epochChanges) {
    const cause = [...faults.values()].find(
      (fault) => fault.from <= change.t && change.t <= causeEnd(fault) + options.causeWindowMs,
    );
    if (!cause) {
      violations.push(
        `(e) epoch ${change.value.previousEpoch} -> ${change.value.epoch} at t=${fmt(change.t)} ` +
          `(primary ${change.value.previousPrimary ?? "none"} -> ${change.value.primary ?? "none"}) ` +
          `with no fault active or healed within ${fmt(options.causeWindowMs)} before it`,
      );
      verdicts.push(false);
    }
  }

  // Unavailability: gaps between acknowledged writes, with the faults active in them.
  const unavailable: Unavailability[] = [];
  const maxGap = options.maxWriteGapMs ?? 10_000;
  const ackTimes = history
    .filter((op) => op.process === "writer" && op.f === "write" && op.type === "ok")
    .map((op) => op.t);
  const lastT = history.length > 0 ? (history[history.length - 1] as Op).t : 0;
  const firstT = history.find((op) => op.process === "writer")?.t;
  if (firstT !== undefined) {
    const edges = [firstT, ...ackTimes, lastT];
    for (let index = 1; index < edges.length; index++) {
      const from = edges[index - 1] as number;
      const to = edges[index] as number;
      if (to - from <= maxGap) continue;
      const active = [...faultLabels.entries()]
        .filter(([, fault]) => fault.from <= to && fault.to >= from)
        .map(([label]) => label);
      unavailable.push({ from, to, ms: Math.round(to - from), faults: active });
    }
  }

  // (g3) Quiet stretches (no fault active) and the acknowledged writes in them.
  const availability =
    options.availabilityLimitMs === undefined || firstT === undefined
      ? []
      : availabilityBreaches(
          history,
          // The advertised primary's writes only: a deposed primary that still takes writes is not a
          // shard that is available.
          history
            .filter(
              (op) =>
                op.process === "writer" &&
                op.f === "write" &&
                op.type === "ok" &&
                (op.value as WriteValue | undefined)?.stray !== true,
            )
            .map((op) => op.t),
          firstT,
          lastT,
          options.availabilityLimitMs,
          cooldownEnds,
        );
  if (availability.length > 0) {
    const worst = availability.reduce((a, b) => (b.ms > a.ms ? b : a));
    violations.push(
      `(g3) no writable primary for longer than ${fmt(options.availabilityLimitMs ?? 0)} with every fault healed: ` +
        `${availability.length} times, the longest from t=${fmt(worst.from)} to t=${fmt(worst.to)} (${fmt(worst.ms)}) after ${worst.cause}`,
    );
    verdicts.push(false);
  }

  const statsWith = (finalPrimary: string | undefined): CheckResult["stats"] => ({
    attempted: attempted.size,
    acked: ackedByReplica + ackedAsyncOnly,
    ackedByReplica,
    ackedAsyncOnly,
    failed,
    indeterminate,
    samples,
    twoWritableInWindow,
    epochChanges: epochChanges.length,
    finalPrimary,
  });

  // Without final reads, nothing about the data can be said.
  if (final === undefined) {
    return {
      valid: mergeVerdicts(...verdicts, "unknown"),
      lost: [],
      unexpected: [],
      recovered: [],
      asyncOnly: [],
      twoWritable,
      violations: [...violations, "no final read: the data rules (a, c, d) were not checked"],
      unavailable,
      availability,
      stats: statsWith(undefined),
    };
  }

  // (d) one primary, every live node following it.
  const live = final.nodes.filter((node) => node.reachable);
  const masters = live.filter((node) => node.role === "master");
  let finalPrimary: string | undefined;
  // No master read, and the topology names a live node whose read failed: the primary was not read,
  // which is not "no primary" (nemesis seed 7336: the settled primary stalled under load at the final read).
  const unreadPrimary =
    masters.length === 0
      ? final.nodes.find(
          (node) => node.node === final.topologyPrimary && !node.reachable && node.error !== undefined,
        )
      : undefined;
  if (unreadPrimary) {
    violations.push(
      `(d) the topology's primary ${unreadPrimary.node} could not be read at the end (${unreadPrimary.error})`,
    );
    verdicts.push("unknown");
    const strays = live.filter((node) => node.following !== unreadPrimary.node);
    if (strays.length > 0) {
      violations.push(
        `(d) live nodes not following the topology's primary ${unreadPrimary.node}: ${strays.map(describeRole).join(", ")}`,
      );
      verdicts.push(false);
    }
  } else if (masters.length !== 1) {
    violations.push(
      `(d) the shard ends with ${masters.length} primaries${masters.length > 0 ? ` (${masters.map((m) => m.node).join(", ")})` : ""}, not one`,
    );
    verdicts.push(false);
    if (final.topologyPrimary && masters.some((m) => m.node === final.topologyPrimary)) {
      finalPrimary = final.topologyPrimary;
    }
  } else {
    finalPrimary = (masters[0] as FinalNodeRead).node;
    const strays = live.filter(
      (node) => node.node !== finalPrimary && (node.following !== finalPrimary || node.linkUp !== true),
    );
    if (strays.length > 0) {
      violations.push(
        `(d) live nodes not following the primary ${finalPrimary}: ${strays.map(describeRole).join(", ")}`,
      );
      verdicts.push(false);
    }
    if (final.topologyPrimary !== undefined && final.topologyPrimary !== finalPrimary) {
      violations.push(`(d) the topology names ${final.topologyPrimary} but ${finalPrimary} is the primary`);
      verdicts.push(false);
    }
  }

  /** The report, with the data rules' findings (empty when they could not be checked). */
  const result = (
    data: Pick<CheckResult, "lost" | "unexpected" | "recovered" | "asyncOnly">,
  ): CheckResult => ({
    valid: mergeVerdicts(...verdicts),
    ...data,
    twoWritable,
    violations,
    unavailable,
    availability,
    stats: statsWith(finalPrimary),
  });

  const primarySeqs = final.nodes.find((node) => node.node === finalPrimary)?.seqs;
  // The topology's primary not read: the keys of the replicas following it, together, stand in for
  // its own (a write none of them holds is reported lost; one they hold was on the primary).
  const followers = unreadPrimary
    ? live.filter((node) => node.following === unreadPrimary.node && node.seqs !== undefined)
    : [];
  let present: Set<number>;
  let where: string;
  if (finalPrimary !== undefined && primarySeqs !== undefined) {
    present = new Set(primarySeqs);
    where = `the final primary ${finalPrimary}`;
  } else if (unreadPrimary && followers.length > 0) {
    present = new Set(followers.flatMap((node) => node.seqs ?? []));
    const names = followers.map((node) => node.node).join(", ");
    where = `the replicas following ${unreadPrimary.node} (${names})`;
    violations.push(
      `(a) checked on replicas: ${unreadPrimary.node} not read, the data rules (a, c) were checked on the union of the keys of ${names}`,
    );
  } else {
    violations.push("no final primary could be read: the data rules (a, c) were not checked");
    verdicts.push("unknown");
    return result({ lost: [], unexpected: [], recovered: [], asyncOnly: [] });
  }

  // (a), (c) and the set checker's unexpected / recovered.
  const lost: number[] = [];
  const asyncOnly: number[] = [];
  const recovered: number[] = [];
  const failedButPresent: number[] = [];
  for (const [seq, done] of [...completion.entries()].sort((x, y) => x[0] - y[0])) {
    const here = present.has(seq);
    if (done.type === "ok") {
      if (here) continue;
      if ((done.replicas ?? 0) >= 1) lost.push(seq);
      else asyncOnly.push(seq);
    } else if (here) {
      recovered.push(seq);
      if (done.type === "fail") failedButPresent.push(seq);
    }
  }
  const unexpected = [...present].filter((seq) => !attempted.has(seq)).sort((x, y) => x - y);
  if (lost.length > 0) {
    violations.push(
      `(a) ${lost.length} replica-acknowledged writes missing from ${where}: seq ${summarize(lost)}`,
    );
    verdicts.push(false);
  }
  if (unexpected.length > 0) {
    violations.push(`${unexpected.length} keys on ${where} were never written: seq ${summarize(unexpected)}`);
    verdicts.push(false);
  }
  if (failedButPresent.length > 0) {
    violations.push(
      `${failedButPresent.length} writes that were refused are on ${where}: seq ${summarize(failedButPresent)}`,
    );
    verdicts.push(false);
  }
  return result({ lost, unexpected, recovered, asyncOnly });
}

/**
 * (g3) The quiet stretches of a run: from the first write (or the heal that left no fault active)
 * to the next inject (or the end of the history). In each, the gaps between acknowledged writes,
 * counted from the stretch's start, may not exceed `limitMs`. A cool-down in force at the heal
 * defers the replacement the heal calls for to the cool-down's end (docs/controller.md rule 3, as
 * rule (e) counts it): the clock starts at the later of the two (simulator seeds 150119, 150261).
 */
function availabilityBreaches(
  history: readonly Op[],
  ackTimes: readonly number[],
  firstT: number,
  lastT: number,
  limitMs: number,
  cooldownEnds: ReadonlyArray<{ t: number; end: number }>,
): AvailabilityBreach[] {
  const active = new Set<number>();
  const stretches: Array<{ from: number; to: number; cause: string }> = [];
  let quietFrom: number | undefined = firstT;
  let cause = "the start of the run";
  const labelOf = (value: FaultValue) =>
    `#${value.id} ${value.kind} ${value.target} ${value.nodes.join(",")}`.trim();
  let healedLast: string[] = [];
  for (const op of history) {
    if (op.process !== "nemesis" || op.t < firstT) continue;
    const value = op.value as FaultValue | undefined;
    if (op.f === "inject" && op.type !== "fail" && value !== undefined) {
      if (active.size === 0 && quietFrom !== undefined) stretches.push({ from: quietFrom, to: op.t, cause });
      active.add(value.id);
      quietFrom = undefined;
      healedLast = [];
    } else if (op.f === "heal" && value !== undefined) {
      const wasActive = active.delete(value.id);
      if (wasActive || value.id === 0) healedLast.push(labelOf(value));
      if (active.size === 0 && (wasActive || quietFrom === undefined)) {
        if (quietFrom !== undefined && wasActive) stretches.push({ from: quietFrom, to: op.t, cause });
        quietFrom = op.t;
        cause = `${healedLast.join("; ")} healed`;
      }
    }
  }
  if (active.size === 0 && quietFrom !== undefined) stretches.push({ from: quietFrom, to: lastT, cause });
  const breaches: AvailabilityBreach[] = [];
  for (const stretch of stretches) {
    const cooldownEnd = Math.max(
      stretch.from,
      ...cooldownEnds.filter((cooldown) => cooldown.t <= stretch.from).map((cooldown) => cooldown.end),
    );
    let from = Math.min(cooldownEnd, stretch.to);
    let why =
      cooldownEnd > stretch.from
        ? `${stretch.cause} (clock from the end of the cool-down in force, t=${fmt(cooldownEnd)})`
        : stretch.cause;
    const inside = ackTimes.filter((t) => t > stretch.from && t <= stretch.to);
    for (const to of [...inside, stretch.to]) {
      // An acknowledgement before the clock starts (the cool-down's end) does not move it back: the
      // failover a failure within the cool-down needs waits for its end all the same (simulator seed
      // 281619: a write the primary took just before it restarted empty, recorded when its WAIT gave
      // up 1 s later, restarted the clock 28 s before the cool-down ended).
      if (to <= from) continue;
      if (to - from > limitMs) {
        breaches.push({ from, to, ms: Math.round(to - from), limitMs, cause: why });
      }
      from = to;
      why = "a writable primary with no fault active";
    }
  }
  return breaches;
}
