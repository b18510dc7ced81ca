// TEMPORARY shim while cdk/ is being split; removed before commit.
export {
  type EventType as EventDetailType,
  METRIC_NAMES,
  METRICS_NAMESPACE,
  type MetricName,
} from "../core/observability.ts";
