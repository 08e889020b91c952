/** A small SVG chart: throughput and p99 latency against concurrency, one series each on its own axis. */

export interface ChartPoint {
  concurrency: number;
  throughput: number;
  p99LatencyMs: number;
}

const W = 640, H = 360, PAD = { left: 64, right: 64, top: 40, bottom: 48 };

function scale(values: number[]): { max: number; ticks: number[] } {
  const raw = Math.max(...values, 1e-9);
  const step = 10 ** Math.floor(Math.log10(raw));
  const max = Math.ceil(raw / step) * step;
  return { max, ticks: Array.from({ length: 5 }, (_, i) => (max * i) / 4) };
}

const esc = (s: string): string => s.replace(/[<>&]/g, (c) => ({ "<": "&lt;", ">": "&gt;", "&": "&amp;" })[c]!);

export function chartSvg(points: ChartPoint[], title: string): string {
  const xs = points.map((p) => p.concurrency);
  const x = (c: number): number => PAD.left + (xs.length === 1 ? 0.5 : xs.indexOf(c) / (xs.length - 1)) * (W - PAD.left - PAD.right);
  const tp = scale(points.map((p) => p.throughput)), lat = scale(points.map((p) => p.p99LatencyMs));
  const yFor = (v: number, max: number): number => H - PAD.bottom - (v / max) * (H - PAD.top - PAD.bottom);
  const line = (vals: number[], max: number): string => points.map((p, i) => `${i ? "L" : "M"}${x(p.concurrency).toFixed(1)},${yFor(vals[i]!, max).toFixed(1)}`).join(" ");
  const parts = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${W / 2}" y="22" text-anchor="middle" font-size="14">${esc(title)}</text>`,
    ...tp.ticks.map((t) => `<line x1="${PAD.left}" x2="${W - PAD.right}" y1="${yFor(t, tp.max)}" y2="${yFor(t, tp.max)}" stroke="#eee"/>` +
      `<text x="${PAD.left - 6}" y="${yFor(t, tp.max) + 4}" text-anchor="end" fill="#1f77b4">${+t.toFixed(1)}</text>`),
    ...lat.ticks.map((t) => `<text x="${W - PAD.right + 6}" y="${yFor(t, lat.max) + 4}" fill="#d62728">${+t.toFixed(0)}</text>`),
    ...xs.map((c) => `<text x="${x(c)}" y="${H - PAD.bottom + 18}" text-anchor="middle">${c}</text>`),
    `<text x="${W / 2}" y="${H - 10}" text-anchor="middle">concurrency</text>`,
    `<text x="16" y="${H / 2}" transform="rotate(-90 16 ${H / 2})" text-anchor="middle" fill="#1f77b4">output tokens/s</text>`,
    `<text x="${W - 14}" y="${H / 2}" transform="rotate(90 ${W - 14} ${H / 2})" text-anchor="middle" fill="#d62728">p99 latency (ms)</text>`,
    `<path d="${line(points.map((p) => p.throughput), tp.max)}" fill="none" stroke="#1f77b4" stroke-width="2"/>`,
    `<path d="${line(points.map((p) => p.p99LatencyMs), lat.max)}" fill="none" stroke="#d62728" stroke-width="2" stroke-dasharray="6 3"/>`,
    ...points.map((p) => `<circle cx="${x(p.concurrency)}" cy="${yFor(p.throughput, tp.max)}" r="3" fill="#1f77b4"/>` +
      `<circle cx="${x(p.concurrency)}" cy="${yFor(p.p99LatencyMs, lat.max)}" r="3" fill="#d62728"/>`),
    "</svg>",
  ];
  return parts.join("\n");
}
