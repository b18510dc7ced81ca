import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { WATCH_INTERVAL_MS, watchFrames } from "../../src/cli/commands/status.ts";

/** `status --watch`'s loop on fake timers (the Node builtins too): its schedule is exact. */
beforeEach(() => {
  vi.useFakeTimers({ fakeNodeBuiltins: true });
});

afterEach(() => {
  vi.useRealTimers();
});

function frames(options: { json?: boolean; terminal?: boolean; frame: () => Promise<string> }) {
  const written: string[] = [];
  const stop = new AbortController();
  const done = watchFrames({
    title: "Every 1.0 s: shardguard status",
    json: options.json ?? false,
    terminal: options.terminal ?? false,
    frame: options.frame,
    write: (text) => written.push(text),
    signal: stop.signal,
  });
  return { written, stop, done };
}

describe("status --watch", () => {
  it("draws a frame every second until interrupted, and none after", async () => {
    // Prepare
    let reads = 0;
    const { written, stop, done } = frames({ frame: async () => `table ${++reads}\n` });

    // Act: frames at 0, 1, 2 and 3 s; interrupted at 3.5 s.
    await vi.advanceTimersByTimeAsync(3 * WATCH_INTERVAL_MS + 500);
    stop.abort();
    await done;
    await vi.advanceTimersByTimeAsync(5 * WATCH_INTERVAL_MS);

    // Assess
    expect(reads).toBe(4);
    expect(written).toHaveLength(4);
    expect(written[2]).toMatch(/^Every 1\.0 s: shardguard status {2}\S+Z\n\ntable 3\n\n$/);
  });

  it("shows a failed read in its frame and reads again a second later", async () => {
    // Prepare
    let reads = 0;
    const { written, stop, done } = frames({
      frame: async () => {
        reads += 1;
        if (reads === 1) throw new Error("DynamoDB Query failed: ECONNREFUSED");
        return "table\n";
      },
    });

    // Act
    await vi.advanceTimersByTimeAsync(WATCH_INTERVAL_MS);
    stop.abort();
    await done;

    // Assess
    expect(written.map((frame) => frame.split("\n")[2])).toEqual([
      "status: DynamoDB Query failed: ECONNREFUSED",
      "table",
    ]);
  });

  it.each([
    ["a terminal: each frame clears the screen first", { terminal: true }, "\x1b[H\x1b[JEvery 1.0 s"],
    ["JSON: one line per frame, no title", { json: true, terminal: true }, '{"shards":[]}\n'],
  ])("%s", async (_name, mode, expected) => {
    // Prepare
    const { written, stop, done } = frames({ ...mode, frame: async () => '{"shards":[]}\n' });
    // Act
    await vi.advanceTimersByTimeAsync(0);
    stop.abort();
    await done;
    // Assess
    expect(written[0]?.startsWith(expected)).toBe(true);
  });
});
