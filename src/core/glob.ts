/**
 * Redis's glob patterns (`stringmatchlen` in redis/src/util.c: `*`, `?`, `[...]`, `[^...]`,
 * ranges `a-z`, `\x`) matched without backtracking into the pattern: a pattern is compiled once
 * into single-character tokens and stars, then matched greedily, returning only to the last star
 * seen. Time is O(pattern × subject) in the worst case and never exponential, unlike a glob
 * turned into a regular expression (`*` → `.*`), which a few dozen stars make take minutes: the
 * bug class of Redis CVE-2022-36021.
 */

type Token =
  | { readonly kind: "star" }
  | { readonly kind: "any" }
  | { readonly kind: "char"; readonly char: string }
  | {
      readonly kind: "class";
      readonly negated: boolean;
      readonly chars: ReadonlySet<string>;
      readonly ranges: ReadonlyArray<readonly [string, string]>;
    };

export interface CompiledGlob {
  readonly pattern: string;
  readonly tokens: readonly Token[];
}

/** Counts the matcher's steps (one per subject character tried against a token). */
export interface GlobMeter {
  steps: number;
}

/** Parses a pattern as Redis does, including its edge cases (an unterminated `[` class runs to the end). */
export function compileGlob(pattern: string): CompiledGlob {
  const tokens: Token[] = [];
  let index = 0;
  while (index < pattern.length) {
    const char = pattern[index] as string;
    if (char === "*") {
      // Consecutive stars are one star.
      if (tokens.at(-1)?.kind !== "star") tokens.push({ kind: "star" });
      index++;
    } else if (char === "?") {
      tokens.push({ kind: "any" });
      index++;
    } else if (char === "\\" && index + 1 < pattern.length) {
      tokens.push({ kind: "char", char: pattern[index + 1] as string });
      index += 2;
    } else if (char === "[") {
      index = compileClass(pattern, index + 1, tokens);
    } else {
      tokens.push({ kind: "char", char });
      index++;
    }
  }
  return { pattern, tokens };
}

/** Reads a class starting after its `[`; returns the index after it. */
function compileClass(pattern: string, start: number, tokens: Token[]): number {
  let index = start;
  const negated = pattern[index] === "^";
  if (negated) index++;
  const chars = new Set<string>();
  const ranges: Array<readonly [string, string]> = [];
  while (index < pattern.length) {
    const char = pattern[index] as string;
    const left = pattern.length - index;
    if (char === "\\" && left >= 2) {
      chars.add(pattern[index + 1] as string);
      index += 2;
    } else if (char === "]") {
      index++;
      break;
    } else if (left >= 3 && pattern[index + 1] === "-") {
      const end = pattern[index + 2] as string;
      ranges.push(char <= end ? [char, end] : [end, char]);
      index += 3;
    } else {
      chars.add(char);
      index++;
    }
  }
  tokens.push({ kind: "class", negated, chars, ranges });
  return index;
}

function tokenMatches(token: Token, char: string): boolean {
  switch (token.kind) {
    case "star":
    case "any":
      return true;
    case "char":
      return token.char === char;
    case "class": {
      const inside = token.chars.has(char) || token.ranges.some(([from, to]) => char >= from && char <= to);
      return inside !== token.negated;
    }
  }
}

/**
 * Whether `subject` matches the compiled pattern, as Redis would answer (an empty subject matches
 * only the empty pattern, as in Redis).
 */
export function globMatch(glob: CompiledGlob, subject: string, meter?: GlobMeter): boolean {
  const tokens = glob.tokens;
  if (subject.length === 0) return tokens.length === 0;
  let token = 0;
  let at = 0;
  // Where to resume after a mismatch: the token after the last star, and the subject position it took.
  let starToken = -1;
  let starAt = 0;
  while (at < subject.length) {
    if (meter) meter.steps++;
    const current = tokens[token];
    if (current?.kind === "star") {
      starToken = token++;
      starAt = at;
    } else if (current !== undefined && tokenMatches(current, subject[at] as string)) {
      token++;
      at++;
    } else if (starToken >= 0) {
      // The last star takes one more character; earlier stars never need to (any split they
      // could make, the last star can make too).
      token = starToken + 1;
      at = ++starAt;
    } else {
      return false;
    }
  }
  while (tokens[token]?.kind === "star") token++;
  return token === tokens.length;
}
