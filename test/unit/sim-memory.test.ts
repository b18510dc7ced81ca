import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { SimWorld } from "../../src/dev/sim/world.ts";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

/**
 * A batch runs seed after seed in one process: nothing of a run may outlive it. Issue 32: the
 * agents' suspended heartbeat sleeps (an `AbortSignal.any` with an abort listener, which Node keeps
 * in a process-wide set until the listener goes) held every finished world, 2.5 MB a one-minute seed.
 */
describe("the simulator's memory", () => {
  it("lets go of a run's world, its agents and their suspended code once the run is over", async () => {
    // Prepare: agents killed and restarted (a killed agent's code stays suspended too).
    const seed = 424242;
    const world = new WeakRef(
      await (async () => {
        const running = new SimWorld(seed);
        const result = await running.run({ seed, minutes: 1, settleSeconds: 20, faultKinds: ["kill-agent"] });
        expect(
          result.trace.filter((line) => line.includes("inject") && line.includes("kill-agent")).length,
        ).toBeGreaterThan(0);
        return running;
      })(),
    );

    // Act
    for (let attempt = 0; attempt < 5 && world.deref() !== undefined; attempt++) {
      await new Promise((resolve) => setImmediate(resolve));
      gc();
    }

    // Assess (not the world itself: a failure would print all of it)
    expect(world.deref() === undefined).toBe(true);
  }, 60_000);
});
