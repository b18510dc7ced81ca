import { summarize } from "./stats.ts";

/** One system's measured values (one per trial) for the chart. */
export interface ChartSeries {
  readonly name: string;
  readonly values: readonly number[];
}

export interface ChartOptions {
  readonly title: string;
  readonly subtitle?: string;
  /** Label of the vertical axis, unit included. */
  readonly yLabel: string;
  /** Optional horizontal reference lines (e.g. the failure timeout), in the series' unit. */
  readonly references?: readonly { readonly label: string; readonly value: number }[];
}

const PALETTE = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"];
const HEIGHT = 440;
const MARGIN = { top: 70, right: 110, bottom: 60, left: 90 };
const MIN_WIDTH = 640;
const COLUMN_WIDTH = 220;

/**
 * A dependency-free SVG: for each system one column with a dot per trial, a solid bar at the
 * median and a dashed bar at p99, on a vertical axis in milliseconds that starts at zero so that
 * ratios between columns read true.
 */
export function renderFailoverChart(series: readonly ChartSeries[], options: ChartOptions): string {
  const width = Math.max(MIN_WIDTH, MARGIN.left + MARGIN.right + COLUMN_WIDTH * Math.max(1, series.length));
  const columnWidth = (width - MARGIN.left - MARGIN.right) / Math.max(1, series.length);
  const plotHeight = HEIGHT - MARGIN.top - MARGIN.bottom;
  const allValues = [...series.flatMap((s) => s.values), ...(options.references ?? []).map((r) => r.value)];
  const { max: axisMax, step } = niceAxis(allValues.length > 0 ? Math.max(...allValues) : 1);
  const y = (value: number) => MARGIN.top + plotHeight - (value / axisMax) * plotHeight;
  const parts: string[] = [];

  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${HEIGHT}" viewBox="0 0 ${width} ${HEIGHT}" font-family="sans-serif" font-size="12">`,
    `<rect x="0" y="0" width="${width}" height="${HEIGHT}" fill="#ffffff"/>`,
    `<text x="${width / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold">${escapeXml(options.title)}</text>`,
  );
  if (options.subtitle) {
    parts.push(
      `<text x="${width / 2}" y="44" text-anchor="middle" fill="#555555">${escapeXml(options.subtitle)}</text>`,
    );
  }

  for (let tick = 0; tick <= axisMax + step / 2; tick += step) {
    const ty = round(y(tick));
    parts.push(
      `<line x1="${MARGIN.left}" y1="${ty}" x2="${width - MARGIN.right}" y2="${ty}" stroke="#e5e5e5"/>`,
      `<text x="${MARGIN.left - 8}" y="${ty + 4}" text-anchor="end">${formatMs(tick)}</text>`,
    );
  }
  const axisMid = MARGIN.top + plotHeight / 2;
  parts.push(
    `<line x1="${MARGIN.left}" y1="${MARGIN.top}" x2="${MARGIN.left}" y2="${MARGIN.top + plotHeight}" stroke="#333333"/>`,
    `<line x1="${MARGIN.left}" y1="${MARGIN.top + plotHeight}" x2="${width - MARGIN.right}" y2="${MARGIN.top + plotHeight}" stroke="#333333"/>`,
    `<text x="22" y="${axisMid}" text-anchor="middle" transform="rotate(-90 22 ${axisMid})">${escapeXml(options.yLabel)}</text>`,
  );

  for (const reference of options.references ?? []) {
    const ry = round(y(reference.value));
    parts.push(
      `<line x1="${MARGIN.left}" y1="${ry}" x2="${width - MARGIN.right}" y2="${ry}" stroke="#999999" stroke-dasharray="2 4"/>`,
      `<text x="${MARGIN.left + 4}" y="${ry - 4}" fill="#777777">${escapeXml(reference.label)}</text>`,
    );
  }

  series.forEach((s, index) => {
    const color = PALETTE[index % PALETTE.length] as string;
    const cx = MARGIN.left + columnWidth * (index + 0.5);
    const summary = summarize(s.values);
    parts.push(
      `<text x="${cx}" y="${MARGIN.top + plotHeight + 22}" text-anchor="middle" font-weight="bold">${escapeXml(s.name)}</text>`,
      `<text x="${cx}" y="${MARGIN.top + plotHeight + 40}" text-anchor="middle" fill="#555555">n = ${s.values.length}</text>`,
    );
    if (!summary) {
      parts.push(
        `<text x="${cx}" y="${axisMid}" text-anchor="middle" fill="#777777">no successful trial</text>`,
      );
      return;
    }
    const spread = Math.min(8, (columnWidth * 0.5) / Math.max(1, s.values.length));
    s.values.forEach((value, trial) => {
      const dx = (trial - (s.values.length - 1) / 2) * spread;
      parts.push(
        `<circle cx="${round(cx + dx)}" cy="${round(y(value))}" r="4" fill="${color}" fill-opacity="0.65"><title>${escapeXml(`${s.name} trial ${trial + 1}: ${formatMs(value)} ms`)}</title></circle>`,
      );
    });
    const half = Math.min(COLUMN_WIDTH, columnWidth) * 0.3;
    const my = round(y(summary.median));
    const py = round(y(summary.p99));
    // Keep the p99 label clear of the median label when the two bars nearly coincide.
    const pLabelY = Math.min(py - 4, my - 14);
    parts.push(
      `<line x1="${cx - half}" y1="${my}" x2="${cx + half}" y2="${my}" stroke="${color}" stroke-width="3"/>`,
      `<text x="${cx + half + 4}" y="${my + 4}" fill="${color}">median ${formatMs(summary.median)}</text>`,
      `<line x1="${cx - half * 0.6}" y1="${py}" x2="${cx + half * 0.6}" y2="${py}" stroke="${color}" stroke-width="1.5" stroke-dasharray="5 3"/>`,
      `<text x="${cx + half * 0.6 + 4}" y="${pLabelY}" fill="${color}">p99 ${formatMs(summary.p99)}</text>`,
    );
  });

  parts.push("</svg>");
  return `${parts.join("\n")}\n`;
}

/** An axis maximum and tick step of the form {1, 2, 5} x 10^k, with about five ticks. */
export function niceAxis(maxValue: number): { max: number; step: number } {
  const target = maxValue > 0 ? maxValue * 1.05 : 1;
  const rough = target / 5;
  const magnitude = 10 ** Math.floor(Math.log10(rough));
  const step = ([1, 2, 5, 10].find((m) => m * magnitude >= rough) ?? 10) * magnitude;
  return { max: Math.ceil(target / step) * step, step };
}

export function escapeXml(text: string): string {
  return text
    .replaceAll("&", "&amp;")
    .replaceAll("<", "&lt;")
    .replaceAll(">", "&gt;")
    .replaceAll('"', "&quot;")
    .replaceAll("'", "&apos;");
}

function formatMs(value: number): string {
  return Math.round(value).toLocaleString("en-US");
}

function round(value: number): number {
  return Math.round(value * 10) / 10;
}
