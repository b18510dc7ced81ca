import { describe, expect, it } from "vitest";
import { escapeXml, niceAxis, renderFailoverChart } from "../../bench/lib/chart.ts";

/**
 * A small well-formedness check, enough for the SVG this module writes: one root element, every
 * tag closed in order, attributes double-quoted, no raw `<` or bare `&` in text or attributes.
 */
function wellFormedProblems(xml: string): string[] {
  const problems: string[] = [];
  const stack: string[] = [];
  let roots = 0;
  const tag = /<(\/?)([A-Za-z][\w:.-]*)((?:\s+[\w:.-]+="[^"]*")*)\s*(\/?)>/g;
  let last = 0;
  for (let match = tag.exec(xml); match; match = tag.exec(xml)) {
    const text = xml.slice(last, match.index);
    if (text.includes("<")) problems.push(`stray "<" before offset ${match.index}`);
    if (/&(?!(amp|lt|gt|quot|apos|#\d+);)/.test(text)) problems.push(`bare "&" before offset ${match.index}`);
    if (/&(?!(amp|lt|gt|quot|apos|#\d+);)|</.test(match[3] ?? ""))
      problems.push(`bad attribute in ${match[0]}`);
    last = match.index + match[0].length;
    const [, closing, name, , selfClosing] = match;
    if (closing) {
      const open = stack.pop();
      if (open !== name) problems.push(`</${name}> closes <${open}>`);
    } else if (!selfClosing) {
      if (stack.length === 0) roots += 1;
      stack.push(name as string);
    } else if (stack.length === 0) {
      roots += 1;
    }
  }
  if (xml.slice(last).trim() !== "") problems.push("text after the root element");
  if (stack.length > 0) problems.push(`unclosed: ${stack.join(", ")}`);
  if (roots !== 1) problems.push(`${roots} root elements`);
  return problems;
}

describe("the failover chart", () => {
  it("is well-formed SVG with one dot per trial and a median and p99 bar per system", () => {
    // Prepare
    const series = [
      { name: "sentinel", values: [4210, 4190, 4255, 4301, 4220] },
      { name: "shardguard <dev> & co", values: [2100, 2300, 2250] },
    ];

    // Act
    const svg = renderFailoverChart(series, {
      title: "kill → first acknowledged write",
      subtitle: "failure timeout 3000 ms",
      yLabel: "ms",
      references: [{ label: "failure timeout", value: 3000 }],
    });

    // Assess
    expect(wellFormedProblems(svg)).toEqual([]);
    expect(svg.startsWith('<svg xmlns="http://www.w3.org/2000/svg"')).toBe(true);
    expect(svg.match(/<circle /g)).toHaveLength(8);
    expect(svg).toContain("median 4,220");
    expect(svg).toContain("p99 4,301");
    expect(svg).toContain("shardguard &lt;dev&gt; &amp; co");
  });

  it("draws a system without a successful trial as a labelled empty column", () => {
    // Act
    const svg = renderFailoverChart([{ name: "sentinel", values: [] }], { title: "t", yLabel: "ms" });

    // Assess
    expect(wellFormedProblems(svg)).toEqual([]);
    expect(svg).toContain("no successful trial");
    expect(svg).not.toContain("<circle");
  });

  it("the well-formedness check itself rejects a broken document", () => {
    // Act and Assess
    expect(wellFormedProblems("<svg><g></svg>")).not.toEqual([]);
    expect(wellFormedProblems('<svg><text x="1">a & b</text></svg>')).not.toEqual([]);
  });

  it("chooses an axis maximum above the data with a 1-2-5 step", () => {
    // Act
    const axis = niceAxis(4301);

    // Assess
    expect(axis).toEqual({ max: 5000, step: 1000 });
    expect(niceAxis(0)).toEqual({ max: 1, step: 0.2 });
  });

  it("escapes the five XML special characters", () => {
    expect(escapeXml(`a<b>&"c'`)).toBe("a&lt;b&gt;&amp;&quot;c&apos;");
  });
});
