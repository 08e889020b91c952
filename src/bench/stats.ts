/** The benchmark's arithmetic: per-request timings → the reported figures. Pure, so it is tested on synthetic timings. */

export interface RequestTiming {
  /** Seconds, on one clock. */
  sent: number;
  /** Arrival time of each generated token (as streamed). */
  tokenTimes: number[];
  promptTokens: number;
  completionTokens: number;
}

export interface StepTotals {
  /** Seconds of step time attributed to prefill and to decode rows (mixed steps split by row count). */
  prefillSeconds: number;
  decodeSeconds: number;
  prefillTokens: number;
  decodeTokens: number;
}

export interface BenchResult {
  concurrency: number;
  requests: number;
  prompt_tokens: number;
  completion_tokens: number;
  wall_seconds: number;
  decode_tokens_per_second: number | null;
  prefill_tokens_per_second: number | null;
  output_tokens_per_second: number;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  itl_p50_ms: number;
  itl_p99_ms: number;
  e2e_mean_ms: number;
  e2e_p50_ms: number;
  e2e_p99_ms: number;
  peak_rss_mb: number;
}

/** Linear-interpolated percentile (p in 0..100) of unsorted values; NaN for none. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank), hi = Math.ceil(rank);
  return sorted[lo]! + (sorted[hi]! - sorted[lo]!) * (rank - lo);
}

export function mean(values: readonly number[]): number {
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : NaN;
}

/** Splits one step's duration between its prefill and decode rows in proportion to their counts. */
export function attributeStep(totals: StepTotals, seconds: number, rows: { prefill: number; decode: number }): void {
  const n = rows.prefill + rows.decode;
  if (n === 0) return;
  totals.prefillSeconds += (seconds * rows.prefill) / n;
  totals.decodeSeconds += (seconds * rows.decode) / n;
  totals.prefillTokens += rows.prefill;
  totals.decodeTokens += rows.decode;
}

const ms = (s: number): number => Math.round(s * 1e5) / 100;
const rate = (n: number, s: number): number | null => (s > 0 ? Math.round((n / s) * 100) / 100 : null);

export function summarize(concurrency: number, timings: readonly RequestTiming[], wallSeconds: number, steps: StepTotals | null, peakRssBytes: number): BenchResult {
  const ttft = timings.filter((t) => t.tokenTimes.length).map((t) => t.tokenTimes[0]! - t.sent);
  const itl = timings.flatMap((t) => t.tokenTimes.slice(1).map((x, i) => x - t.tokenTimes[i]!));
  const e2e = timings.filter((t) => t.tokenTimes.length).map((t) => t.tokenTimes.at(-1)! - t.sent);
  const completion = timings.reduce((n, t) => n + t.completionTokens, 0);
  return {
    concurrency,
    requests: timings.length,
    prompt_tokens: timings.reduce((n, t) => n + t.promptTokens, 0),
    completion_tokens: completion,
    wall_seconds: Math.round(wallSeconds * 1000) / 1000,
    decode_tokens_per_second: steps ? rate(steps.decodeTokens, steps.decodeSeconds) : null,
    prefill_tokens_per_second: steps ? rate(steps.prefillTokens, steps.prefillSeconds) : null,
    output_tokens_per_second: rate(completion, wallSeconds) ?? 0,
    ttft_p50_ms: ms(percentile(ttft, 50)),
    ttft_p99_ms: ms(percentile(ttft, 99)),
    itl_p50_ms: ms(percentile(itl, 50)),
    itl_p99_ms: ms(percentile(itl, 99)),
    e2e_mean_ms: ms(mean(e2e)),
    e2e_p50_ms: ms(percentile(e2e, 50)),
    e2e_p99_ms: ms(percentile(e2e, 99)),
    peak_rss_mb: Math.round(peakRssBytes / 2 ** 20),
  };
}

/** Throughput ratio of the batched run to the sequential one (output tokens per second). */
export function speedup(sequential: BenchResult, batched: BenchResult): number {
  return Math.round((batched.output_tokens_per_second / sequential.output_tokens_per_second) * 100) / 100;
}

/** A fixed-width text table. */
export function table(rows: readonly Record<string, unknown>[], columns: readonly string[]): string {
  const cell = (v: unknown): string => (v === null || v === undefined ? "-" : typeof v === "number" && !Number.isInteger(v) ? v.toFixed(2) : String(v));
  const widths = columns.map((c) => Math.max(c.length, ...rows.map((r) => cell(r[c]).length)));
  const line = (vals: string[]): string => vals.map((v, i) => v.padStart(widths[i]!)).join("  ");
  return [line([...columns]), line(widths.map((w) => "-".repeat(w))), ...rows.map((r) => line(columns.map((c) => cell(r[c]))))].join("\n");
}
