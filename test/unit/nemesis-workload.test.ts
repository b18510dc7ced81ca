import { createServer } from "node:net";
import { describe, expect, it } from "vitest";
import type { RedisNode } from "../../src/dev/local-stack/redis-nodes.ts";
import type { FinalNodeRead, FinalRead } from "../../src/dev/nemesis/checker.ts";
import { readFinal, rereadUnreadable } from "../../src/dev/nemesis/workload.ts";

type Target = { node: { id: string }; alive: boolean };

const targets: Target[] = [
  { node: { id: "n1" }, alive: true },
  { node: { id: "n2" }, alive: true },
  { node: { id: "n3" }, alive: false },
];

const replica = (node: string): FinalNodeRead => ({
  node,
  reachable: true,
  role: "slave",
  following: "n1",
  linkUp: true,
  seqs: [1],
});

/** n1 (the primary) timed out, n2 read, n3 down for good. */
const firstRead: FinalRead = {
  nodes: [
    { node: "n1", reachable: false, error: "Command timed out" },
    replica("n2"),
    { node: "n3", reachable: false },
  ],
  topologyPrimary: "n1",
};

/** A reader that fails n1 `failures` times (error "timeout <call>"), then reads it as the master. */
function flakyReader(failures: number) {
  const calls: string[][] = [];
  const read = async (nodes: readonly Target[]): Promise<FinalRead> => {
    calls.push(nodes.map(({ node }) => node.id));
    return {
      nodes: nodes.map(({ node }) =>
        node.id === "n1" && calls.length <= failures
          ? { node: "n1", reachable: false, error: `timeout ${calls.length}` }
          : { node: node.id, reachable: true, role: "master", seqs: [1] },
      ),
      topologyPrimary: "n1",
    };
  };
  return { calls, read };
}

/** A port nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

describe("the final read", () => {
  it("keeps why a live node's read failed, and gives none for a node down for good", async () => {
    // Prepare
    const port = await closedPort();
    const node = (id: string) => ({ id, port, address: `127.0.0.1:${port}` }) as RedisNode;

    // Act
    const final = await readFinal(
      [
        { node: node("n1"), alive: true },
        { node: node("n2"), alive: false },
      ],
      () => undefined,
      "none",
      undefined,
    );

    // Assess
    expect(final.nodes[0]).toMatchObject({
      node: "n1",
      reachable: false,
      error: expect.stringMatching(/\S/),
    });
    expect(final.nodes[1]).toEqual({ node: "n2", reachable: false });
  });
});

describe("the final read's re-reads (nemesis seed 7336)", () => {
  it("reads a live node whose read failed again until it answers, and merges its read", async () => {
    // Prepare
    const { calls, read } = flakyReader(2);
    const lines: string[] = [];

    // Act
    const final = await rereadUnreadable(firstRead, targets, read, {
      deadlineMs: 5000,
      intervalMs: 1,
      log: (line) => lines.push(line),
    });

    // Assess
    expect(calls).toEqual([["n1"], ["n1"], ["n1"]]);
    expect(final.nodes).toEqual([
      { node: "n1", reachable: true, role: "master", seqs: [1] },
      replica("n2"),
      { node: "n3", reachable: false },
    ]);
    expect(final.topologyPrimary).toBe("n1");
    expect(lines).toEqual(["final read: read again n1, all read"]);
  });

  it("gives up at the deadline, keeping the last error and saying so", async () => {
    // Prepare
    const { calls, read } = flakyReader(Number.POSITIVE_INFINITY);
    const lines: string[] = [];
    const started = performance.now();

    // Act
    const final = await rereadUnreadable(firstRead, targets, read, {
      deadlineMs: 100,
      intervalMs: 30,
      log: (line) => lines.push(line),
    });

    // Assess
    expect(performance.now() - started).toBeLessThan(1000);
    expect(calls.length).toBeGreaterThanOrEqual(1);
    // One round per interval (30, 60, 90), the last one shortened to the deadline (100). A timer may
    // fire up to a millisecond before performance.now() reaches its end, which leaves a sliver of the
    // deadline for a round or two more (6 rounds in a fresh-clone CI run at a load of 30); a loop that
    // ignored the deadline would run hundreds.
    expect(calls.length).toBeLessThanOrEqual(7);
    expect(final.nodes[0]).toEqual({ node: "n1", reachable: false, error: `timeout ${calls.length}` });
    expect(lines).toEqual([`final read: read again n1; still unreadable: n1 (timeout ${calls.length})`]);
  });

  it("reads nothing again when every live node was read (a node down for good is not)", async () => {
    // Prepare
    const { calls, read } = flakyReader(0);
    const lines: string[] = [];
    const allRead: FinalRead = {
      ...firstRead,
      nodes: [replica("n1"), replica("n2"), { node: "n3", reachable: false }],
    };

    // Act
    const final = await rereadUnreadable(allRead, targets, read, { log: (line) => lines.push(line) });

    // Assess
    expect(final).toBe(allRead);
    expect(calls).toEqual([]);
    expect(lines).toEqual([]);
  });
});
