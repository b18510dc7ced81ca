/**
 * What the packed package exports (`import { ShardguardController } from "shardguard/cdk"`): the
 * construct, the deployable stack and their props. Bundled by cdk/build-package.ts with aws-cdk-lib,
 * constructs and cdk-nag left to the consumer's app.
 */

export { EVENT_SOURCE, EVENT_TYPES, type EventType } from "../src/core/observability.ts";
export { AGENT_TIMING_FIELDS, agentTimingEnvironment } from "./agent-environment.ts";
export type { AgentIdentity } from "./agent-policy.ts";
export { ControllerAlarms, type ControllerAlarmsProps, controllerMetric } from "./controller-alarms.ts";
export { ControllerDashboard, type ControllerDashboardProps } from "./controller-dashboard.ts";
export type { ShardguardControllerProps } from "./controller-props.ts";
export {
  CONTROLLER_QUEUE_ACTIONS,
  CONTROLLER_RECORD_CHANGE_ACTIONS,
  CONTROLLER_RECORD_READ_ACTIONS,
  CONTROLLER_TABLE_ACTIONS,
  OPERATOR_TABLE_ACTIONS,
  ShardguardController,
} from "./shardguard-controller.ts";
export type { ShardguardNodeOptions } from "./shardguard-node.ts";
export { ShardguardNode } from "./shardguard-node.ts";
export {
  operatorProfile,
  parseNodeList,
  ShardguardStack,
  type ShardguardStackProps,
} from "./shardguard-stack.ts";
