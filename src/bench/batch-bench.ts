/**
 * `weft bench batch`: interactive latency while a Batch API job runs. Measures
 * the TTFT of streamed NORMAL completions on an idle server, then again while
 * a batch of `lines` completions (LOW priority) is in progress, and reports
 * the ratio. Against any server with OpenAI's Files and Batches APIs.
 *
 * Each probe waits a seeded random gap of 0 to `probeGapMs` before it is sent.
 * Sent back to back instead, every probe would arrive just after the engine
 * started a step (the previous probe's last token ends a step), so each would
 * wait out a whole batch step; users' requests arrive at random points of a step.
 */
import fs from "node:fs";
import { machineInfo } from "./machine.js";
import { streamOne, type ServeBenchOptions } from "./serve-bench.js";
import { percentile, table } from "./stats.js";
import { BUILTIN_PROMPTS, rng } from "./workload.js";

export interface BatchBenchOptions {
  baseUrl: string;
  model: string;
  apiKey?: string;
  /** Lines in the batch. */
  lines: number;
  /** Streamed interactive requests per phase, one after another. */
  probes: number;
  /** The most a probe waits before it is sent (a seeded uniform draw; 0: back to back). */
  probeGapMs: number;
  outputLen: number;
  json?: string;
}

interface Phase {
  phase: string;
  probes: number;
  ttft_p50_ms: number;
  ttft_p90_ms: number;
  ttft_max_ms: number;
}

async function probe(o: BatchBenchOptions, phase: string): Promise<Phase> {
  const serve: ServeBenchOptions = { ...o, concurrency: [1], numPrompts: o.probes };
  const ttfts: number[] = [];
  const gap = rng(7);
  for (let i = 0; i < o.probes; i++) {
    await new Promise((r) => setTimeout(r, gap() * o.probeGapMs));
    const t = await streamOne(serve, BUILTIN_PROMPTS[i % BUILTIN_PROMPTS.length]!);
    if (t.tokenTimes[0] !== undefined) ttfts.push((t.tokenTimes[0] - t.sent) * 1000);
  }
  const r = (x: number): number => Math.round(x * 10) / 10;
  return { phase, probes: ttfts.length, ttft_p50_ms: r(percentile(ttfts, 50)), ttft_p90_ms: r(percentile(ttfts, 90)), ttft_max_ms: r(Math.max(...ttfts)) };
}

async function api(o: BatchBenchOptions, path: string, init: RequestInit = {}): Promise<Record<string, unknown>> {
  const res = await fetch(`${o.baseUrl.replace(/\/$/, "")}${path}`, { ...init, headers: { ...(o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {}), ...init.headers } });
  const body = (await res.json()) as Record<string, unknown>;
  if (!res.ok) throw new Error(`${path}: HTTP ${res.status} ${JSON.stringify(body)}`);
  return body;
}

/** Uploads `lines` completion requests and starts a batch on them; returns its id. */
async function startBatch(o: BatchBenchOptions): Promise<string> {
  const jsonl = Array.from({ length: o.lines }, (_, i) => JSON.stringify({
    custom_id: `line-${i}`, method: "POST", url: "/v1/completions",
    body: { model: o.model, prompt: BUILTIN_PROMPTS[i % BUILTIN_PROMPTS.length], max_tokens: o.outputLen, ignore_eos: true },
  })).join("\n");
  const form = new FormData();
  form.append("purpose", "batch");
  form.append("file", new Blob([jsonl], { type: "application/jsonl" }), "bench.jsonl");
  const file = await api(o, "/v1/files", { method: "POST", body: form });
  const batch = await api(o, "/v1/batches", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ input_file_id: file.id, endpoint: "/v1/completions", completion_window: "24h" }),
  });
  return batch.id as string;
}

export async function batchBench(o: BatchBenchOptions): Promise<Phase[]> {
  await probe(o, "warm-up");
  const idle = await probe(o, "idle");
  const id = await startBatch(o);
  // Wait until the batch is running lines, so the probes meet a busy engine.
  for (let status = ""; status !== "in_progress"; status = (await api(o, `/v1/batches/${id}`)).status as string) {
    if (["failed", "completed", "cancelled", "expired"].includes(status)) throw new Error(`the batch ended (${status}) before the probes`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const busy = await probe(o, `during a ${o.lines}-line batch`);
  const after = await api(o, `/v1/batches/${id}`);
  const counts = after.request_counts as Record<string, number>;
  const finished = ["failed", "completed", "cancelled", "expired"].includes(after.status as string);
  if (!finished) await api(o, `/v1/batches/${id}/cancel`, { method: "POST" });
  const phases = [idle, busy];
  const ratio = busy.ttft_p50_ms / idle.ttft_p50_ms;
  console.log(table(phases as unknown as Record<string, unknown>[], ["phase", "probes", "ttft_p50_ms", "ttft_p90_ms", "ttft_max_ms"]));
  console.log(`TTFT p50 during the batch / idle: ${ratio.toFixed(2)}× (batch lines completed by the end of the probes: ${counts.completed}/${counts.total}${finished ? "; the batch had finished, so the last probes met an idle engine: use more lines" : "; the batch was then cancelled"})`);
  if (o.json) {
    fs.writeFileSync(o.json, JSON.stringify({
      machine: machineInfo(), base_url: o.baseUrl, model: o.model,
      workload: { batch_lines: o.lines, probes: o.probes, probe_gap_ms: o.probeGapMs, output_len: o.outputLen }, phases, ttft_p50_ratio: ratio, batch_counts_at_end: counts,
    }, null, 2));
  }
  return phases;
}
