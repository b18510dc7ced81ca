import type { BenchConfig } from "../lib/report.ts";
import { SentinelSystem } from "./sentinel.ts";
import { ShardguardSystem } from "./shardguard.ts";
import type { FailoverSystem } from "./types.ts";

export type SystemFactory = (config: BenchConfig) => FailoverSystem;

/** Systems `--systems` can name; a new system is one line here. Runs follow this order. */
export const SYSTEMS: Readonly<Record<string, SystemFactory>> = {
  sentinel: (config) => new SentinelSystem(config.sentinel),
  shardguard: (config) => new ShardguardSystem(config.shardguard),
};
