import { FAILING_OVER_GATES } from "./failing-over.ts";
import { ENTRY_GATES, type Gate } from "./gate.ts";
import { OFFLINE_GATES } from "./offline.ts";
import { ONLINE_GATES } from "./online.ts";
import { RECOVER_GATES } from "./recover.ts";
import { RETARGET_GATES } from "./retarget.ts";
import { UNINITIALIZED_GATES } from "./uninitialized.ts";

/**
 * Every gate list of the decision, in the order `decide` walks them: the entry gates first, then
 * the list of the shard's status. docs/safety.md has one row per gate; a unit test keeps them equal.
 */
export const GATE_LISTS = {
  ENTRY_GATES,
  UNINITIALIZED_GATES,
  FAILING_OVER_GATES,
  ONLINE_GATES,
  OFFLINE_GATES,
  RECOVER_GATES,
  RETARGET_GATES,
} as const satisfies Readonly<Record<string, readonly Gate<never>[]>>;

export {
  ENTRY_GATES,
  FAILING_OVER_GATES,
  OFFLINE_GATES,
  ONLINE_GATES,
  RECOVER_GATES,
  RETARGET_GATES,
  UNINITIALIZED_GATES,
};
