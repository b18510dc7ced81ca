import * as events from "aws-cdk-lib/aws-events";
import type { Construct } from "constructs";

/**
 * Controller partitions in the CDK: one controller function, invoked every minute once per
 * partition with the input `{ partition: { index, count } }` (src/core/partition.ts), so each
 * invocation watches its consistent-hash slice of the shards. An EventBridge rule takes at most
 * five targets, so partitions 0-4 go on the construct's schedule and every further five on a
 * rule of their own with the same rate.
 */

/** Targets per EventBridge rule. */
export const TARGETS_PER_RULE = 5;

/** The scheduled input of partition `index` of `count` (none when the fleet is not partitioned). */
export function partitionInput(index: number, count: number): events.RuleTargetInput | undefined {
  return count === 1 ? undefined : events.RuleTargetInput.fromObject({ partition: { index, count } });
}

/** Problems with a partition count for a function with this reserved concurrency. */
export function partitionProblems(partitions: number, reservedConcurrency: number): string[] {
  if (!Number.isInteger(partitions) || partitions < 1 || partitions > 100) {
    return [`partitions: must be an integer from 1 to 100, got ${partitions}`];
  }
  // Consecutive invocations of one partition overlap, and the wake-up queue's event source mapping runs up to two.
  const needed = 2 * partitions + 2;
  if (partitions > 1 && reservedConcurrency < needed) {
    return [
      `controllerReservedConcurrency: ${partitions} partitions overlap up to ${2 * partitions} scheduled invocations plus 2 for wake-ups; give at least ${needed}, got ${reservedConcurrency}`,
    ];
  }
  return [];
}

/**
 * Puts partitions 0-4 on `first` and the rest on further rules of the same schedule, each target
 * made by `target(input)`. Returns the rules (the first included).
 */
export function schedulePartitions(
  scope: Construct,
  first: events.Rule,
  schedule: events.Schedule,
  partitions: number,
  target: (input: events.RuleTargetInput | undefined) => events.IRuleTarget,
): events.Rule[] {
  const rules = [first];
  for (let index = 0; index < partitions; index++) {
    let rule = rules[Math.floor(index / TARGETS_PER_RULE)];
    if (!rule) {
      rule = new events.Rule(scope, `Schedule${rules.length + 1}`, {
        description: `Starts the Shardguard controller for partitions ${index} to ${Math.min(partitions, index + TARGETS_PER_RULE) - 1} of ${partitions}.`,
        schedule,
      });
      rules.push(rule);
    }
    rule.addTarget(target(partitionInput(index, partitions)));
  }
  return rules;
}
