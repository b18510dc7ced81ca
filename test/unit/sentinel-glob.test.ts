import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { channelsMatching } from "../../src/agent/sentinel-session.ts";
import { compileGlob, type GlobMeter, globMatch } from "../../src/core/glob.ts";

/**
 * Redis's `stringmatchlen` (redis/src/util.c), transcribed with its recursion and nothing else:
 * the reference the bounded matcher must agree with. Exponential on stars, so only small inputs.
 */
function redisStringMatch(pattern: string, subject: string): boolean {
  let p = 0;
  let s = 0;
  const plen = pattern.length;
  const slen = subject.length;
  while (p < plen && s < slen) {
    switch (pattern[p]) {
      case "*": {
        while (p + 1 < plen && pattern[p + 1] === "*") p++;
        if (p + 1 === plen) return true;
        for (let from = s; from < slen; from++) {
          if (redisStringMatch(pattern.slice(p + 1), subject.slice(from))) return true;
        }
        return false;
      }
      case "?":
        s++;
        break;
      case "[": {
        p++;
        const not = pattern[p] === "^";
        if (not) p++;
        let match = false;
        for (;;) {
          if (pattern[p] === "\\" && plen - p >= 2) {
            p++;
            if (pattern[p] === subject[s]) match = true;
          } else if (pattern[p] === "]") {
            break;
          } else if (p >= plen) {
            p--;
            break;
          } else if (plen - p >= 3 && pattern[p + 1] === "-") {
            let start = pattern[p] as string;
            let end = pattern[p + 2] as string;
            if (start > end) [start, end] = [end, start];
            const c = subject[s] as string;
            p += 2;
            if (c >= start && c <= end) match = true;
          } else if (pattern[p] === subject[s]) {
            match = true;
          }
          p++;
        }
        if (not) match = !match;
        if (!match) return false;
        s++;
        break;
      }
      default:
        // Redis falls through from an escape to the literal it escapes.
        if (pattern[p] === "\\" && plen - p >= 2) p++;
        if (pattern[p] !== subject[s]) return false;
        s++;
        break;
    }
    p++;
    if (s === slen) {
      while (pattern[p] === "*") p++;
      break;
    }
  }
  return p >= plen && s === slen;
}

const matches = (pattern: string, subject: string) => globMatch(compileGlob(pattern), subject);

describe("glob patterns, matched without backtracking", () => {
  it.each([
    ["*", "+switch-master", true],
    ["+s*", "+sdown", true],
    ["+s*", "-sdown", false],
    ["+?down", "+odown", true],
    ["+[so]down", "+odown", true],
    ["+[^so]down", "+odown", false],
    ["-[a-z]down", "-sdown", true],
    ["[+-]", "-", true], // "+-]" is a range, as in Redis: the class is unterminated,
    ["[z-a]", "m", true],
    ["\\*", "*", true],
    ["a.b", "axb", false],
    ["[abc", "c", true],
    ["[", "[", false],
    ["[^", "x", true],
    ["a\\", "a\\", true],
    [`${"*".repeat(100)}X`, "+switch-master", false],
  ])("%s against %s: %s, as Redis answers", (pattern, subject, expected) => {
    expect(matches(pattern, subject)).toBe(expected);
    expect(redisStringMatch(pattern, subject)).toBe(expected);
  });

  it("answers as Redis's stringmatchlen on any small pattern and subject", () => {
    const patternChar = fc.constantFrom("*", "?", "[", "]", "^", "-", "\\", "a", "b", "c", "+");
    const subjectChar = fc.constantFrom("a", "b", "c", "+", "-", "*", "[", "]", "\\", "^");
    fc.assert(
      fc.property(
        fc.array(patternChar, { maxLength: 10 }).map((chars) => chars.join("")),
        fc.array(subjectChar, { maxLength: 8 }).map((chars) => chars.join("")),
        (pattern, subject) => {
          expect(matches(pattern, subject)).toBe(redisStringMatch(pattern, subject));
        },
      ),
      { numRuns: 20_000 },
    );
  });

  it("takes at most (pattern tokens + 1) × subject length steps, whatever the pattern", () => {
    fc.assert(
      fc.property(
        fc.array(fc.constantFrom("*", "?", "a", "b", "[ab]", "\\*"), { maxLength: 200 }),
        fc.array(fc.constantFrom("a", "b"), { minLength: 1, maxLength: 200 }),
        (parts, chars) => {
          const glob = compileGlob(parts.join(""));
          const meter: GlobMeter = { steps: 0 };
          globMatch(glob, chars.join(""), meter);
          expect(meter.steps).toBeLessThanOrEqual((glob.tokens.length + 1) * chars.length * 2);
        },
      ),
      { numRuns: 500 },
    );
  });

  it("is linear in the subject on the CVE-2022-36021 shape (stars then a missing character)", () => {
    // Prepare: the pattern that made the regular-expression matcher run for minutes.
    const steps = (stars: number, length: number) => {
      const meter: GlobMeter = { steps: 0 };
      globMatch(compileGlob(`${"*".repeat(stars)}X`), "a".repeat(length), meter);
      return meter.steps;
    };

    // Act
    const small = steps(100, 1000);
    const large = steps(10_000, 100_000);
    const started = performance.now();
    const adversarial = matches(`${"*a".repeat(5000)}X`, "a".repeat(20_000));
    const elapsedMs = performance.now() - started;

    // Assess
    expect(small).toBeLessThanOrEqual(3 * 1000);
    expect(large).toBeLessThanOrEqual(3 * 100_000);
    expect(adversarial).toBe(false);
    expect(elapsedMs).toBeLessThan(1000);
  });

  it("finds the event channels a pattern matches once, at subscribe time", () => {
    expect([...channelsMatching("+s*")].sort()).toEqual(["+sdown", "+switch-master"]);
    expect([...channelsMatching("?odown")].sort()).toEqual(["+odown", "-odown"]);
    expect([...channelsMatching(`${"*".repeat(100)}X`)]).toEqual([]);
    expect(channelsMatching("*").size).toBe(5);
  });
});
