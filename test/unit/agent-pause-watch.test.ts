import { afterEach, describe, expect, it } from "vitest";
import { PauseWatch } from "../../src/agent/pause-watch.ts";

let now = 0;
let watch: PauseWatch | undefined;

afterEach(() => {
  watch?.stop();
  watch = undefined;
});

/** A running watch on a clock the test moves (its ticker observes the same clock). */
function running(thresholdMs = 200): PauseWatch {
  now = 1_000;
  watch = new PauseWatch(() => now, thresholdMs);
  watch.start();
  return watch;
}

describe("the pause watch", () => {
  it("finds a pause after a mark that no tick observed yet", () => {
    // Prepare
    const pauses = running();
    const since = pauses.mark();

    // Act
    now += 500;

    // Assess
    expect(pauses.pausedSince(since)).toBe(500);
  });

  it("finds a pause observed between the mark and the question", () => {
    // Prepare
    const pauses = running();
    const since = pauses.mark();

    // Act
    now += 300;
    pauses.mark();
    now += 10;

    // Assess
    expect(pauses.pausedSince(since)).toBe(300);
  });

  it("does not count a pause that ended before the mark", () => {
    // Prepare
    const pauses = running();
    now += 500;

    // Act
    const since = pauses.mark();
    now += 50;

    // Assess
    expect(pauses.pausedSince(since)).toBeUndefined();
  });

  it("counts no gap up to the threshold as a pause", () => {
    // Prepare
    const pauses = running(200);
    const since = pauses.mark();

    // Act
    for (let step = 0; step < 10; step++) {
      now += 200;
      pauses.mark();
    }

    // Assess
    expect(pauses.pausedSince(since)).toBeUndefined();
  });

  it("says nothing while it does not run", () => {
    // Prepare
    now = 1_000;
    const pauses = new PauseWatch(() => now, 200);
    const since = pauses.mark();

    // Act
    now += 5_000;

    // Assess
    expect(pauses.pausedSince(since)).toBeUndefined();
  });
});
