import { type AwsAdapters, createAwsAdapters } from "../../src/adapters/aws-adapters.ts";
import { silentLogger } from "../../src/adapters/observability.ts";
import { type ControllerDeps, runShardCycle } from "../../src/controller/orchestrator.ts";
import type { FailoverConfig } from "../../src/core/config.ts";
import type { Command, Topology } from "../../src/core/model.ts";
import type { CommandBus, CoordinationStore } from "../../src/core/ports.ts";
import { MemoryEventPublisher, MemoryMetrics } from "./controller-fakes.ts";
import { waitFor } from "./wait.ts";

/**
 * An in-process controller whose store and command bus pass every call through a gate: the test
 * names one call (e.g. "the topology write that records phase promote") and the controller stops
 * right before making it, for as long as the test wants, as a GC pause, a throttled Lambda or a
 * preempted host would stop it. Everything the controller sends is recorded.
 */

/** One call of the controller to the outside world, as the gate sees it. */
export interface GateCall {
  /** `<port>.<method>`, e.g. `topology.compareAndSet`, `history.append`, `bus.send`. */
  readonly op: string;
  readonly args: readonly unknown[];
}

export interface FreezePoint {
  /** Where in the failover the controller stops, for the test's name. */
  readonly name: string;
  readonly matches: (call: GateCall) => boolean;
}

/**
 * The controller's first snapshot read after it recorded phase \`confirm\`: PROMOTE sent, the target
 * not confirmed yet (a controller frozen there leaves its lease running, as the simulator's
 * \`controller-overlap\` does).
 */
export function afterConfirmRecorded(): FreezePoint {
  let confirmRecorded = false;
  return {
    name: "confirm recorded -> its first snapshot read",
    matches: (call: GateCall) => {
      if (
        call.op === "topology.compareAndSet" &&
        (call.args[2] as Topology | undefined)?.phase === "confirm"
      ) {
        confirmRecorded = true;
        return false;
      }
      return confirmRecorded && call.op === "heartbeats.snapshot";
    },
  };
}

/** Holds the controller at the first call matching its point until `release()`. */
export class Gate {
  readonly point: FreezePoint;
  /** The call it stopped at. */
  frozenAt: GateCall | undefined;
  readonly reached: Promise<GateCall>;
  #onReached!: (call: GateCall) => void;
  #release!: () => void;
  readonly #released: Promise<void>;

  constructor(point: FreezePoint) {
    this.point = point;
    this.reached = new Promise((resolve) => {
      this.#onReached = resolve;
    });
    this.#released = new Promise((resolve) => {
      this.#release = resolve;
    });
  }

  async pass(call: GateCall): Promise<void> {
    if (this.frozenAt !== undefined || !this.point.matches(call)) return;
    this.frozenAt = call;
    this.#onReached(call);
    await this.#released;
  }

  release(): void {
    this.#release();
  }
}

function gatedPort<T extends object>(port: T, name: string, gate: Gate | undefined): T {
  return new Proxy(port, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (typeof value !== "function") return value;
      return async (...args: unknown[]) => {
        await gate?.pass({ op: `${name}.${String(property)}`, args });
        return value.apply(target, args);
      };
    },
  });
}

export function gatedStore(store: CoordinationStore, gate: Gate | undefined): CoordinationStore {
  return {
    heartbeats: gatedPort(store.heartbeats, "heartbeats", gate),
    replicaSets: gatedPort(store.replicaSets, "replicaSets", gate),
    locks: gatedPort(store.locks, "locks", gate),
    topology: gatedPort(store.topology, "topology", gate),
    history: gatedPort(store.history, "history", gate),
    shards: gatedPort(store.shards, "shards", gate),
  };
}

/** A bus whose sends pass the gate first and are recorded once made. */
export function recordingBus(bus: CommandBus, gate: Gate | undefined, sent: Command[]): CommandBus {
  return gatedPort(
    {
      ensureQueue: (shard: string, node: string) => bus.ensureQueue(shard, node),
      send: async (shard: string, node: string, command: Command) => {
        await bus.send(shard, node, command);
        sent.push(command);
      },
      receive: (...args: Parameters<CommandBus["receive"]>) => bus.receive(...args),
      delete: (...args: Parameters<CommandBus["delete"]>) => bus.delete(...args),
      redeliverAfter: (...args: Parameters<CommandBus["redeliverAfter"]>) => bus.redeliverAfter(...args),
    },
    "bus",
    gate,
  );
}

export interface TestController {
  readonly deps: ControllerDeps;
  readonly sent: Command[];
  readonly aws: AwsAdapters;
  readonly gate: Gate | undefined;
}

/** A controller on the cluster's endpoints, optionally behind a gate; `aws.destroy()` when done. */
export function testController(
  env: NodeJS.ProcessEnv,
  config: FailoverConfig,
  gate?: Gate,
  overrides: Partial<ControllerDeps> = {},
): TestController {
  const aws = createAwsAdapters({ env, maxAttempts: 2, logger: silentLogger });
  const sent: Command[] = [];
  const deps: ControllerDeps = {
    store: gatedStore(aws.store, gate),
    bus: recordingBus(aws.bus, gate, sent),
    events: new MemoryEventPublisher(),
    clock: aws.clock,
    config,
    log: silentLogger,
    metrics: new MemoryMetrics(),
    ...overrides,
  };
  return { deps, sent, aws, gate };
}

/**
 * Runs the gated controller's cycles until one reaches the gate's freeze point (a cycle that ends
 * first, e.g. with nothing to do yet, is run again); returns that frozen cycle's run, which ends
 * once the gate is released.
 */
export async function cycleUntilFrozen(
  controller: TestController,
  shard: string,
  what: string,
  timeoutMs: number,
): Promise<{ run: Promise<unknown> | undefined }> {
  const gate = controller.gate;
  if (gate === undefined) throw new Error("cycleUntilFrozen: the controller has no gate");
  const frozen: { run: Promise<unknown> | undefined } = { run: undefined };
  await waitFor(
    async () => {
      if (gate.frozenAt) return true;
      const cycle = runShardCycle(controller.deps, shard);
      frozen.run = cycle;
      const reached = await Promise.race([cycle.then(() => false), gate.reached.then(() => true)]);
      if (!reached) frozen.run = undefined;
      return reached;
    },
    what,
    timeoutMs,
    100,
  );
  return frozen;
}
