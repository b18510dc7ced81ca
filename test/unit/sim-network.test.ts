import { describe, expect, it } from "vitest";
import { Network } from "../../src/dev/sim/network.ts";
import { Scheduler } from "../../src/dev/sim/scheduler.ts";

/**
 * The simulator's network keeps a connection's messages in order, as TCP does, whatever the
 * receiving process's timers do: a paused process (SIGSTOP, a hung redis-server) reads what its
 * socket held, then what came after, in the order it was sent.
 */
describe("the simulator's network", () => {
  it("delivers a message sent just after a paused process resumes after every message held for it (seed 5604)", async () => {
    // Prepare: a replica hung while its master streams 2,000 entries on one connection; the
    // master sends one more the instant the replica resumes (seed 5604: a replica hung 18 s
    // applied the entry sent after its resume ahead of 415 held ones).
    const sched = new Scheduler(5604);
    const net = new Network(sched);
    const channel = Network.channel();
    const received: number[] = [];
    const sent = 2000;
    sched.install();
    try {
      sched.pause("n2/redis#1");
      for (let i = 0; i < sent; i++)
        sched.schedule(
          i,
          () => net.send(channel, "n1/redis#1", "n2/redis#1", () => received.push(i)),
          "n1/redis#1",
        );
      sched.schedule(
        sent + 100,
        () => {
          sched.resume("n2/redis#1");
          net.send(channel, "n1/redis#1", "n2/redis#1", () => received.push(sent));
        },
        "n1/redis#1",
      );

      // Act
      await sched.runUntil(sched.now + sent + 1000);
    } finally {
      sched.uninstall();
    }

    // Assess
    expect(received).toEqual(Array.from({ length: sent + 1 }, (_, i) => i));
  });
});
