/**
 * Checks a Prometheus text exposition (format 0.0.4) line by line, as a scraper would parse it:
 * `# HELP`/`# TYPE` comments, samples `name{label="value",...} value [timestamp]`, each sample's
 * family typed before its first sample and typed once. Returns the problems found (none: clean)
 * and the families with their types. promtool is not installed here; this is the parser test.
 */
const NAME = "[a-zA-Z_:][a-zA-Z0-9_:]*";
const LABEL = '[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\\\\n]|\\\\[\\\\"n])*"';
// Go's ParseFloat, which Prometheus uses, takes NaN and Inf in any case (prom-client prints "Nan").
const VALUE =
  "(?:[-+]?(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:[eE][-+]?\\d+)?|[nN][aA][nN]|[-+]?[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)";
const SAMPLE = new RegExp(`^(${NAME})(?:\\{(?:${LABEL})(?:,${LABEL})*,?\\})? ${VALUE}(?: -?\\d+)?$`);
const TYPE = new RegExp(`^# TYPE (${NAME}) (counter|gauge|histogram|summary|untyped)$`);
const HELP = new RegExp(`^# HELP (${NAME}) .*$`);
const SUFFIXES = ["_bucket", "_sum", "_count"];

export interface ExpositionCheck {
  readonly problems: readonly string[];
  readonly families: ReadonlyMap<string, string>;
}

export function checkExposition(text: string): ExpositionCheck {
  const problems: string[] = [];
  const families = new Map<string, string>();
  const lines = text.split("\n");
  if (lines.at(-1) !== "") problems.push("the exposition does not end with a newline");
  for (const [index, line] of lines.entries()) {
    if (line === "") continue;
    const where = `line ${index + 1}: ${line.slice(0, 120)}`;
    if (line.startsWith("#")) {
      const typed = TYPE.exec(line);
      if (typed) {
        const [, name = "", type = ""] = typed;
        if (families.has(name)) problems.push(`${where}: ${name} typed twice`);
        families.set(name, type);
      } else if (!HELP.test(line)) problems.push(`${where}: not a HELP or TYPE comment`);
      continue;
    }
    const sample = SAMPLE.exec(line);
    if (!sample) {
      problems.push(`${where}: not a sample`);
      continue;
    }
    const name = sample[1] ?? "";
    const family = families.has(name)
      ? name
      : SUFFIXES.map((suffix) => (name.endsWith(suffix) ? name.slice(0, -suffix.length) : "")).find((base) =>
          families.has(base),
        );
    if (family === undefined || family === "") problems.push(`${where}: ${name} has no TYPE before it`);
  }
  return { problems, families };
}
