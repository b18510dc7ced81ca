import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { checkExposition } from "../support/prometheus-text.ts";

describe("checkExposition: the parser test of /metrics (issue 33)", () => {
  it("finds no problem in prom-client's own exposition: default metrics, labels, a histogram", async () => {
    const registry = new Registry();
    registry.setDefaultLabels({ shard: "orders", node: 'node-"1"' });
    collectDefaultMetrics({ register: registry, prefix: "shardguard_agent_" });
    new Counter({
      name: "shardguard_agent_commands_total",
      help: "c",
      labelNames: ["outcome"],
      registers: [registry],
    }).inc({
      outcome: "applied",
    });
    new Gauge({ name: "shardguard_agent_fenced", help: "g", registers: [registry] }).set(1);
    new Histogram({ name: "shardguard_cycle_seconds", help: "h", registers: [registry] }).observe(0.2);
    const checked = checkExposition(await registry.metrics());
    expect(checked.problems).toEqual([]);
    expect(checked.families.get("shardguard_agent_commands_total")).toBe("counter");
    expect(checked.families.get("shardguard_cycle_seconds")).toBe("histogram");
  });

  it.each([
    { text: "x 1\n", problem: /x has no TYPE before it/ },
    { text: "# TYPE x gauge\nx{a=1} 1\n", problem: /not a sample/ },
    { text: "# TYPE x gauge\nx one\n", problem: /not a sample/ },
    { text: "# TYPE x gauge\n# TYPE x gauge\nx 1\n", problem: /x typed twice/ },
    { text: "# TYPE x gauge\nx 1", problem: /does not end with a newline/ },
    { text: "# TYPE x gaige\nx 1\n", problem: /not a HELP or TYPE comment/ },
  ])("reports $problem", ({ text, problem }) => {
    expect(checkExposition(text).problems.join("\n")).toMatch(problem);
  });
});
