/**
 * `weft bench serve`: the same workload over HTTP against any OpenAI-compatible
 * server, streaming, so time to first token and inter-token latency are what a
 * client sees. Writes JSON and an SVG chart of throughput and p99 latency.
 */
import fs from "node:fs";
import { chartSvg } from "./chart.js";
import { summarize, table, type BenchResult, type RequestTiming } from "./stats.js";
import { BUILTIN_PROMPTS, syntheticPrompts } from "./workload.js";
import { RESULT_COLUMNS } from "./offline.js";
import { readSseEvents } from "./sse-reader.js";

export interface ServeBenchOptions {
  baseUrl: string;
  model: string;
  apiKey?: string;
  concurrency: number[];
  numPrompts: number;
  promptLen?: number;
  outputLen: number;
  json?: string;
  svg?: string;
  quiet?: boolean;
}

/** One streamed completion; token arrival times from the SSE chunks (one chunk per token with return_token_ids). */
export async function streamOne(o: ServeBenchOptions, prompt: string | number[]): Promise<RequestTiming> {
  const t: RequestTiming = { sent: performance.now() / 1000, tokenTimes: [], promptTokens: 0, completionTokens: 0 };
  const res = await fetch(`${o.baseUrl.replace(/\/$/, "")}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {}) },
    body: JSON.stringify({ model: o.model, prompt, max_tokens: o.outputLen, ignore_eos: true, temperature: 0, stream: true,
      stream_options: { include_usage: true }, return_token_ids: true }),
  });
  if (res.status !== 200 || !res.body) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  for await (const raw of readSseEvents(res.body)) {
    const ev = raw as { choices?: { text?: string; token_ids?: number[] }[]; usage?: { prompt_tokens: number; completion_tokens: number } | null; error?: { message: string } };
    if (ev.error) throw new Error(ev.error.message);
    const now = performance.now() / 1000;
    const c = ev.choices?.[0];
    // Servers that do not return token ids: count one token per chunk with text.
    const n = c?.token_ids?.length ?? (c?.text ? 1 : 0);
    for (let k = 0; k < n; k++) t.tokenTimes.push(now);
    if (ev.usage) {
      t.promptTokens = ev.usage.prompt_tokens;
      t.completionTokens = ev.usage.completion_tokens;
    }
  }
  t.completionTokens ||= t.tokenTimes.length;
  return t;
}

export async function serveBench(o: ServeBenchOptions): Promise<BenchResult[]> {
  const prompts: (string | number[])[] = o.promptLen
    ? syntheticPrompts({ numPrompts: o.numPrompts, promptLen: o.promptLen, vocab: 32000 })
    : Array.from({ length: o.numPrompts }, (_, i) => BUILTIN_PROMPTS[i % BUILTIN_PROMPTS.length]!);
  const results: BenchResult[] = [];
  for (const c of o.concurrency) {
    if (!o.quiet) process.stderr.write(`concurrency ${c}: ${prompts.length} requests × ${o.outputLen} tokens…\n`);
    const timings: RequestTiming[] = [];
    let next = 0;
    const start = performance.now() / 1000;
    await Promise.all(Array.from({ length: Math.min(c, prompts.length) }, async () => {
      while (next < prompts.length) timings.push(await streamOne(o, prompts[next++]!));
    }));
    results.push(summarize(c, timings, performance.now() / 1000 - start, null, 0));
  }
  if (!o.quiet) console.log(table(results as unknown as Record<string, unknown>[], RESULT_COLUMNS.filter((k) => !/decode|prefill|rss/.test(k))));
  if (o.json) fs.writeFileSync(o.json, JSON.stringify({ base_url: o.baseUrl, model: o.model, workload: { num_prompts: o.numPrompts, prompt_len: o.promptLen ?? "builtin", output_len: o.outputLen }, results }, null, 2));
  if (o.svg) {
    fs.writeFileSync(o.svg, chartSvg(results.map((r) => ({ concurrency: r.concurrency, throughput: r.output_tokens_per_second, p99LatencyMs: r.e2e_p99_ms })),
      `${o.model} at ${o.baseUrl}: ${o.outputLen} tokens per request`));
  }
  return results;
}
