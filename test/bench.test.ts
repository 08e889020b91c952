/** The benchmark's arithmetic on synthetic timings, a smoke run on a fixture, and the GGUF export checked against llama.cpp. */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { attributeStep, mean, percentile, speedup, summarize, type StepTotals } from "../src/bench/stats.js";
import { syntheticPrompts } from "../src/bench/workload.js";
import { offlineBench } from "../src/bench/offline.js";
import { exportGguf } from "../src/model/gguf-export.js";
import { createModel, DEFAULT_ENGINE_CONFIG } from "../src/engine/engine-manager.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";
import { tempDir } from "./helpers.js";
import { fixtureModelDir } from "./support/server.js";

test("percentiles interpolate linearly; mean", () => {
  assert.equal(percentile([5, 1, 3, 2, 4], 50), 3);
  assert.equal(percentile([1, 2, 3, 4], 50), 2.5);
  assert.equal(percentile([10, 20], 99), 19.9);
  assert.equal(percentile([7], 99), 7);
  assert.ok(Number.isNaN(percentile([], 50)));
  assert.equal(mean([1, 2, 3, 6]), 3);
});

test("summaries count each kind of token separately, and speedup divides like by like", () => {
  // Two requests sent at t=0: 3 tokens at 1.0, 1.5, 2.0 and 2 tokens at 0.5, 1.5.
  const timings = [
    { sent: 0, tokenTimes: [1, 1.5, 2], promptTokens: 10, completionTokens: 3 },
    { sent: 0, tokenTimes: [0.5, 1.5], promptTokens: 6, completionTokens: 2 },
  ];
  const steps: StepTotals = { prefillSeconds: 0, decodeSeconds: 0, prefillTokens: 0, decodeTokens: 0 };
  attributeStep(steps, 0.5, { prefill: 16, decode: 0 });
  attributeStep(steps, 1.0, { prefill: 2, decode: 2 }); // a mixed step splits by rows
  attributeStep(steps, 0.5, { prefill: 0, decode: 1 });
  assert.deepEqual(steps, { prefillSeconds: 1, decodeSeconds: 1, prefillTokens: 18, decodeTokens: 3 });
  const r = summarize(2, timings, 2.5, steps, 100 * 2 ** 20);
  assert.equal(r.prompt_tokens, 16);
  assert.equal(r.completion_tokens, 5);
  assert.equal(r.output_tokens_per_second, 2); // completion tokens / wall: 5 / 2.5
  assert.equal(r.decode_tokens_per_second, 3);
  assert.equal(r.prefill_tokens_per_second, 18);
  assert.equal(r.ttft_p50_ms, 750); // TTFTs 1.0 and 0.5
  assert.equal(r.itl_p50_ms, 500); // ITLs 0.5, 0.5, 1.0
  assert.equal(r.itl_p99_ms, 990);
  assert.equal(r.e2e_mean_ms, 1750);
  assert.equal(r.peak_rss_mb, 100);
  const seq = { ...r, output_tokens_per_second: 10 };
  assert.equal(speedup(seq, { ...r, output_tokens_per_second: 55 }), 5.5);
});

test("synthetic prompts: exact lengths, a shared prefix, reproducible", () => {
  const a = syntheticPrompts({ numPrompts: 3, promptLen: 20, prefixLen: 8, vocab: 1000, seed: 4 });
  assert.deepEqual(a.map((p) => p.length), [20, 20, 20]);
  assert.deepEqual(a[0]!.slice(0, 8), a[2]!.slice(0, 8));
  assert.notDeepEqual(a[0]!.slice(8), a[1]!.slice(8));
  assert.deepEqual(syntheticPrompts({ numPrompts: 3, promptLen: 20, prefixLen: 8, vocab: 1000, seed: 4 }), a);
});

test("smoke: weft bench --mode compare on the fixture writes the JSON report", async () => {
  const json = path.join(tempDir(), "bench.json");
  const report = await offlineBench({ model: fixtureModelDir(), concurrency: [], numPrompts: 4, promptLen: 12, outputLen: 5, mode: "compare", json, quiet: true });
  const saved = JSON.parse(fs.readFileSync(json, "utf8")) as typeof report;
  assert.equal(saved.speedup, report.speedup);
  assert.deepEqual(saved.results.map((r) => r.concurrency), [1, 4]);
  for (const r of saved.results) {
    assert.equal(r.requests, 4);
    assert.equal(r.completion_tokens, 20);
    assert.equal(r.prompt_tokens, 48);
    assert.ok(r.output_tokens_per_second > 0 && r.ttft_p50_ms >= 0);
  }
  assert.equal(typeof saved.speedup, "number");
  assert.equal(saved.model.architecture, "Qwen3ForCausalLM");
  assert.ok(saved.machine.cores >= 1);
});

test("export-gguf: llama.cpp greedy-decodes the exported fixture to the same tokens as Weft", async () => {
  const gguf = path.join(tempDir(), "tiny.gguf");
  exportGguf(fixtureModelDir(), gguf, "f16");
  const m = await createModel("t", fixtureModelDir(), { ...DEFAULT_ENGINE_CONFIG, kvCacheMemory: 2 ** 24 });
  const prompt = m.tokenizer!.encode("The quick brown fox");
  const weft = await m.engine.add({ promptTokenIds: prompt, params: defaultSamplingParams({ temperature: 0, maxTokens: 8, ignoreEos: true }) }).collect();
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: gguf, useMmap: false });
  const ctx = await model.createContext({ contextSize: 64 });
  const out: number[] = [];
  for await (const t of ctx.getSequence().evaluate(prompt as import("node-llama-cpp").Token[], { temperature: 0 })) {
    out.push(t);
    if (out.length === 8) break;
  }
  await ctx.dispose();
  await model.dispose();
  await llama.dispose();
  // f16 rounding of the weights can flip a near-tie late in the sequence; the first tokens must agree.
  assert.deepEqual(out.slice(0, 4), weft.tokenIds.slice(0, 4));
});

test("smoke: weft bench serve streams over HTTP and writes JSON and an SVG chart", async () => {
  const { startServer } = await import("./support/server.js");
  const { serveBench } = await import("../src/bench/serve-bench.js");
  const s = await startServer();
  try {
    const dir = tempDir();
    const results = await serveBench({ baseUrl: s.url, model: "tiny", concurrency: [1, 3], numPrompts: 3, promptLen: 8, outputLen: 4,
      json: path.join(dir, "r.json"), svg: path.join(dir, "r.svg"), quiet: true });
    for (const r of results) {
      assert.equal(r.completion_tokens, 12);
      assert.equal(r.prompt_tokens, 24);
      assert.ok(r.itl_p50_ms >= 0 && r.ttft_p99_ms >= r.ttft_p50_ms);
    }
    const svg = fs.readFileSync(path.join(dir, "r.svg"), "utf8");
    assert.match(svg, /^<svg[\s\S]*<path d="M[\d.]+,[\d.]+ L[\d.]+,[\d.]+"[\s\S]*<\/svg>$/);
    assert.equal((JSON.parse(fs.readFileSync(path.join(dir, "r.json"), "utf8")) as { results: unknown[] }).results.length, 2);
  } finally {
    await s.close();
  }
});
